"""The CommonGen recipe as a user runs it, on tiny raw data in CommonGen's release format: an optional test split
is decoded and scored with dev (not scored without references), constraints in either form reach the outputs,
CHECKPOINT=last/avgN decode their own checkpoints, and no out-of-domain corpus is needed. The tests that share one
data set copy its stages 1-4 (one module fixture) instead of preparing it again."""

import json
import os
import random
import shutil
import subprocess

import pytest
from conftest import ROOT
from test_recipes import RECIPE_ENV, run_recipe


CONCEPTS = "dog frisbee catch ball throw kid park run field jump river boat swim sit tree".split()


def lowercased_reference(a, b, c, r):
    return f"the {a} and the {b} {c} {'here' if r else 'there'} ."


def commongen_split(rng, data, name, n_sets, with_refs=True, reference=lowercased_reference):
    """CommonGen files of ``n_sets`` concept sets, two references each (``reference(a, b, c, r)``); the references."""
    src, tgt = [], []
    for _ in range(n_sets):
        a, b, c = rng.sample(CONCEPTS, 3)
        for r in range(2):
            src.append(f"{a} {b} {c}")
            tgt.append(reference(a, b, c, r))
    (data / f"commongen.{name}.src_alpha.txt").write_text("\n".join(src) + "\n")
    if with_refs:
        (data / f"commongen.{name}.tgt.txt").write_text("\n".join(tgt) + "\n")
    return tgt


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Stages 1-4 once (train 40 concept sets: one batch per epoch at MAX_TOKENS=2000, dev 5, test 4 with
    references; a two-line out-of-domain corpus; MAX_SHARED=1): (data, corpus, out) for the tests to copy."""
    root = tmp_path_factory.mktemp("commongen")
    rng = random.Random(1)
    data = root / "data"
    data.mkdir()
    commongen_split(rng, data, "train", 40)
    commongen_split(rng, data, "dev", 5)
    commongen_split(rng, data, "test", 4)
    corpus = root / "wiki.txt"
    corpus.write_text("= Dogs =\n the dog runs in the park with a ball . a kid swims in the river near a tree .\n")
    out = root / "out"
    run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", MAX_SHARED="1", STOP_STAGE="4")
    return data, corpus, out


def copy_of(prepared, tmp_path, eval_splits=None):
    """A copy of the prepared OUT; ``eval_splits``: the evaluation splits its decoding stages read (stage 1 wrote
    valid and test to raw/eval_splits)."""
    data, corpus, out = prepared
    shutil.copytree(out, tmp_path / "out")
    if eval_splits:
        (tmp_path / "out" / "raw" / "eval_splits").write_text("\n".join(eval_splits) + "\n")
    return data, corpus, tmp_path / "out"


def test_commongen_recipe_scores_a_test_split(prepared, tmp_path):
    data, corpus, out = copy_of(prepared, tmp_path)
    run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", STAGE="5")
    assert (out / "raw" / "eval_splits").read_text().split() == ["valid", "test"]
    # CommonGen's own tuned defaults reach fairseq-train (docs/results/commongen.md, "Tuning the one-hour recipe")
    log = (out / "runs" / "transformer" / "train.log").read_text()
    assert "'lr': [0.002]" in log and "dropout=0.3," in log
    for split, n in (("valid", 5), ("test", 4)):
        scores = json.loads((out / "runs" / "transformer" / f"{split}.scores.json").read_text())
        assert scores, split
        assert len((out / "raw" / f"{split}.eki.src").read_text().splitlines()) == n
    # constrained decoding: every concept of every input is in its hypothesis
    run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", STAGE="6", CONSTRAINTS="1")
    for split in ("valid", "test"):
        concepts = [c.split("|") for c in (out / "raw" / f"{split}.concepts").read_text().splitlines()]
        hyps = {}
        for line in (out / "runs" / "transformer" / f"{split}.cons.out").read_text().splitlines():
            if line.startswith("H-"):
                i, _, text = line[2:].split("\t", 2)
                hyps[int(i)] = text.split()
        assert sorted(hyps) == list(range(len(concepts)))
        assert all(c in hyps[i] for i, cs in enumerate(concepts) for c in cs), hyps
        assert (out / "runs" / "transformer" / f"{split}.cons.scores.json").exists()
    train_report = json.loads((out / "raw" / "train.proto.json").read_text())
    assert train_report["max_shared_concepts"] == 1
    assert json.loads((out / "raw" / "test.proto.json").read_text())["max_shared_concepts"] is None


def test_commongen_test_split_without_references_is_decoded_not_scored(tmp_path):
    rng = random.Random(2)
    data = tmp_path / "data"
    data.mkdir()
    commongen_split(rng, data, "train", 40)
    commongen_split(rng, data, "dev", 3)
    commongen_split(rng, data, "test", 3, with_refs=False)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("the dog runs in the park with a ball .\n")
    out = tmp_path / "out"
    proc = run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50")
    assert "test has no references" in proc.stdout
    assert (out / "runs" / "transformer" / "test.out").exists()
    assert not (out / "runs" / "transformer" / "test.scores.json").exists()
    assert (out / "runs" / "transformer" / "valid.scores.json").exists()


def test_commongen_constraint_form_prototype_reaches_the_constraint_file_and_the_outputs(tmp_path):
    """CONSTRAINTS=1 CONSTRAINT_FORM=prototype on the plain-concepts model: stage 6 writes bin/valid.cons-prototype
    from the EKI prototypes of the same split (the documented choice for INPUT=concepts) and decodes with it into
    valid.cons-prototype.out; stage 4's concept-form bin/valid.cons stays as it was."""
    from fairseq_knowgen.text import lemma

    bad = subprocess.run(
        ["bash", "examples/commongen/run.sh", tmp_path, tmp_path, tmp_path],
        cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, CONSTRAINT_FORM="lemmas", STAGE="6"),
    )  # fmt: skip
    assert bad.returncode == 2 and "CONSTRAINT_FORM must be concept or prototype" in bad.stdout
    # every reference pluralizes every concept: a prototype (a training reference) gives the plural
    nouns = "dog ball kid park boat tree cat bird car lake".split()
    rng = random.Random(3)
    data = tmp_path / "data"
    data.mkdir()
    for name, n_sets in (("train", 40), ("dev", 3)):
        src, tgt = [], []
        for _ in range(n_sets):
            a, b, c = rng.sample(nouns, 3)
            src += [f"{a} {b} {c}"] * 2
            tgt += [f"the {a}s and the {b}s see {c}s .", f"two {b}s and {a}s near {c}s ."]
        (data / f"commongen.{name}.src_alpha.txt").write_text("\n".join(src) + "\n")
        (data / f"commongen.{name}.tgt.txt").write_text("\n".join(tgt) + "\n")
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("a dog runs in the park .\n")
    out = tmp_path / "out"
    run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", STOP_STAGE="5")
    concept_cons = (out / "bin" / "valid.cons").read_text()
    run_recipe(
        "examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", STAGE="6", CONSTRAINTS="1",
        CONSTRAINT_FORM="prototype",
    )  # fmt: skip
    assert (out / "bin" / "valid.cons").read_text() == concept_cons
    concepts = [c.split("|") for c in (out / "raw" / "valid.concepts").read_text().splitlines()]
    protos = [p.split() for p in (out / "raw" / "valid.proto").read_text().splitlines()]
    lines = (out / "bin" / "valid.cons-prototype").read_text().splitlines()
    cons = [[c.replace("@@ ", "") for c in line.split("\t")] for line in lines]  # "tre@@ es" here
    assert len(cons) == len(concepts) == 3  # dev is grouped by concept set: 3 inputs
    for cs, want, proto in zip(cons, concepts, protos):
        assert len(cs) == len(want)
        for c, w in zip(cs, want):
            # by hand: the plural when the prototype has it, else the concept
            assert c == (f"{w}s" if f"{w}s" in proto else w) and lemma(c) == w, (cs, want, proto)
    assert sum(c.endswith("s") for cs in cons for c in cs) >= 3  # prototypes do give plurals here
    hyps = {}
    for line in (out / "runs" / "transformer" / "valid.cons-prototype.out").read_text().splitlines():
        if line.startswith("H-"):
            i, _, text = line[2:].split("\t", 2)
            hyps[int(i)] = text.split()
    assert sorted(hyps) == list(range(3))
    assert all(c in hyps[i] for i, cs in enumerate(cons) for c in cs), (hyps, cons)  # decoded with that file
    assert (out / "runs" / "transformer" / "valid.cons-prototype.scores.json").exists()
    assert not (out / "runs" / "transformer" / "valid.cons.out").exists()


