"""The staged recipes as a user runs them, on tiny raw data in the original formats: an
optional test split is decoded and scored with dev (WebNLG: seen and unseen categories
apart), no held-out categories can be asked for, and a crashed training fails the stage."""

import json
import os
import random
import subprocess
from xml.sax.saxutils import escape

import pytest
from conftest import NO_PREFETCH_THREAD, ROOT

RECIPE_ENV = dict(
    OMP_NUM_THREADS="1",
    LAYERS="1",
    DIM="16",
    HEADS="2",
    MAX_UPDATE="3",
    MINUTES="5",
    BEAM="2",
    MAX_TOKENS="2000",
    WARMUP="1",
    TRAIN_ARGS=" ".join(NO_PREFETCH_THREAD),  # no prefetch thread to abort a 3-update run at exit (conftest.py)
)


def run_recipe(script, *args, **env):
    proc = subprocess.run(
        ["bash", script, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, **RECIPE_ENV, **env),
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    # fairseq logs this on every command when tensorboardX is missing (--tensorboard-logdir needs it)
    assert "Please install tensorboardX" not in proc.stdout + proc.stderr
    return proc


# --- stage_train ------------------------------------------------------------------------------------------


def test_crashed_training_fails_the_stage_even_with_an_old_checkpoint(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "fairseq-train").write_text("#!/bin/sh\necho 'RuntimeError: out of luck'\nexit 1\n")
    (fake_bin / "fairseq-train").chmod(0o755)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint_best.pt").write_text("an old checkpoint")
    script = f"""set -euo pipefail
ROOT={ROOT}; OUT={tmp_path}; RUN={run}; NAME=x ARCH=transformer ARCH_ARGS= LAYERS=1 DIM=8 HEADS=1
MINUTES=1 MAX_UPDATE=1 TRAIN_ARGS= DATA_BIN={tmp_path}
. {ROOT}/examples/lib/stages.sh
BIN={fake_bin}
stage_train
echo REACHED"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "REACHED" not in proc.stdout
    assert "fairseq-train failed" in proc.stdout and "RuntimeError: out of luck" in proc.stdout


# --- WebNLG -----------------------------------------------------------------------------------------------

PEOPLE = "Ann Bo Cy Di Ed Flo Gus Hal Ivy Jo Kim Lu".split()
CITIES = "Oslo Rome Lima Kyiv Pune Nice".split()


def webnlg_xml(entries):
    out = ["<benchmark>", "<entries>"]
    for i, (cat, triples, texts) in enumerate(entries):
        out.append(f'<entry category="{cat}" eid="Id{i}" size="{len(triples)}">')
        out.append("<modifiedtripleset>")
        out += [f"<mtriple>{escape(' | '.join(t))}</mtriple>" for t in triples]
        out.append("</modifiedtripleset>")
        out += [f'<lex comment="good" lid="Id{j}"><text>{escape(t)}</text></lex>' for j, t in enumerate(texts)]
        out.append("</entry>")
    return "\n".join(out + ["</entries>", "</benchmark>"]) + "\n"


def webnlg_entries(rng, category, n):
    out = []
    for _ in range(n):
        p, c = rng.choice(PEOPLE), rng.choice(CITIES)
        out.append((category, [(p, "birthPlace", c)], [f"{p} was born in {c} .", f"{c} is where {p} was born ."]))
    return out


@pytest.fixture(scope="module")
def webnlg_data(tmp_path_factory):
    rng = random.Random(0)
    data = tmp_path_factory.mktemp("webnlg")
    for split, cats, n in (("train", ("Artist", "City"), 30), ("dev", ("Artist",), 6), ("test", ("Artist", "Food"), 4)):
        folder = data / split / "1triples"
        folder.mkdir(parents=True)
        for cat in cats:
            (folder / f"{cat}.xml").write_text(webnlg_xml(webnlg_entries(rng, cat, n)))
    return data


def test_webnlg_recipe_scores_test_seen_and_unseen_without_heldout(webnlg_data, tmp_path):
    out = tmp_path / "out"
    run_recipe("examples/webnlg/run.sh", webnlg_data, out, HELDOUT="")
    assert (out / "raw" / "eval_splits").read_text().split() == ["valid", "test_seen", "test_unseen"]
    assert not (out / "raw" / "heldout.src").exists()
    assert (out / "raw" / "valid.entmap").exists()  # whole-entity placeholders are the word-level default
    cats = {s: set((out / "raw" / f"{s}.category").read_text().split()) for s in ("test_seen", "test_unseen")}
    assert cats == {"test_seen": {"Artist"}, "test_unseen": {"Food"}}
    for split in ("valid", "test_seen", "test_unseen"):
        n_inputs = len((out / "raw" / f"{split}.src").read_text().splitlines())
        scores = json.loads((out / "runs" / "transformer" / f"{split}.scores.json").read_text())
        assert scores, split
        assert len((out / "runs" / "transformer" / f"{split}.out").read_text().splitlines()) >= n_inputs
    # WebNLG trains with stages.sh's defaults (CommonGen has its own tuned ones; WARMUP is set by RECIPE_ENV)
    log = (out / "runs" / "transformer" / "train.log").read_text()
    assert "'lr': [0.001]" in log and "dropout=0.2," in log


def test_webnlg_without_heldout_or_test_split_binarizes_dev_only(webnlg_data, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev"):  # no test/
        os.symlink(webnlg_data / split, data / split)
    out = tmp_path / "out"
    run_recipe("examples/webnlg/run.sh", data, out, HELDOUT="", STOP_STAGE="3")
    assert (out / "raw" / "eval_splits").read_text().split() == ["valid"]
    assert sorted(p.name.split(".")[0] for p in (out / "bin").glob("*.idx")) == ["train", "train", "valid", "valid"]


def test_later_stage_before_stage_1_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        ["bash", "examples/webnlg/run.sh", tmp_path, tmp_path / "out"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, **RECIPE_ENV, STAGE="2"),
    )
    assert proc.returncode == 2 and "run stage 1 first" in proc.stdout


def test_webnlg_entity_placeholders_with_constraints_put_every_entity_in_the_output(webnlg_data, tmp_path):
    # a 3-update model says almost nothing right; constrained decoding must still make it mention every entity
    out = tmp_path / "out"
    env = dict(HELDOUT="", ENTITIES="1")
    run_recipe("examples/webnlg/run.sh", webnlg_data, out, STOP_STAGE="4", **env)
    run_recipe("examples/webnlg/run.sh", webnlg_data, out, STAGE="5", CONSTRAINTS="1", **env)
    for split in ("valid", "test_unseen"):
        entmaps = [json.loads(x) for x in (out / "raw" / f"{split}.entmap").read_text().splitlines()]
        hyps = {}
        for line in (out / "runs" / "transformer" / f"{split}.cons.out").read_text().splitlines():
            if line.startswith("H-"):
                i, _, text = line[2:].split("\t", 2)
                hyps[int(i)] = text
        assert sorted(hyps) == list(range(len(entmaps)))
        for i, ents in enumerate(entmaps):
            assert "<ent-" not in hyps[i]
            for e in ents:
                assert e in hyps[i], (split, i, e, hyps[i])
        assert (out / "runs" / "transformer" / f"{split}.cons.scores.json").exists()


def test_webnlg_heldout_category_is_unseen_in_test(webnlg_data, tmp_path):
    out = tmp_path / "out"
    run_recipe("examples/webnlg/run.sh", webnlg_data, out, HELDOUT="City", STOP_STAGE="1")
    assert (out / "raw" / "eval_splits").read_text().split() == ["valid", "heldout", "test_seen", "test_unseen"]
    assert set((out / "raw" / "heldout.category").read_text().split()) == {"City"}


# --- CommonGen --------------------------------------------------------------------------------------------

CONCEPTS = "dog frisbee catch ball throw kid park run field jump river boat swim sit tree".split()


def commongen_split(rng, data, name, n_sets, with_refs=True):
    src, tgt = [], []
    for _ in range(n_sets):
        a, b, c = rng.sample(CONCEPTS, 3)
        for r in range(2):
            src.append(f"{a} {b} {c}")
            tgt.append(f"the {a} and the {b} {c} {'here' if r else 'there'} .")
    (data / f"commongen.{name}.src_alpha.txt").write_text("\n".join(src) + "\n")
    if with_refs:
        (data / f"commongen.{name}.tgt.txt").write_text("\n".join(tgt) + "\n")


def test_commongen_recipe_scores_a_test_split(tmp_path):
    rng = random.Random(1)
    data = tmp_path / "data"
    data.mkdir()
    commongen_split(rng, data, "train", 60)
    commongen_split(rng, data, "dev", 5)
    commongen_split(rng, data, "test", 4)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("= Dogs =\n the dog runs in the park with a ball . a kid swims in the river near a tree .\n")
    out = tmp_path / "out"
    run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", MAX_SHARED="1")
    assert (out / "raw" / "eval_splits").read_text().split() == ["valid", "test"]
    # CommonGen's own tuned defaults reach fairseq-train (README "Tuning the one-hour recipe")
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


def test_commongen_checkpoint_last_decodes_checkpoint_last_into_its_own_outputs(tmp_path):
    """CHECKPOINT=last: stages 6-7 read checkpoint_last.pt and write valid.last.out / valid.last.scores.json (and
    valid.cons.last.* with constraints), leaving the best checkpoint's outputs as they were; CHECKPOINT=avg2 after
    KEEP_EPOCHS=2 averages the two newest checkpoints and decodes the average into valid.avg2.out; avg3 with two
    checkpoints, or a value other than best, last or avgN, stops with exit 2."""
    bad = subprocess.run(
        ["bash", "examples/commongen/run.sh", tmp_path, tmp_path, tmp_path],
        cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, CHECKPOINT="newest", STAGE="6"),
    )  # fmt: skip
    assert bad.returncode == 2 and "CHECKPOINT must be best, last or avgN" in bad.stdout
    rng = random.Random(4)
    data = tmp_path / "data"
    data.mkdir()
    commongen_split(rng, data, "train", 30)
    commongen_split(rng, data, "dev", 3)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("the dog runs in the park with a ball .\n")
    out = tmp_path / "out"
    # KEEP_EPOCHS=2 and the recipe's own hyper-parameter variables reach fairseq-train
    run_recipe("examples/commongen/run.sh", data, out, corpus, BPE_OPS="50", KEEP_EPOCHS="2", LR="7e-4",
               DROPOUT="0.15")  # fmt: skip
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


def test_commongen_without_an_out_of_domain_corpus_makes_the_in_domain_inputs(tmp_path):
    """No WikiText-2 file (the third argument names none that exists): stage 2 says in one line that it retrieves
    in-domain prototypes only, and stages 3-4 make bin/ and bin-eki/ and no bin-eki-ood/ (EKI trains on INPUT=eki)."""
    rng = random.Random(2)
    data = tmp_path / "data"
    data.mkdir()
    commongen_split(rng, data, "train", 30)
    commongen_split(rng, data, "dev", 4)
    out = tmp_path / "out"
    proc = run_recipe("examples/commongen/run.sh", data, out, tmp_path / "no-such-corpus.txt", BPE_OPS="50",
                      STOP_STAGE="4")  # fmt: skip
    assert "in-domain only (no out-of-domain corpus at" in proc.stdout
    assert (out / "bin-eki" / "train.src-tgt.src.bin").exists() and (out / "bin" / "valid.src-tgt.src.bin").exists()
    assert not (out / "bin-eki-ood").exists() and not list((out / "raw").glob("*eki-ood*"))
