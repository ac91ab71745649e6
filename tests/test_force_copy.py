"""copy_transformer + force_copy: every term against a hand computation, and end to end."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL, TRAIN_COMMON, preprocess, run_cli

from fairseq_knowgen.criterions.force_copy import ForceCopyCriterion, force_copy_terms, switch_loss
from fairseq_knowgen.modules.copy_generator import CopyGenerator, full_mixture, mixture_lprobs_at
from fairseq_knowgen.prep.placeholders import encode_pair, restore

BOS, PAD, EOS, UNK = 0, 1, 2, 3
PLACEHOLDER = re.compile(r"^<unk-(\d+)>$")


def switch_with_p_gen(p_gen, dims=2):
    """A CopyGenerator whose switch gives ``p_gen`` whatever its inputs."""
    gen = CopyGenerator(state_dim=dims, context_dim=dims, input_dim=dims)
    torch.nn.init.zeros_(gen.switch.weight)
    torch.nn.init.constant_(gen.switch.bias, math.log(p_gen / (1 - p_gen)))
    return gen


def run_generator(gen, logits, src, attn, copyable, not_generated=None):
    """The generator's outputs, with ``lprobs``: log-softmax of the mixture's logits (what
    ``get_normalized_probs`` returns)."""
    bsz, tgt_len, _ = logits.shape
    state = torch.zeros(bsz, tgt_len, 2)
    enc = torch.randn(bsz, src.size(1), 2)
    out = gen(logits, state, state, attn, enc, src, copyable, not_generated)
    return {**out, "lprobs": torch.log_softmax(out["logits"], -1)}


def test_mixture_hand_computed():
    """P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} alpha_i (Eq. 6), EOS never copied."""
    gen = switch_with_p_gen(0.25)
    logits = torch.zeros(1, 1, 6)  # P_vocab uniform = 1/6
    src = torch.tensor([[4, 5, 4, EOS]])  # word 4 occurs twice
    attn = torch.tensor([[[0.2, 0.3, 0.4, 0.1]]])
    copyable = torch.tensor([[True, True, True, False]])
    out = run_generator(gen, logits, src, attn, copyable)
    alpha = torch.tensor([0.2, 0.3, 0.4]) / 0.9
    expected = torch.full((6,), 0.25 / 6)
    expected[4] += 0.75 * (alpha[0] + alpha[2])
    expected[5] += 0.75 * alpha[1]
    torch.testing.assert_close(out["lprobs"][0, 0].exp(), expected)
    assert out["lprobs"].exp().sum().item() == pytest.approx(1.0)
    assert out["p_gen"].item() == pytest.approx(0.25)
    assert out["copy_attn"][0, 0, 3].item() == 0.0


def test_placeholders_have_zero_generation_probability_but_are_copied():
    """Placeholders (ids 6, 7) are outside P_vocab: exactly probability 0 from the generator;
    the mixture gives a placeholder of the source its copy mass only, one absent from the
    source exactly 0."""
    gen = switch_with_p_gen(0.25)
    logits = torch.tensor([[[0.0, 1.0, 2.0, 0.5, -1.0, 0.3, 5.0, 4.0]]])  # placeholders have high logits
    src = torch.tensor([[4, 6, EOS]])
    attn = torch.tensor([[[0.5, 0.25, 0.25]]])
    copyable = torch.tensor([[True, True, False]])
    not_generated = torch.tensor([6, 7])
    out = run_generator(gen, logits, src, attn, copyable, not_generated)
    exp = [math.exp(x) for x in logits[0, 0, :6].tolist()]
    p_vocab = [e / sum(exp) for e in exp] + [0.0, 0.0]
    copy = [0.0] * 8
    copy[4], copy[6] = 0.5 / 0.75, 0.25 / 0.75
    expected = [0.25 * p_vocab[w] + 0.75 * copy[w] for w in range(8)]
    assert out["vocab_lprobs"][0, 0, 6:].tolist() == [-math.inf, -math.inf]
    assert out["vocab_lprobs"][0, 0].exp().tolist() == pytest.approx(p_vocab, rel=1e-5)
    assert out["lprobs"][0, 0].exp().tolist() == pytest.approx(expected, rel=1e-5)
    assert out["lprobs"][0, 0, 6].item() == pytest.approx(math.log(0.75 * 0.25 / 0.75), rel=1e-6)
    assert out["lprobs"][0, 0, 7].item() == -math.inf


def test_log_probabilities_are_exact_where_a_clamp_was_wrong():
    """log P is computed in log space: a word of probability ~6e-13 gets its log (~ -28.1),
    not log(1e-10) = -23.03, and a switch logit of -40 gives log p_gen = -40."""
    gen = switch_with_p_gen(0.5)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0, -26.0]]])
    src = torch.tensor([[1, 2]])
    attn = torch.tensor([[[0.5, 0.5]]])
    out = run_generator(gen, logits, src, attn, torch.tensor([[True, True]]))
    # word 4 is not in the source: P(4) = 0.5 * e^-26 / (4 + e^-26)
    expected = math.log(0.5) - 26.0 - math.log(4 + math.exp(-26.0))
    assert expected < -27.6
    assert out["lprobs"][0, 0, 4].item() == pytest.approx(expected, abs=1e-4)
    assert torch.isfinite(out["lprobs"]).all()

    torch.nn.init.constant_(gen.switch.bias, -40.0)  # p_gen = sigmoid(-40) ~ 4e-18
    out = run_generator(gen, logits, src, attn, torch.tensor([[True, True]]))
    assert out["lprobs"][0, 0, 0].item() == pytest.approx(-40.0 - math.log(4 + math.exp(-26.0)), abs=1e-4)
    assert out["lprobs"][0, 0, 1].item() == pytest.approx(math.log(0.5), abs=1e-6)  # copied: (1 - p_gen) 0.5


def test_loss_terms_hand_computed():
    """Target (4, UNK, 5, 7): 4 occurs twice in the source; UNK is out of vocabulary and not in
    the source; 5 is in the source; 7 (placeholder <unk-0>) is in the source and OOV."""
    src = torch.tensor([[4, 5, 4, 7, EOS]])
    copyable = torch.tensor([[True, True, True, True, False]])
    target = torch.tensor([[4, UNK, 5, 7]])
    placeholders = torch.zeros(8, dtype=torch.bool)
    placeholders[7] = True
    alpha = torch.tensor([[[0.1, 0.2, 0.3, 0.4, 0.0]] * 4])
    p_gen = torch.tensor([[[0.8], [0.6], [0.5], [0.1]]])
    vocab = torch.full((1, 4, 8), 0.05)
    vocab[0, :, 4], vocab[0, :, UNK], vocab[0, :, 5], vocab[0, :, 7] = 0.4, 0.2, 0.1, 0.0
    vocab = vocab / vocab.sum(-1, keepdim=True)
    copy = torch.zeros(1, 4, 8).scatter_add_(2, src.unsqueeze(1).expand(1, 4, 5), alpha)
    probs = p_gen * vocab + (1 - p_gen) * copy
    logit = (p_gen / (1 - p_gen)).log()
    t = force_copy_terms(probs.log(), vocab.log(), logit, alpha, src, target, copyable, placeholders, UNK)

    pv = [vocab[0, i, w].item() for i, w in enumerate([4, UNK, 5, 7])]
    attn_mass = [0.1 + 0.3, 0.0, 0.2, 0.4]  # sum of alpha over positions holding the target
    pg = [0.8, 0.6, 0.5, 0.1]
    nll = [-math.log(pg[i] * pv[i] + (1 - pg[i]) * attn_mass[i]) for i in range(4)]
    assert t["nll"][0].tolist() == pytest.approx(nll, rel=1e-5)
    # the placeholder 7 is outside the fixed vocabulary: loss_vocab is -log P_vocab(<unk>) (after Eq. 9)
    assert t["vocab"][0].tolist() == pytest.approx([-math.log(p) for p in pv[:3]] + [-math.log(pv[1])], rel=1e-5)
    skip = force_copy_terms(probs.log(), vocab.log(), logit, alpha, src, target, copyable, placeholders, UNK, "skip")
    assert skip["vocab"][0].tolist() == pytest.approx([-math.log(p) for p in pv[:3]] + [0.0], rel=1e-5)
    assert t["attn"][0].tolist() == pytest.approx([-math.log(0.4), 0.0, -math.log(0.2), -math.log(0.4)], rel=1e-5)
    assert t["copy_force"][0].tolist() == [True, False, True, True]
    assert t["copy_force_unk"][0].tolist() == [False, False, False, True]
    force = switch_loss(t["p_gen_logit"], t["copy_force"])[0].tolist()
    assert force == pytest.approx([-math.log(0.2), -math.log(0.6), -math.log(0.5), -math.log(0.9)], rel=1e-5)
    unk = switch_loss(t["p_gen_logit"], t["copy_force_unk"])[0].tolist()
    assert unk == pytest.approx([-math.log(0.8), -math.log(0.6), -math.log(0.5), -math.log(0.9)], rel=1e-5)


def test_switch_loss_is_exact_for_a_saturated_switch():
    """-log(1 - p_gen) from the logit: z = 20 gives 20 + log(1 + e^-20), where 1 - sigmoid(20)
    is 0 in float32 (the old clamp said 23.03)."""
    z = torch.tensor([20.0, -30.0])
    loss = switch_loss(z, torch.tensor([True, False])).tolist()
    assert loss == pytest.approx([20.0 + math.log1p(math.exp(-20.0)), 30.0 + math.log1p(math.exp(-30.0))], rel=1e-6)


class _Task:
    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


class _FixedCopyModel(torch.nn.Module):
    """Returns given P_vocab, alpha and p_gen as a copy decoder would (Eq. 6 in log space)."""

    def __init__(self, vocab, alpha, p_gen, src):
        super().__init__()
        copy = torch.zeros_like(vocab).scatter_add_(2, src.unsqueeze(1).expand(-1, vocab.size(1), -1), alpha)
        self.lprobs = (p_gen.unsqueeze(-1) * vocab + (1 - p_gen.unsqueeze(-1)) * copy).log()
        self.extra = {
            "vocab_lprobs": vocab.log(),
            "copy_attn": alpha,
            "p_gen": p_gen.unsqueeze(-1),
            "p_gen_logit": (p_gen / (1 - p_gen)).log().unsqueeze(-1),
        }

    def forward(self, src_tokens, src_lengths, prev_output_tokens):
        return self.lprobs, self.extra

    def get_targets(self, sample, net_output):
        return sample["target"]


def test_criterion_forward_hand_computed():
    """The criterion's forward on a hand-made batch of two: labels of each mode, the three
    loss weights, padding, a target <unk> with an <unk> in the source (never a copy), and
    placeholders in and out of the source; force and force-unk differ."""
    from fairseq.data import Dictionary

    d = Dictionary()
    a, b, c, ph0, ph1 = (d.add_symbol(w) for w in ["a", "b", "c", "<unk-0>", "<unk-1>"])
    src = torch.tensor([[a, ph0, b, UNK, EOS], [PAD, PAD, c, b, EOS]])
    target = torch.tensor([[a, ph0, c, UNK, EOS], [b, a, ph1, EOS, PAD]])
    gen = torch.Generator().manual_seed(0)
    vocab = torch.rand(2, 5, len(d), generator=gen) + 0.1
    vocab[:, :, [ph0, ph1]] = 0.0  # outside the fixed vocabulary
    vocab = vocab / vocab.sum(-1, keepdim=True)
    raw = torch.rand(2, 5, 5, generator=gen) + 0.1
    raw = raw * torch.tensor([[1.0, 1, 1, 0, 0], [0, 0, 1, 1, 0]]).unsqueeze(1)  # copyable positions only
    alpha = raw / raw.sum(-1, keepdim=True)
    p_gen = torch.tensor([[0.9, 0.2, 0.7, 0.6, 0.8], [0.3, 0.6, 0.5, 0.9, 0.001]])
    model = _FixedCopyModel(vocab, alpha, p_gen, src)
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": None, "prev_output_tokens": None},
        "target": target,
        "ntokens": 9,
    }
    # by hand: (row, step, target, positions of the target in the source, force label, force-unk label)
    steps = [
        (0, 0, a, [0], 1, 0),
        (0, 1, ph0, [1], 1, 1),
        (0, 2, c, [], 0, 0),
        (0, 3, UNK, [], 0, 0),  # the source's <unk> is not this word
        (0, 4, EOS, [], 0, 0),
        (1, 0, b, [3], 1, 0),
        (1, 1, a, [], 0, 0),
        (1, 2, ph1, [], 0, 0),  # placeholder not in the source: P = 0, left out of the NLL
        (1, 3, EOS, [], 0, 0),
    ]  # step (1, 4) is padding

    def hand(mode, wv, wa, wp, oov="unk"):
        tot = {"loss": 0.0, "nll_loss": 0.0, "loss_vocab": 0.0, "loss_attn": 0.0, "loss_pgen": 0.0, "copy_steps": 0}
        for r, t, w, pos, force, force_unk in steps:
            pg = p_gen[r, t].item()
            mass = sum(alpha[r, t, i].item() for i in pos)
            pv = vocab[r, t, w].item()
            if w in (ph0, ph1):
                nll = -math.log((1 - pg) * mass) if pos else 0.0
                lv = -math.log(vocab[r, t, UNK].item()) if oov == "unk" else 0.0
            else:
                nll = -math.log(pg * pv + (1 - pg) * mass)
                lv = -math.log(pv)
            la = -math.log(mass) if pos else 0.0
            label = {"none": force, "force": force, "force-unk": force_unk}[mode]
            lp = (-math.log(1 - pg) if label else -math.log(pg)) if mode != "none" else 0.0
            tot["nll_loss"] += nll
            tot["loss_vocab"] += lv
            tot["loss_attn"] += la
            tot["loss_pgen"] += lp
            tot["copy_steps"] += label
            tot["loss"] += nll if mode == "none" else wv * lv + wa * la + wp * lp
        return tot

    results = {}
    for mode, weights, oov in [
        ("none", (1.0, 1.0, 1.0), "unk"),
        ("force", (0.5, 2.0, 3.0), "unk"),
        ("force-unk", (0.5, 2.0, 3.0), "unk"),
        ("force", (1.0, 1.0, 1.0), "skip"),
    ]:
        crit = ForceCopyCriterion(_Task(d), mode, *weights, sentence_avg=False, oov_vocab_target=oov)
        loss, sample_size, log = crit(model, sample)
        expected = hand(mode, *weights, oov)
        assert sample_size == 9
        assert loss.item() == pytest.approx(expected["loss"], rel=1e-5), mode
        for key, value in expected.items():
            assert float(log[key]) == pytest.approx(value, rel=1e-5, abs=1e-6), (mode, key)
        results[mode, oov] = loss.item()
    assert results["force", "unk"] != pytest.approx(results["force-unk", "unk"], rel=1e-3)


def test_placeholders_round_trip():
    vocab = {"was", "born", "in", "and", "<S>", "<P>", "<O>", "birth", "place", "."}
    src = "<S> Zorblat Quux <P> birth place <O> Xyloville <S> Zorblat".split()
    tgt = "Zorblat Quux was born in Xyloville and Nowhere .".split()
    s, t = encode_pair(src, tgt, vocab, max_positions=100)
    assert s == ["<S>", "<unk-1>", "<unk-2>", "<P>", "birth", "place", "<O>", "<unk-7>", "<S>", "<unk-1>"]
    assert t == ["<unk-1>", "<unk-2>", "was", "born", "in", "<unk-7>", "and", "<unk>", "."]
    assert restore(" ".join(t), src).split()[:6] == tgt[:6]


TINY_COPY = ["--arch", "copy_transformer_small", *TINY_MODEL, "--criterion", "force_copy"]


@pytest.mark.parametrize("mode", ["none", "force", "force-unk"])
def test_each_mode_trains_and_loss_goes_down(word_level_bin, tmp_path, mode):
    import json

    out = run_cli(
        "fairseq-train",
        word_level_bin / "bin",
        *TRAIN_COMMON,
        *TINY_COPY,
        "--lr",
        "3e-3",
        "--copy-supervision",
        mode,
        "--max-update",
        "30",
        "--save-dir",
        tmp_path,
        "--log-format",
        "json"
    )
    inner = [
        json.loads(line[line.index("{") :])
        for line in (out.stdout + out.stderr).splitlines()
        if "| train_inner |" in line
    ]
    assert len(inner) == 30
    assert float(inner[-1]["loss"]) < 0.8 * float(inner[0]["loss"])
    for key in ("loss_vocab", "loss_attn", "loss_pgen", "copy_share", "p_gen"):
        assert key in inner[0]


def test_copies_unseen_words_end_to_end(word_level_bin, tiny_raw, tmp_path):
    """With the switch forced to copy (p_gen ~ 0), fairseq-generate outputs source words only,
    and restoring placeholders brings back words that are not in the vocabulary. (The first
    placeholder of each source is a decoding constraint: the barely trained copy attention would
    otherwise copy the markers <S> <P> <O>, which occur several times in every source.)"""
    run_cli(
        "fairseq-train", word_level_bin / "bin", *TRAIN_COMMON, *TINY_COPY, "--max-update", "3", "--save-dir", tmp_path
    )
    ck = torch.load(tmp_path / "checkpoint_last.pt")
    ck["model"]["decoder.copy_generator.switch.weight"].zero_()
    ck["model"]["decoder.copy_generator.switch.bias"].fill_(-30.0)
    torch.save(ck, tmp_path / "copy_only.pt")
    encoded = (word_level_bin / "text" / "test.src").read_text().splitlines()
    first = [next((w for w in line.split() if PLACEHOLDER.match(w)), "") for line in encoded]
    (word_level_bin / "bin" / "test.first-placeholder").write_text("\n".join(first) + "\n")
    gen = tmp_path / "gen.out"
    out = run_cli(
        "fairseq-generate",
        word_level_bin / "bin",
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--path",
        tmp_path / "copy_only.pt",
        "--beam",
        "5",
        "--batch-size",
        "8",
        "--gen-subset",
        "test",
        "--task",
        "translation_constrained",
        "--constraints",
        "unordered",
        "--constraints-from",
        "first-placeholder",
    )
    gen.write_text(out.stdout)
    run_cli(
        "-m",
        "fairseq_knowgen.prep.placeholders",
        "restore",
        "--gen",
        gen,
        "--src",
        tiny_raw / "test.src",
        "--out",
        tmp_path / "restored.out",
    )
    vocab = {line.split()[0] for line in (word_level_bin / "text" / "dict.txt").read_text().splitlines()}
    src = (tiny_raw / "test.src").read_text().splitlines()
    restored = (tmp_path / "restored.out").read_text().splitlines()
    for line in restored:
        if line.startswith("H-"):
            idx, _, text = line.split("\t")
            words = text.split()
            source_words = set(src[int(idx[2:])].split())
            assert set(words) <= source_words, (words, source_words)
    assert check_restored(out.stdout.splitlines(), restored, encoded, src, vocab) >= sum(1 for f in first if f)


def check_restored(hyp_lines, restored_lines, encoded_src, raw_src, vocab):
    """Every ``<unk-N>`` of a hypothesis is a placeholder of its encoded source at position N
    and is restored to raw source word N, a word outside the vocabulary; every other word is
    left as it is. Returns the number of restored placeholders."""
    hyps = {line.split("\t")[0]: line.split("\t")[2].split() for line in hyp_lines if line.startswith("H-")}
    restored = {line.split("\t")[0]: line.split("\t")[2].split() for line in restored_lines if line.startswith("H-")}
    assert hyps and hyps.keys() == restored.keys()
    n = 0
    for key, hyp in hyps.items():
        i = int(key[2:])
        assert len(restored[key]) == len(hyp), (hyp, restored[key])
        for h, r in zip(hyp, restored[key]):
            m = PLACEHOLDER.match(h)
            if m:
                pos = int(m.group(1))
                assert encoded_src[i].split()[pos] == h, (i, h, encoded_src[i])
                assert r == raw_src[i].split()[pos] and r not in vocab, (i, h, r, raw_src[i])
                n += 1
            else:
                assert r == h
    return n


def test_check_restored_rejects_a_word_from_the_wrong_position():
    raw = ["<S> Zorblat Quux <P> likes <O> Xyloville"]
    enc = ["<S> <unk-1> <unk-2> <P> likes <O> <unk-6>"]
    vocab = {"<S>", "<P>", "<O>", "likes"}
    assert check_restored(["H-0\t-1.0\t<unk-2> likes"], ["H-0\t-1.0\tQuux likes"], enc, raw, vocab) == 1
    with pytest.raises(AssertionError):  # source word 1, not 2
        check_restored(["H-0\t-1.0\t<unk-2> likes"], ["H-0\t-1.0\tZorblat likes"], enc, raw, vocab)
    with pytest.raises(AssertionError):  # <unk-3> is not a placeholder of this source
        check_restored(["H-0\t-1.0\t<unk-3>"], ["H-0\t-1.0\t<P>"], enc, raw, vocab)


@pytest.mark.parametrize("flags", [[], ["--dimattn-type", "dydim", "--copy-heads", "1"]])
def test_copy_incremental_equals_full(tiny_bin, flags):
    from helpers import build_task_and_model, decode_full_and_stepwise, first_batch

    task, model, _ = build_task_and_model(tiny_bin, "copy_transformer", *TINY_MODEL, *flags)
    model.eval()
    net = first_batch(task)["net_input"]
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    prev = net["prev_output_tokens"]
    (logits, extra), steps = decode_full_and_stepwise(model, enc, prev)
    real = prev.ne(task.target_dictionary.pad())
    full = model.get_normalized_probs((logits, extra), log_probs=True)
    stepwise = torch.cat([model.get_normalized_probs(s, log_probs=True) for s in steps], 1)
    torch.testing.assert_close(stepwise[real], full[real], atol=1e-5, rtol=1e-5)
    pgen = torch.cat([s[1]["p_gen"] for s in steps], 1)
    torch.testing.assert_close(pgen[real], extra["p_gen"][real], atol=1e-5, rtol=1e-5)
    # the first output is the mixture's logits, log P(w) - log p_gen: they sum to 1 / p_gen
    total = torch.logsumexp(logits, -1)[real]
    torch.testing.assert_close(total, -F.logsigmoid(extra["p_gen_logit"][..., 0])[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("flags", [[], ["--copy-alpha", "renormalized", "--copy-heads", "all"]])
def test_copy_distribution_uses_diminishing_weights(tiny_bin, flags):
    """With --dimattn-* the copy attention is the copy layer's diminishing weights divided by their sum over
    the positions of Eq. 6: by default the first head's over every non-pad position; with --copy-alpha
    renormalized --copy-heads all, the average of the heads' over the copyable positions."""
    from helpers import build_task_and_model, first_batch

    from fairseq_knowgen.analysis.coverage import teacher_forced_maps
    from fairseq_knowgen.modules.diminishing_attention import DiminishingMultiheadAttention

    task, model, _ = build_task_and_model(
        tiny_bin, "copy_transformer", *TINY_MODEL, "--dimattn-type", "dim", "--copy-layer", "0", *flags
    )
    model.eval()
    assert isinstance(model.decoder.layers[0].encoder_attn, DiminishingMultiheadAttention)
    assert not isinstance(model.decoder.layers[1].encoder_attn, DiminishingMultiheadAttention)
    net = first_batch(task)["net_input"]
    with torch.no_grad():
        _, extra = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
    maps = teacher_forced_maps(model, net["src_tokens"], net["src_lengths"], net["prev_output_tokens"], layer=0)
    if flags:  # heads averaged, copyable positions only
        used, raw = maps["used"].mean(1), maps["raw"].mean(1)  # B x T x S
        support = ~model.decoder.uncopyable[net["src_tokens"]]
    else:  # the first head, every non-pad position
        used, raw = maps["used"][:, 0], maps["raw"][:, 0]
        support = net["src_tokens"].ne(task.source_dictionary.pad())
    used = used * support.unsqueeze(1)
    expected = used / used.sum(-1, keepdim=True)
    torch.testing.assert_close(extra["copy_attn"], expected, atol=1e-5, rtol=1e-5)
    raw = raw * support.unsqueeze(1)
    assert not torch.allclose(extra["copy_attn"], raw / raw.sum(-1, keepdim=True), atol=1e-3)


