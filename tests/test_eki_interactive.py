"""EKI from raw text: fairseq-interactive (with --bpe, and with prototypes the task retrieves
itself) decodes exactly what fairseq-generate decodes from the binarized data."""

import contextlib
import io
import random
import sys

import pytest
import torch
from conftest import TINY_MODEL, TRAIN_COMMON, preprocess, run_cli

EKI_TINY = [*TINY_MODEL, "--eki-scaling-dim", "8"]
NOUNS = "dog cat horse bird child woman farmer teacher".split()
VERBS = "running jumping swimming sitting playing throwing".split()
PLACES = "park river garden kitchen meadow".split()


def full_source(concepts, prototype):
    return f"{' '.join(concepts)} <sep> {prototype}"


def example(rng):
    """(concepts, prototype covering all of them, target)"""
    n1, n2 = rng.sample(NOUNS, 2)
    verb = rng.choice(VERBS)
    proto = f"the {n1} and the {n2} are {verb} near the {rng.choice(PLACES)}"
    return [n1, n2, verb], proto, f"a {n1} is {verb} with the {n2} in the {rng.choice(PLACES)}"


@pytest.fixture(scope="module")
def eki_raw_model(tmp_path_factory):
    """A tiny EKI model trained on BPE'd 'concepts <sep> prototype' data (subword-nmt with
    '<sep>' as a glossary, as examples/lib/stages.sh does); the raw valid lines."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    rng = random.Random(1)
    raw, bpe_dir = tmp_path_factory.mktemp("ekiraw_i"), tmp_path_factory.mktemp("ekibpe_i")
    valid, seen = [], set()
    while len(valid) < 8:  # distinct concept sets, so that each has one best prototype
        concepts, proto, tgt = example(rng)
        if frozenset(concepts) not in seen:
            seen.add(frozenset(concepts))
            valid.append((concepts, proto, tgt))
    train = [example(rng) for _ in range(120)]
    for split, rows in (("train", train), ("valid", valid)):
        (raw / f"{split}.src").write_text("".join(full_source(c, p) + "\n" for c, p, _ in rows))
        (raw / f"{split}.tgt").write_text("".join(t + "\n" for _, _, t in rows))
    with open(bpe_dir / "codes", "w") as out:  # learned without '<sep>', as the recipe learns them
        learn_bpe(io.StringIO("".join(f"{' '.join(c)}\n{p}\n{t}\n" for c, p, t in train)), out, 30)
    with open(bpe_dir / "codes") as codes:
        bpe = BPE(codes, glossaries=["<sep>"])
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt"):
        lines = (raw / name).read_text().splitlines()
        (bpe_dir / name).write_text("".join(bpe.process_line(x) + "\n" for x in lines))
    assert "@@" in (bpe_dir / "valid.src").read_text()  # BPE splits words: the test exercises it
    data = tmp_path_factory.mktemp("ekibin_i")
    preprocess(bpe_dir, data, "train", "valid")
    save = tmp_path_factory.mktemp("ekickpt_i")
    run_cli(
        "fairseq-train",
        data,
        *TRAIN_COMMON,
        "--task",
        "eki_generation",
        "--arch",
        "eki_transformer",
        *EKI_TINY,
        "--criterion",
        "eki_label_smoothed_cross_entropy",
        "--lr",
        "3e-3",
        "--max-update",
        "15",
        "--save-dir",
        save,
    )
    return {"data": data, "codes": bpe_dir / "codes", "ckpt": save / "checkpoint_last.pt", "valid": valid}


DECODE = ["--user-dir", "fairseq_knowgen", "--task", "eki_generation", "--cpu", "--beam", "3"]
DECODE += ["--max-len-a", "0", "--max-len-b", "12", "--required-batch-size-multiple", "1"]  # (or batches go missing)


def run_main(module, argv, monkeypatch):
    """A fairseq_cli entry point in-process: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", [module.__name__] + [str(a) for a in argv])
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            module.cli_main()
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def lines_of(text, kind):
    """{sentence id: fields} of the 'KIND-id<TAB>...' lines fairseq prints."""
    out = {}
    for line in text.splitlines():
        if line.startswith(kind + "-"):
            head, *fields = line.split("\t")
            out[int(head[len(kind) + 1 :])] = fields
    return out


def interactive(model, lines, tmp_path, monkeypatch, *extra):
    import fairseq_cli.interactive

    inp = tmp_path / "input.txt"
    inp.write_text("".join(x + "\n" for x in lines))
    bpe = ["--bpe", "subword_nmt", "--bpe-codes", model["codes"], "--input", inp]
    return run_main(
        fairseq_cli.interactive, [model["data"], "--path", model["ckpt"], *DECODE, *bpe, *extra], monkeypatch
    )


@pytest.fixture(scope="module")
def generated(eki_raw_model):
    """fairseq-generate on the binarized valid set: S and H lines by sentence id."""
    import fairseq_cli.generate

    with pytest.MonkeyPatch.context() as mp:
        argv = [eki_raw_model["data"], "--path", eki_raw_model["ckpt"], *DECODE, "--gen-subset", "valid"]
        code, out, err = run_main(fairseq_cli.generate, argv + ["--batch-size", "1"], mp)
    assert code == 0, err[-3000:]
    return lines_of(out, "S"), lines_of(out, "H")


def assert_same_hypotheses(hyps, expected):
    assert sorted(hyps) == sorted(expected) == list(range(8))
    for i, (score, text) in expected.items():
        assert hyps[i][1] == text
        assert float(hyps[i][0]) == pytest.approx(float(score), abs=1e-4)


