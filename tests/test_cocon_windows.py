"""CoCon's training samples as the authors cut them (the default ``--cocon-sample-mode window``): fixed-length
windows of running text, no ``</s>`` inside, at offsets drawn per line and epoch (the same for the same epoch),
fixed for validation; the criterion's word count with and without a final ``</s>``; and the losses on windows."""

import random

import pytest
import torch
from fairseq import options, tasks
from helpers import write_binarized

from fairseq_knowgen.criterions.cocon import CoConCriterion, count_words
from fairseq_knowgen.tasks.cocon_generation import CoConTextDataset, CoConWindowDataset

VOCAB = [f"w{i}" for i in range(40)]
TRAIN_LENGTHS = [5, 29, 30, 31, 45, 59, 60, 61, 95, 12, 100]  # words before </s>: 0 0 1 1 1 1 2 2 3 0 3 windows
VALID_LENGTHS = [40, 70, 10]


@pytest.fixture(scope="module")
def running_text(tmp_path_factory):
    """Lines (paragraphs) of random words of the lengths above, binarized in-process."""
    rng = random.Random(0)
    lines = {
        split: [" ".join(rng.choice(VOCAB) for _ in range(n)) for n in lengths]
        for split, lengths in (("train", TRAIN_LENGTHS), ("valid", VALID_LENGTHS))
    }
    data = tmp_path_factory.mktemp("coconwin")
    d = write_binarized(data, lines, words=VOCAB)
    return data, {s: [[d.index(w) for w in x.split()] for x in ls] for s, ls in lines.items()}


def setup_task(data, *extra):
    import fairseq_knowgen  # noqa: F401

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(data), "--task", "cocon_generation", "--arch", "cocon_lm", "--cpu", *map(str, extra)]
    )
    return tasks.setup_task(args)


def starts(ds, lines):
    """For each window of ``ds``: (its line, where it starts in it), found by searching the lines' tokens."""
    found = []
    for i in range(len(ds)):
        text = ds[i]["text"].tolist()
        hits = [(n, s) for n, line in enumerate(lines) for s in range(len(line) - len(text) + 1)
                if line[s : s + len(text)] == text]  # fmt: skip
        assert len(hits) == 1, (i, hits)
        found.append(hits[0])
    return found