def test_commongen_checkpoint_last_decodes_checkpoint_last_into_its_own_outputs(prepared, tmp_path):
    """CHECKPOINT=last: stages 6-7 read checkpoint_last.pt and write valid.last.out / valid.last.scores.json (and
    valid.cons.last.* with constraints), leaving the best checkpoint's outputs as they were; CHECKPOINT=avg2 after
    KEEP_EPOCHS=2 averages the two newest checkpoints and decodes the average into valid.avg2.out; avg3 with two
    checkpoints, or a value other than best, last or avgN, stops with exit 2."""
    bad = subprocess.run(
        ["bash", "examples/commongen/run.sh", tmp_path, tmp_path, tmp_path],
        cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, CHECKPOINT="newest", STAGE="6"),
    )  # fmt: skip
    assert bad.returncode == 2 and "CHECKPOINT must be best, last or avgN" in bad.stdout
    data, corpus, out = copy_of(prepared, tmp_path, eval_splits=["valid"])  # the test split: decoded by the test above
    # KEEP_EPOCHS=2 and the recipe's own hyper-parameter variables reach fairseq-train
    run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", KEEP_EPOCHS="2", LR="7e-4",
               DROPOUT="0.15", STAGE="5")  # fmt: skip
    run_dir = out / "runs" / "transformer"
    train_log = (run_dir / "train.log").read_text()
    for value in ("'lr': [0.0007]", "dropout=0.15,", "'warmup_updates': 1,", "'max_tokens': 2000,"):
        assert value in train_log, value
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint[0-9]*.pt")) == [
        "checkpoint2.pt", "checkpoint3.pt"]  # fmt: skip
    best_out = (run_dir / "valid.out").read_text()
    for cons, ck in (("0", "last"), ("1", "last"), ("0", "avg2")):
        suffix = ".cons" if cons == "1" else ""
        run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", STAGE="6", CONSTRAINTS=cons,
                   CHECKPOINT=ck)  # fmt: skip
        log = (run_dir / f"valid{suffix}.{ck}.out.log").read_text()
        loaded = [line for line in log.splitlines() if "loading model(s) from" in line]
        assert loaded and all(line.endswith(f"checkpoints/checkpoint_{ck}.pt") for line in loaded), loaded
        assert (run_dir / f"valid{suffix}.{ck}.scores.json").exists()
    assert (run_dir / "valid.out").read_text() == best_out
    # three distinct checkpoints are not there: a clear error, nothing decoded
    proc = subprocess.run(["bash", "examples/commongen/run.sh", data, out, corpus], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, **RECIPE_ENV, STAGE="6", CHECKPOINT="avg3"))  # fmt: skip
    assert proc.returncode == 2 and "3 checkpoints with distinct update counts needed, found 2" in proc.stderr
    assert not (run_dir / "valid.avg3.out").exists()


@pytest.mark.parametrize("corpus", ["no-such-corpus.txt", None])
def test_commongen_without_an_out_of_domain_corpus_makes_the_in_domain_inputs(corpus, tmp_path):
    """No WikiText-2 file (the third argument names none that exists, or there is none: the default): stage 2 says
    in one line that it retrieves in-domain prototypes only, and stages 3-4 make bin/ and bin-eki/ and no
    bin-eki-ood/ (EKI trains on INPUT=eki)."""
    rng = random.Random(2)
    data = tmp_path / "data"
    data.mkdir()
    commongen_split(rng, data, "train", 30)
    commongen_split(rng, data, "dev", 4)
    out = tmp_path / "out"
    corpus_arg = [tmp_path / corpus] if corpus else []
    proc = run_recipe("examples/commongen/run.sh", data, out, *corpus_arg, BPE_OPS="50", STOP_STAGE="4")
    assert "in-domain only (no out-of-domain corpus at" in proc.stdout
    assert (out / "bin-eki" / "train.src-tgt.src.bin").exists() and (out / "bin" / "valid.src-tgt.src.bin").exists()
    assert not (out / "bin-eki-ood").exists() and not list((out / "raw").glob("*eki-ood*"))