def test_copy_model_keeps_placeholders_out_of_p_vocab(word_level_bin):
    """Word-level data with <unk-N> placeholders: P_vocab(<unk-N>) = 0 exactly; the mixture
    gives a placeholder of the source (1 - p_gen) times its copy attention and one absent from
    the source exactly 0; placeholders read <unk>'s input embedding; a placeholder target
    absent from its source (P = 0) leaves the loss and every gradient finite."""
    from helpers import build_task_and_model, first_batch

    task, model, args = build_task_and_model(
        word_level_bin / "bin", "copy_transformer", *TINY_MODEL, "--criterion", "force_copy"
    )
    d = task.target_dictionary
    ph = torch.tensor([bool(PLACEHOLDER.match(s)) for s in d.symbols])
    assert ph.sum() == 40  # --max-positions 40
    for emb in (model.encoder.embed_tokens, model.decoder.embed_tokens):
        ids = ph.nonzero().squeeze(1)
        torch.testing.assert_close(emb(ids), emb.weight[d.unk()].expand(len(ids), -1), rtol=0, atol=0)
        torch.testing.assert_close(emb(torch.tensor([5, 6])), emb.weight[[5, 6]], rtol=0, atol=0)
    assert not any("remap" in k for k in model.state_dict())
    model.eval()
    sample = first_batch(task)
    src = sample["net_input"]["src_tokens"]
    with torch.no_grad():
        out = model(**sample["net_input"])
        lprobs, extra = model.get_normalized_probs(out, log_probs=True), out[1]
    assert (extra["vocab_lprobs"][..., ph] == -math.inf).all()
    seen = 0
    for b in range(src.size(0)):
        for p in ph.nonzero().squeeze(1).tolist():
            at = src[b].eq(p)
            if at.any():
                seen += 1
                copy = (1 - extra["p_gen"][b, :, 0]) * extra["copy_attn"][b][:, at].sum(-1)
                torch.testing.assert_close(lprobs[b, :, p], copy.log(), atol=1e-5, rtol=1e-5)
            else:
                assert (lprobs[b, :, p] == -math.inf).all()
    assert seen > 0

    # a target placeholder that its source lacks (as after truncating the source)
    absent = next(p for p in ph.nonzero().squeeze(1).tolist() if not src[0].eq(p).any())
    sample["target"][0, 0] = absent
    for mode in ("none", "force"):
        args.copy_supervision = mode
        crit = task.build_criterion(args)
        model.zero_grad()
        loss, _, log = crit(model, sample)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(log["nll_loss"])
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, (mode, bad)


