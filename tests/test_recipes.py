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


# --- the data argument ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, args",
    [
        ("examples/commongen/run.sh", []),
        ("examples/eki/run.sh", []),
        ("examples/webnlg/run.sh", []),
        ("examples/cocon/run.sh", []),
        ("examples/kbert/run.sh", []),
        ("examples/kbert/run.sh", ["medical_ner"]),  # the task without its data folder
    ],
)
def test_a_recipe_without_its_data_prints_its_usage_and_exits_2(script, args):
    """No default data folder: the data argument is required, and the usage names it."""
    proc = subprocess.run(["bash", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("usage:") and f"bash {script} " in proc.stderr
    assert "DATA" in proc.stderr.splitlines()[1] and proc.stdout == ""


def test_the_eki_recipe_runs_commongens_stages_and_names_itself_for_a_rerun(tmp_path):
    """examples/eki/run.sh is CommonGen's recipe with EKI's settings; a stage that finds an earlier one unfinished
    tells the user to rerun examples/eki/run.sh (not the CommonGen recipe, which would train another model)."""
    (tmp_path / "data").mkdir()
    proc = subprocess.run(
        ["bash", "examples/eki/run.sh", tmp_path / "data", tmp_path / "out"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, STAGE="5", STOP_STAGE="5"),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"STAGE=1 bash {ROOT}/examples/eki/run.sh {tmp_path}/data {tmp_path}/out" in proc.stderr


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
    assert proc.returncode == 2 and "raw/eval_splits is missing: stage 1 (prepare) writes it" in proc.stderr


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