def test_interactive_with_bpe_equals_generate(eki_raw_model, generated, tmp_path, monkeypatch):
    gen_src, gen_hyp = generated
    raw = [full_source(c, p) for c, p, _ in eki_raw_model["valid"]]
    code, out, err = interactive(eki_raw_model, raw, tmp_path, monkeypatch, "--batch-size", "1")
    assert code == 0, err[-3000:]
    # the BPE of each side of <sep> is the recipe's BPE; generate shows what the model reads, <s> C O </s> (the
    # concat layout; <s> and </s> not printed), interactive the input line C <sep> O
    assert {i: [s.replace(" <sep> ", " ")] for i, (s,) in lines_of(out, "S").items()} == gen_src
    assert_same_hypotheses(lines_of(out, "H"), gen_hyp)


def test_interactive_retrieves_the_prototype_of_concept_lines(eki_raw_model, generated, tmp_path, monkeypatch):
    """Lines of concepts only get their prototype from --eki-prototype-corpus (mixed with
    complete lines, in padded batches of 4): the same sources and hypotheses as generate."""
    _, gen_hyp = generated
    valid = eki_raw_model["valid"]
    corpus = [p for _, p, _ in valid]
    # distractors: each covers two of a valid line's three concepts
    corpus += [f"the {c[0]} and the {c[1]} are sleeping" for c, _, _ in valid]
    corpus += [f"the {c[1]} is {c[2]} alone" for c, _, _ in valid]
    random.Random(0).shuffle(corpus)
    (tmp_path / "corpus.txt").write_text("".join(x + "\n" for x in corpus))
    lines = [" ".join(c) if i % 2 == 0 else full_source(c, p) for i, (c, p, _) in enumerate(valid)]
    flags = ["--eki-prototype-corpus", tmp_path / "corpus.txt", "--batch-size", "4", "--buffer-size", "8"]
    code, out, err = interactive(eki_raw_model, lines, tmp_path, monkeypatch, *flags, "--post-process", "subword_nmt")
    assert code == 0, err[-3000:]
    assert lines_of(out, "S") == {i: [full_source(c, p)] for i, (c, p, _) in enumerate(valid)}
    unbpe = {i: [s, (h + " ").replace("@@ ", "").rstrip()] for i, (s, h) in gen_hyp.items()}  # as --post-process
    assert_same_hypotheses(lines_of(out, "H"), unbpe)


def test_interactive_skips_a_concept_sets_own_references(eki_raw_model, tmp_path, monkeypatch):
    """--eki-prototype-corpus-keys: a sentence written for the query's concept set (in any
    order) is never its prototype, even when it covers every concept."""
    valid = eki_raw_model["valid"][:3]
    corpus, keys = [], []
    for c, p, _ in valid:
        corpus += [p, p.replace("the", "a", 1)]  # both cover all concepts; the first is an own reference
        keys += [" ".join(reversed(c)), "some other concepts"]
    (tmp_path / "corpus.txt").write_text("".join(x + "\n" for x in corpus))
    (tmp_path / "keys.txt").write_text("".join(x + "\n" for x in keys))
    flags = ["--eki-prototype-corpus", tmp_path / "corpus.txt", "--eki-prototype-corpus-keys", tmp_path / "keys.txt"]
    lines = [" ".join(c) for c, _, _ in valid]
    code, out, err = interactive(eki_raw_model, lines, tmp_path, monkeypatch, *flags, "--post-process", "subword_nmt")
    assert code == 0, err[-3000:]
    assert lines_of(out, "S") == {i: [full_source(c, p.replace("the", "a", 1))] for i, (c, p, _) in enumerate(valid)}


def test_concept_line_without_corpus_is_a_clear_error(eki_raw_model, tmp_path, monkeypatch):
    """The line is refused by name, the line before it decoded, and the run ends with exit status 2."""
    lines = [full_source(*eki_raw_model["valid"][0][:2]), "dog cat running"]
    code, out, err = interactive(eki_raw_model, lines, tmp_path, monkeypatch)
    assert code == 2
    assert f"error: {tmp_path / 'input.txt'}:2: no '<sep>'" in err and "--eki-prototype-corpus" in err
    assert sorted(lines_of(out, "H")) == [0]


def test_annotate_batch_equals_the_collater():
    """The annotations recomputed from a padded batch of tokens (fairseq-interactive keeps
    only src_tokens) are the dataset collater's."""
    from fairseq.data import Dictionary, LanguagePairDataset

    from fairseq_knowgen.data.eki_dataset import EKIDataset, SourceAnnotator

    d = Dictionary()
    for w in "dog run <sep> the dog@@ s are run@@ ning fast cat".split():
        d.add_symbol(w)
    texts = ["dog <sep> the dog", "dog run <sep> the dog@@ s are run@@ ning fast", "cat <sep> fast"]
    srcs = [torch.tensor([d.index(w) for w in t.split()] + [d.eos()]) for t in texts]
    for left_pad in (True, False):
        for settings in ({}, dict(layout="sep", center_match="lemma")):
            pairs = LanguagePairDataset(srcs, [len(s) for s in srcs], d, left_pad_source=left_pad)
            ds = EKIDataset(pairs, d, **settings)
            batch = ds.collater([ds[i] for i in range(3)])
            net = batch["net_input"]
            assert net["src_tokens"].eq(d.pad()).any()  # padded
            # what fairseq-interactive hands over: the 'C <sep> O </s>' rows, batched the same way
            raw = EKIDataset(pairs, d, layout="sep")
            raw_tokens = raw.collater([raw[i] for i in range(3)])["net_input"]["src_tokens"]
            tokens, group, distance = SourceAnnotator(d, **settings).annotate_batch(raw_tokens)
            assert torch.equal(tokens, net["src_tokens"])
            assert torch.equal(group, net["src_group"]) and torch.equal(distance, net["src_distance"])