def test_mixture_at_the_targets_equals_the_full_mixture_and_its_gradients():
    """Training's log P(w*) (no B x T x V mixture) against the full Eq. 6 gathered at w*: values and gradients,
    with a repeated source word, a placeholder reached only by copying (once with zero attention: the floor),
    a word only at a non-copyable position (-inf, zero gradients) and a padding target."""
    g = torch.Generator().manual_seed(0)
    B, T, S, V = 2, 4, 5, 9
    logits = torch.randn(B, T, V, generator=g)
    logits[..., 8] = -math.inf  # a placeholder: outside the fixed vocabulary
    z = torch.randn(B, T, 1, generator=g)
    attn = torch.rand(B, T, S, generator=g)
    attn[0, 1, 2] = 0.0  # the copy mass of placeholder 8 at step (0, 1): floored at float32's tiny, not -inf
    src = torch.tensor([[4, 5, 8, 4, EOS], [7, 8, 5, PAD, PAD]])
    copyable = torch.tensor([[True, True, True, True, False], [True, False, True, False, False]])
    attn = attn * copyable.unsqueeze(1)
    attn = attn / attn.sum(-1, keepdim=True)
    # (0, 0): a word at two positions; (0, 1), (0, 3): placeholder 8 only by copying; (1, 2): 8 only at a
    # non-copyable position (-inf); (1, 3): a padding target
    target = torch.tensor([[4, 8, 3, 8], [5, 7, 8, PAD]])
    leaves = (logits, z, attn)
    results = []
    for at_targets in (False, True):
        lg, zz, aa = [x.clone().requires_grad_() for x in leaves]
        vocab = torch.log_softmax(lg, -1)
        if at_targets:
            got = mixture_lprobs_at(target, vocab, zz, aa, src, copyable)
        else:
            got = full_mixture(vocab, zz, aa, src, copyable).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        finite = torch.isfinite(got)
        got.masked_fill(~finite, 0).sum().backward()
        results.append((got.detach(), finite, lg.grad, zz.grad, aa.grad))
    (full, f1, *g1), (at, f2, *g2) = results
    assert torch.equal(f1, f2) and not f1[1, 2] and f1.sum() == 7
    floor = math.log(torch.finfo(torch.float32).tiny)
    assert full[0, 1].item() == pytest.approx(floor + F.logsigmoid(-z[0, 1, 0]).item())
    torch.testing.assert_close(at[f1], full[f1])
    for a, b in zip(g1, g2):  # sums over at most 5 source positions: float32's default tolerances
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        torch.testing.assert_close(a, b)