def test_windows_are_cut_from_inside_their_lines(running_text):
    """Every line of n tokens gives floor(n / 30) windows of exactly 30 tokens, none with </s> or padding, lying
    inside the line (before its </s>), not overlapping; lines shorter than 30 give none."""
    data, lines = running_text
    task = setup_task(data)
    task.load_dataset("train")
    ds = task.dataset("train")
    assert isinstance(ds, CoConWindowDataset) and len(ds) == sum(n // 30 for n in TRAIN_LENGTHS)
    d = task.target_dictionary
    for i in range(len(ds)):
        text = ds[i]["text"]
        assert text.numel() == 30 and not text.eq(d.eos()).any() and not text.eq(d.pad()).any()
        assert ds.num_tokens(i) == ds.size(i) == 30
    per_line = {}
    for line, start in starts(ds, lines["train"]):
        per_line.setdefault(line, []).append(start)
    assert {n: len(s) for n, s in per_line.items()} == {n: k // 30 for n, k in enumerate(TRAIN_LENGTHS) if k >= 30}
    for n, ss in per_line.items():
        ss = sorted(ss)
        assert ss[0] >= 0 and ss[-1] + 30 <= TRAIN_LENGTHS[n]
        assert all(b - a >= 30 for a, b in zip(ss, ss[1:]))


def test_offsets_are_drawn_per_epoch_and_the_same_for_the_same_epoch(running_text):
    """set_epoch draws the windows' offsets: another epoch moves them (within the line's slack, every offset in
    reach), the same epoch gives the same windows, also in a new dataset (a resumed run); another seed others.
    Through fairseq's epoch iterator too (it calls set_epoch)."""
    data, lines = running_text
    task = setup_task(data, "--seed", "3")
    task.load_dataset("train")
    ds = task.dataset("train")
    first = starts(ds, lines["train"])
    ds.set_epoch(2)
    second = starts(ds, lines["train"])
    assert first != second
    ds.set_epoch(1)
    assert starts(ds, lines["train"]) == first
    again = setup_task(data, "--seed", "3")
    again.load_dataset("train")
    again.dataset("train").set_epoch(2)
    assert starts(again.dataset("train"), lines["train"]) == second
    other = setup_task(data, "--seed", "4")
    other.load_dataset("train")
    assert starts(other.dataset("train"), lines["train"]) != first
    # the offsets of the 45-token line (slack 15) over epochs: every value of 0..15 drawn
    line = TRAIN_LENGTHS.index(45)
    i = [n for n, _ in first].index(line)
    tokens, seen = lines["train"][line], set()
    for epoch in range(1, 400):
        ds.set_epoch(epoch)
        text = ds[i]["text"].tolist()
        seen.update(s for s in range(16) if tokens[s : s + 30] == text)
    assert seen == set(range(16))
    # fairseq's iterator sets the epoch: epoch 2's batches hold epoch 2's windows
    itr = task.get_batch_iterator(ds, max_sentences=64, seed=1)
    texts = []
    for _ in range(2):
        batch = next(itr.next_epoch_itr(shuffle=False))
        texts.append(sorted(map(tuple, batch["target"].tolist())))
    ds.set_epoch(2)
    assert texts[1] == sorted(tuple(ds[i]["text"].tolist()) for i in range(len(ds))) and texts[0] != texts[1]


def test_validation_windows_are_fixed(running_text):
    """Validation cuts its windows from each line's start, in file order, whatever the epoch."""
    data, lines = running_text
    task = setup_task(data)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    want = [(0, 0), (1, 0), (1, 30)]
    assert starts(ds, lines["valid"]) == want
    ds.set_epoch(7)
    assert starts(ds, lines["valid"]) == want and ds.ordered_indices().tolist() == [0, 1, 2]


def test_a_window_sample(running_text):
    """A batch of windows: the target is the window, the decoder's input </s> and the window but its last token,
    the content input the window; every token counts."""
    data, _ = running_text
    task = setup_task(data)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    batch = ds.collater([ds[i] for i in range(len(ds))])
    target, prev = batch["target"], batch["net_input"]["prev_output_tokens"]
    eos = task.target_dictionary.eos()
    assert target.shape == (3, 30) and batch["ntokens"] == 90 and batch["nsentences"] == 3
    assert prev[:, 0].eq(eos).all() and torch.equal(prev[:, 1:], target[:, :-1])
    assert torch.equal(batch["net_input"]["src_tokens"], target)
    assert batch["net_input"]["src_lengths"].tolist() == [30, 30, 30]


def test_no_line_long_enough_stops_with_a_clear_message(running_text, capsys):
    data, _ = running_text
    task = setup_task(data, "--cocon-window", "200")
    with pytest.raises(SystemExit) as e:
        task.load_dataset("train")
    assert e.value.code == 2
    assert "no line of at least --cocon-window 200 tokens" in capsys.readouterr().err


def test_lines_mode_reads_each_line_with_its_eos(running_text):
    """--cocon-sample-mode lines (the earlier samples): every line a sample, ending in </s>."""
    data, lines = running_text
    task = setup_task(data, "--cocon-sample-mode", "lines")
    task.load_dataset("train")
    ds = task.dataset("train")
    assert isinstance(ds, CoConTextDataset) and len(ds) == len(TRAIN_LENGTHS)
    texts = sorted(ds[i]["text"].tolist() for i in range(len(ds)))
    assert texts == sorted(line + [task.target_dictionary.eos()] for line in lines["train"])


def test_count_words_with_and_without_a_final_eos():
    """A sentence line counts its words before </s>; a window (no </s>) all its tokens; padding never counts."""
    pad, eos = 1, 2
    target = torch.tensor(
        [
            [5, 6, 7, eos, pad],  # a line of 3 words
            [5, 6, 7, 8, 9],  # a window of 5
            [5, eos, pad, pad, pad],  # a line of 1
            [5, 6, pad, pad, pad],  # a shorter row without </s>
            [eos, pad, pad, pad, pad],  # no word
        ]
    )
    assert count_words(target, pad, eos).tolist() == [3, 5, 1, 2, 0]


def test_losses_on_windows_cover_the_content_and_nothing_past_the_row(running_text, tmp_path):
    """On windows (no </s>) the fixed split gives prefix t = 10 + d and content m = 20 - d, t + m = 30: the loss
    covers positions t..29 exactly, the content is the window's own tokens there; training and validation
    steps give finite losses."""
    from helpers import build_task_and_model

    from fairseq_knowgen.prep.cocon import save_untrained_lm

    data, _ = running_text
    lm = save_untrained_lm(str(data), str(tmp_path / "lm.pt"), layers=2, dim=16, heads=2)
    task, model, _ = build_task_and_model(data, "cocon_lm", "--cocon-lm-path", lm, task="cocon_generation")
    task.load_dataset("train")
    ds = task.dataset("train")
    batch = ds.collater([ds[i] for i in range(len(ds))])
    target = batch["target"]
    crit = CoConCriterion(task)
    n_words = count_words(target, crit.padding_idx, crit.eos_idx)
    assert n_words.tolist() == [30] * len(ds)
    for seed in range(5):
        t, m, loss_mask = crit.draw_splits(n_words, 30, torch.Generator().manual_seed(seed))
        assert ((t >= 8) & (t <= 12)).all() and torch.equal(t + m, n_words)
        for b in range(len(ds)):
            assert loss_mask[b].nonzero().flatten().tolist() == list(range(int(t[b]), 30))
        content, _, cpad, _ = crit.self_content(model.decoder, target, t, m)
        for b in range(len(ds)):
            assert torch.equal(content[b][~cpad[b]], target[b, int(t[b]) :])
    for training in (True, False):
        model.train(training)
        loss, size, log = crit(model, batch)
        assert torch.isfinite(loss) and len(ds) * 18 <= int(size) <= len(ds) * 22  # the sum of m = 20 - d
        assert torch.isfinite(log["loss_self"]) and torch.isfinite(log["loss_null"])
