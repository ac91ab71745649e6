"""examples/kbert/run.sh end to end on tiny raw data in the original layout (TASK/{train,dev,test}.tsv
and kgs/*.spo): prepare, pretrain a masked LM, fine-tune from it, predict + score, floors.

The tagging run is scored: its data can only be tagged with the KG (each entity's type is in the
KG and nowhere else; dev and test entities never occur in training), so a working pipeline reaches
a typed F1 above 90 within 120 updates, while one that ignores the KG, scrambles it (the control
KG) or misaligns labels stays far below."""

import json
import os
import random
import shutil
import subprocess
import sys

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
# the scored tagging run: 2 layers, 120 updates of 32 sentences (about 10 epochs of 400)
KG_TAGGING_ENV = dict(LAYERS="2", MAX_UPDATE="120", VALID_EVERY="40", LR="3e-3")


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


def kg_tagging_layout(root, n_train=400, n_eval=60, seed=1):
    """medical_ner data that only the KG can tag: a sentence is 3-8 filler characters, one entity
    of two characters (first from one set of 50, second from another, so B/I follow from the
    character) and 2-5 filler characters. Its type (Disease or Symptom, alternating) is stated only
    by the KG (``entity 类别 疾病|症状``); every entity occurs once, so dev and test types cannot be
    learned from the training sentences."""
    rng = random.Random(seed)
    filler = [chr(0x4E00 + i) for i in range(100)]
    firsts, seconds = [chr(0x4E64 + i) for i in range(50)], [chr(0x4E96 + i) for i in range(50)]
    entities = rng.sample(sorted({a + b for a in firsts for b in seconds}), n_train + 2 * n_eval)
    category = {e: ("疾病", "症状")[i % 2] for i, e in enumerate(entities)}
    tag = {"疾病": "Disease", "症状": "Symptom"}
    data = root / "kbert"
    (data / "medical_ner").mkdir(parents=True)
    (data / "kgs").mkdir()
    splits = {"train": entities[:n_train], "dev": entities[n_train:-n_eval], "test": entities[-n_eval:]}
    for split, names in splits.items():
        rows = ["text_a\tlabel"]
        for e in names:
            left, right = rng.choices(filler, k=rng.randint(3, 8)), rng.choices(filler, k=rng.randint(2, 5))
            kind = tag[category[e]]
            tags = ["O"] * len(left) + [f"B-{kind}", f"I-{kind}"] + ["O"] * len(right)
            rows.append(" ".join(left + list(e) + right) + "\t" + " ".join(tags))
        (data / "medical_ner" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    kg = "".join(f"{e}\t类别\t{category[e]}\n" for e in entities)
    (data / "kgs" / "Medical.spo").write_text(kg, encoding="utf-8")
    return data


def run_recipe(*args, **env):
    proc = subprocess.run(
        ["bash", "examples/kbert/run.sh", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **RECIPE_ENV, **env},
    )
    assert proc.returncode == 0, f"failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def scores_of(run, split):
    name = os.path.basename(run)
    return json.loads((run / f"{split}.scores.json").read_text())[f"{name}/{split}"]


def check_results_table_row(run, key):
    table = subprocess.run(
        [sys.executable, "scripts/results_table.py", "--row", f"K-BERT={run}", "--col", f"dev=valid:{key}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert table.returncode == 0 and "| K-BERT |" in table.stdout and " - |" not in table.stdout, table.stdout


def test_tagging_recipe_reaches_the_score_only_the_kg_allows(tmp_path):
    data, out = kg_tagging_layout(tmp_path), tmp_path / "out"
    proc = run_recipe("medical_ner", data, out, **KG_TAGGING_ENV)
    run = out / "runs" / "kbert"
    assert "K-BERT encoder from" in (run / "train.log").read_text()  # started from the MLM
    for split, gold_tsv in (("valid", "dev.tsv"), ("test", "test.tsv")):
        scores = scores_of(run, split)
        assert scores["typed_f1"] > 90, scores
        preds = (run / f"{split}.pred").read_text().splitlines()
        gold = (data / "medical_ner" / gold_tsv).read_text(encoding="utf-8").splitlines()[1:]
        assert [len(p.split()) for p in preds] == [len(g.split("\t")[0].split()) for g in gold]  # a tag per character
        floor = json.loads((out / "floors" / "dictionary" / f"{split}.scores.json").read_text())[f"dictionary/{split}"]
        assert 0 <= floor["typed_f1"] <= 100
    assert "== stage 5" in proc.stdout
    check_results_table_row(run, "typed_f1")
    # the ablations and the control KG (objects shuffled: the types are lost) run from stage 3 on the same folder
    run_recipe(
        "medical_ner",
        data,
        out,
        STAGE="3",
        STOP_STAGE="4",
        NAME="control-novm",
        KG="control",
        ARCH_ARGS="--no-visible-matrix --no-soft-positions",
        PRETRAINED="none",
        **KG_TAGGING_ENV,
    )
    log = (out / "runs" / "control-novm" / "train.log").read_text()
    assert "kg/control.spo" in log and "'no_visible_matrix': True" not in log  # (argparse namespace)
    assert "no_visible_matrix=True" in log and "no_soft_positions=True" in log
    assert scores_of(out / "runs" / "control-novm", "valid")["typed_f1"] < 60


def test_classification_recipe_end_to_end(tmp_path):
    data, out = raw_layout(tmp_path, "book_review"), tmp_path / "out"
    proc = run_recipe("book_review", data, out)
    run = out / "runs" / "kbert"
    assert "K-BERT encoder from" in (run / "train.log").read_text()  # started from the MLM
    gold = (data / "book_review" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    for split in ("valid", "test"):
        assert 0 <= scores_of(run, split)["accuracy"] <= 100
        assert 0 <= scores_of(out / "floors" / "tfidf", split)["accuracy"] <= 100
        assert len((run / f"{split}.pred").read_text().splitlines()) == len(gold)
    assert "== stage 5" in proc.stdout
    check_results_table_row(run, "accuracy")


def test_recipe_refuses_an_unknown_task(tmp_path):
    proc = subprocess.run(["bash", "examples/kbert/run.sh", "sst2", tmp_path], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "TASK must be book_review or medical_ner" in proc.stdout