def test_full_mixture_equals_the_mixture_at_every_word_with_its_gradients():
    """The full Eq. 6 (written back once per distinct copyable source word) against log P(w) computed word by word:
    every word of the vocabulary, values and the gradients of a random weighting, with a word at two copyable
    positions, a word at a copyable and a non-copyable position, a placeholder only copied, one with zero
    attention (the floor) and a word only at non-copyable positions."""
    g = torch.Generator().manual_seed(1)
    B, T, S, V = 2, 3, 6, 10
    logits = torch.randn(B, T, V, generator=g)
    logits[..., 8:] = -math.inf  # placeholders 8, 9: outside the fixed vocabulary
    z = torch.randn(B, T, 1, generator=g)
    src = torch.tensor([[4, 5, 8, 4, 9, EOS], [7, 8, 5, 7, PAD, PAD]])
    copyable = torch.tensor([[True, True, True, True, True, False], [False, False, True, True, False, False]])
    attn = torch.rand(B, T, S, generator=g) * copyable.unsqueeze(1)
    attn[0, 2, 4] = 0.0  # placeholder 9 at step (0, 2): the floor
    attn = attn / attn.sum(-1, keepdim=True)
    weights = torch.rand(B, T, V, generator=g)
    results = []
    for word_by_word in (False, True):
        lg, zz, aa = [x.clone().requires_grad_() for x in (logits, z, attn)]
        vocab = torch.log_softmax(lg, -1)
        if word_by_word:
            got = torch.stack(
                [mixture_lprobs_at(torch.full((B, T), w), vocab, zz, aa, src, copyable) for w in range(V)], dim=-1
            )
        else:
            got = full_mixture(vocab, zz, aa, src, copyable)
        finite = torch.isfinite(got)
        (got.masked_fill(~finite, 0) * weights).sum().backward()
        results.append((got.detach(), finite, lg.grad, zz.grad, aa.grad))
    (full, f1, *g1), (each, f2, *g2) = results
    assert torch.equal(f1, f2)
    assert not f1[1, :, 8].any() and f1[1, :, 7].all() and f1[0, 2, 9]  # 8 only at a non-copyable position in 1
    torch.testing.assert_close(full[f1], each[f1])
    assert full.exp().sum(-1).sub(1).abs().max() < 1e-5
    for a, b in zip(g1, g2):  # sums over at most 10 words and 6 source positions: float32's default tolerances
        torch.testing.assert_close(a, b)


