"""examples/kbert/run.sh end to end on tiny raw data in the original layout (TASK/{train,dev}.tsv
and kgs/*.spo): prepare, pretrain a masked LM, fine-tune from it, predict + score, floors."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

from fairseq_knowgen.prep.kbert import make_synthetic_task

RECIPE_ENV = dict(
    OMP_NUM_THREADS="1",
    LAYERS="1",
    DIM="16",
    HEADS="2",
    MAX_UPDATE="6",
    VALID_EVERY="3",
    MLM_UPDATE="2",
    MINUTES="5",
    MAX_POSITIONS="64",
)


def raw_layout(tmp_path, task):
    """The synthetic task in the shared data folder's layout."""
    tagging = task == "medical_ner"
    syn = make_synthetic_task(str(tmp_path / "syn"), 40, 12, tagging=tagging)
    data = tmp_path / "kbert"
    (data / task).mkdir(parents=True)
    (data / "kgs").mkdir()
    shutil.copy(f"{syn}/train.tsv", data / task / "train.tsv")
    shutil.copy(f"{syn}/valid.tsv", data / task / "dev.tsv")
    shutil.copy(f"{syn}/valid.tsv", data / task / "test.tsv")
    shutil.copy(f"{syn}/kg.spo", data / "kgs" / ("Medical.spo" if tagging else "HowNet.spo"))
    return data


def run_recipe(*args, **env):
    proc = subprocess.run(
        ["bash", "examples/kbert/run.sh", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, **RECIPE_ENV, **env),
    )
    assert proc.returncode == 0, f"failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.parametrize("task", ["medical_ner", "book_review"])
def test_recipe_end_to_end(tmp_path, task):
    data, out = raw_layout(tmp_path, task), tmp_path / "out"
    proc = run_recipe(task, data, out)
    assert "K-BERT encoder from" in (out / "runs" / "kbert" / "train.log").read_text()  # started from the MLM
    for split in ("valid", "test"):
        scores = json.loads((out / "runs" / "kbert" / f"{split}.scores.json").read_text())[f"kbert/{split}"]
        floor = "dictionary" if task == "medical_ner" else "tfidf"
        floor_scores = json.loads((out / "floors" / floor / f"{split}.scores.json").read_text())[f"{floor}/{split}"]
        key = "typed_f1" if task == "medical_ner" else "accuracy"
        assert 0 <= scores[key] <= 100 and 0 <= floor_scores[key] <= 100
        preds = (out / "runs" / "kbert" / f"{split}.pred").read_text().splitlines()
        gold = (data / task / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
        assert len(preds) == len(gold)
        if task == "medical_ner":  # one tag per original character
            assert [len(p.split()) for p in preds] == [len(g.split("\t")[0].split()) for g in gold]
    assert "== stage 5" in proc.stdout
    key = "typed_f1" if task == "medical_ner" else "accuracy"
    table = subprocess.run(
        [sys.executable, "scripts/results_table.py", "--row", f"K-BERT={out}/runs/kbert", "--col", f"dev=valid:{key}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert table.returncode == 0 and "| K-BERT |" in table.stdout and " - |" not in table.stdout, table.stdout
    if task == "book_review":
        return
    # the ablations and the control KG run from stage 3 on the same folder
    run_recipe(
        task,
        data,
        out,
        STAGE="3",
        STOP_STAGE="4",
        NAME="control-novm",
        KG="control",
        ARCH_ARGS="--no-visible-matrix --no-soft-positions",
        PRETRAINED="none",
    )
    log = (out / "runs" / "control-novm" / "train.log").read_text()
    assert "kg/control.spo" in log and "'no_visible_matrix': True" not in log  # (argparse namespace)
    assert "no_visible_matrix=True" in log and "no_soft_positions=True" in log
    assert (out / "runs" / "control-novm" / "valid.scores.json").is_file()


def test_recipe_refuses_an_unknown_task(tmp_path):
    proc = subprocess.run(["bash", "examples/kbert/run.sh", "sst2", tmp_path], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "TASK must be book_review or medical_ner" in proc.stdout
