"""Every prep step writes the same files whatever Python's hash seed: a set's iteration order
follows ``PYTHONHASHSEED``, so a vocabulary or dictionary whose order came from a set (or from
ties broken by one) differed between two runs of the same command, and with it the embedding
rows and the model (the demo printed different scores at the same ``--seed``).

The steps run in subprocesses under different ``PYTHONHASHSEED`` values on tiny inputs that the
test writes: the demo data -> ``placeholders encode`` (the dictionary of the demo's copy model,
where ``<S>`` and ``<O>`` tie), WebNLG with entity placeholders -> ``placeholders encode``,
CommonGen, and K-BERT with a KG and its control KG."""

import os
import random
import subprocess
import sys

from conftest import ROOT
from test_recipes import webnlg_entries, webnlg_xml
from test_recipes_commongen import commongen_split

PREP = """
import sys
from fairseq_knowgen import demo_data
from fairseq_knowgen.prep import commongen, kbert, placeholders, webnlg

data, out = sys.argv[1], sys.argv[2]
demo_data.main(["--out", f"{out}/demo", "--train", "300", "--valid", "20", "--test", "20", "--disjoint-names"])
placeholders.main(["encode", "--train-prefix", f"{out}/demo/train", "--out-dir", f"{out}/demo_ph",
                   "--splits", f"{out}/demo/train", f"{out}/demo/test", "--min-count", "2",
                   "--min-source-df", "50", "--max-positions", "40"])
webnlg.main(["--data", f"{data}/webnlg", "--out", f"{out}/webnlg", "--heldout-categories", "",
             "--entity-placeholders"])
placeholders.main(["encode", "--train-prefix", f"{out}/webnlg/train", "--out-dir", f"{out}/webnlg_ph",
                   "--splits", f"{out}/webnlg/train", f"{out}/webnlg/valid", "--min-count", "2",
                   "--max-positions", "20"])
commongen.main(["--data", f"{data}/commongen", "--out", f"{out}/commongen"])
task = kbert.make_synthetic_task(f"{data}/kbert", 40, 10, tagging=True)
kbert.main(["--data", task, "--kg", f"{task}/kg.spo", "--out", f"{out}/kbert", "--tagging"])
"""


def _inputs(tmp_path):
    data = tmp_path / "in"
    (data / "commongen").mkdir(parents=True)
    rng = random.Random(3)
    commongen_split(rng, data / "commongen", "train", 30)
    commongen_split(rng, data / "commongen", "dev", 5)
    folder = data / "webnlg"
    for split, n in (("train", 30), ("dev", 6)):
        (folder / split / "1triples").mkdir(parents=True)
        (folder / split / "1triples" / "Artist.xml").write_text(webnlg_xml(webnlg_entries(rng, "Artist", n)))
    (data / "kbert").mkdir()
    (data / "kbert" / "dev.tsv").symlink_to("valid.tsv")  # prep.kbert reads dev.tsv
    return data


def _files(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            path = os.path.join(d, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out


def test_prep_steps_write_the_same_files_under_any_hash_seed(tmp_path):
    data = _inputs(tmp_path)
    written = {}
    for seed in ("1", "2", "3"):
        out = tmp_path / f"out{seed}"
        env = dict(os.environ, PYTHONHASHSEED=seed, OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [sys.executable, "-c", PREP, str(data), str(out)], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        written[seed] = _files(out)
    assert "demo_ph/dict.txt" in written["1"] and "kbert/data/dict.txt" in written["1"]
    assert len(written["1"]) > 30
    for seed in ("2", "3"):
        assert written[seed].keys() == written["1"].keys()
        differ = sorted(k for k in written["1"] if written[seed][k] != written["1"][k])
        assert differ == [], f"PYTHONHASHSEED={seed} and 1 write different {differ}"