def test_training_mode_skips_the_full_mixture_with_the_same_loss_and_gradients(word_level_bin):
    """A copy decoder in training mode returns no B x T x V mixture; the criteria's loss and every gradient equal
    those from the full mixture (eval mode, no dropout), and get_normalized_probs rebuilds the mixture."""
    from helpers import build_task_and_model, first_batch

    task, model, args = build_task_and_model(
        word_level_bin / "bin", "copy_transformer", *TINY_MODEL, "--criterion", "force_copy", "--dropout", "0"
    )
    sample = first_batch(task)
    for mode in ("none", "force"):
        args.copy_supervision = mode
        crit = task.build_criterion(args)
        runs = {}
        for training in (False, True):
            model.train(training)
            model.zero_grad()
            out = model(**sample["net_input"])
            assert (out[0] is None) == training
            loss, _, log = crit(model, sample)
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            runs[training] = (out, loss.item(), float(log["nll_loss"]), grads)
        (out_e, loss_e, nll_e, g_e), (out_t, loss_t, nll_t, g_t) = runs[False], runs[True]
        assert loss_t == pytest.approx(loss_e, rel=1e-6) and nll_t == pytest.approx(nll_e, rel=1e-6), mode
        assert g_t.keys() == g_e.keys() and len(g_t) > 0
        # both modes take log P(w*) through the same operations: on CPU the gradients agree to the last bit (60
        # random starts, 56 target and 58 source positions each); the tolerance only leaves room for other kernels
        for n in g_e:
            torch.testing.assert_close(g_t[n], g_e[n], rtol=1e-5, atol=1e-7, msg=n)
        torch.testing.assert_close(
            model.get_normalized_probs(out_t, log_probs=True), model.get_normalized_probs(out_e, log_probs=True)
        )


@pytest.mark.parametrize("alpha", ["raw", "renormalized"])
def test_unk_is_never_a_copy_target(tiny_bin, alpha):
    """A target <unk> is not "in the source" (no forced copy) even when the source has an <unk>. With
    --copy-alpha renormalized that <unk> gets no copy attention either; with raw alpha (the default) Eq. 6
    gives P(<unk>) the attention on it, as the paper's sum over i: x_i = w does."""
    from helpers import build_task_and_model, first_batch

    task, model, args = build_task_and_model(
        tiny_bin, "copy_transformer", *TINY_MODEL, "--criterion", "force_copy", "--copy-alpha", alpha
    )
    d = task.target_dictionary
    model.eval()
    sample = first_batch(task)
    src, target = sample["net_input"]["src_tokens"], sample["target"]
    rows = torch.arange(src.size(0))
    first = src.ne(d.pad()).long().argmax(1)  # first real position (sources are left-padded)
    src[rows, first] = d.unk()
    target[:, 0] = d.unk()
    with torch.no_grad():
        out = model(**sample["net_input"])
        lprobs, extra = model.get_normalized_probs(out, log_probs=True), out[1]
        logp_gen, logp_copy = (F.logsigmoid(s * extra["p_gen_logit"][..., 0]) for s in (1, -1))
        gen_only = logp_gen + extra["vocab_lprobs"][..., d.unk()]
        if alpha == "renormalized":
            assert (extra["copy_attn"][rows, :, first] == 0).all()
            # P(<unk>) = p_gen P_vocab(<unk>): nothing copied
            torch.testing.assert_close(lprobs[..., d.unk()], gen_only, atol=1e-5, rtol=1e-5)
        else:
            copied = extra["copy_attn"][rows, :, first]  # B x T: <unk> is at one position of each source
            assert (copied > 0).all()
            expected = torch.logaddexp(gen_only, logp_copy + copied.log())
            torch.testing.assert_close(lprobs[..., d.unk()], expected, atol=1e-5, rtol=1e-5)
        _, _, log = task.build_criterion(args)(model, sample)
    never = {d.pad(), d.eos(), d.bos(), d.unk()}
    expected = 0
    for s, t in zip(src.tolist(), target.tolist()):
        copyable = set(s) - never
        expected += sum(w in copyable for w in t if w != d.pad())
    assert int(log["copy_steps"]) == expected


def test_separate_dictionaries_are_refused(tiny_raw, tmp_path):
    from helpers import build_task_and_model

    preprocess(tiny_raw, tmp_path, "train", "valid", dictionary="separate")
    assert (tmp_path / "dict.src.txt").read_text() != (tmp_path / "dict.tgt.txt").read_text()
    with pytest.raises(ValueError, match="needs one dictionary for source and target") as err:
        build_task_and_model(tmp_path, "copy_transformer", *TINY_MODEL)
    assert str(tmp_path / "dict.src.txt") in str(err.value) and str(tmp_path / "dict.tgt.txt") in str(err.value)


def test_temperature_tempers_the_mixture(tiny_bin):
    """fairseq's sequence generator divides the decoder's first output by --temperature T
    before get_normalized_probs: a copy model then decodes with P(w)^(1/T) / Z."""
    from fairseq.sequence_generator import EnsembleModel
    from helpers import build_task_and_model, first_batch

    task, model, _ = build_task_and_model(tiny_bin, "copy_transformer", *TINY_MODEL)
    model.eval()
    net = first_batch(task)["net_input"]
    ensemble = EnsembleModel([model])
    prefix = net["prev_output_tokens"][:, :2]
    with torch.no_grad():
        enc = ensemble.forward_encoder(net)
        full = model.decoder(prefix, encoder_out=enc[0])
        p = model.get_normalized_probs(full, log_probs=False)[:, -1].double()
        lp = {}
        for temperature in (1.0, 2.0, 0.5):
            state = [{}]
            ensemble.forward_decoder(prefix[:, :1], enc, state, temperature)
            lp[temperature] = ensemble.forward_decoder(prefix, enc, state, temperature)[0].double()
    for temperature, out in lp.items():
        tempered = p ** (1 / temperature)
        expected = (tempered / tempered.sum(-1, keepdim=True)).log()
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)

    def entropy(x):
        return -(x.exp() * x).nansum(-1)

    assert (entropy(lp[2.0]) > entropy(lp[1.0]) + 0.01).all() and (entropy(lp[0.5]) < entropy(lp[1.0]) - 0.01).all()
