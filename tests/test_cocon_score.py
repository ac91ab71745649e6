"""scripts/cocon_score.py table: one row per run and system; two score files with one run name
(a copied run folder) are refused instead of one silently hiding the other."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cocon_score.py"


def scores(path, name, coverage):
    res = {"n": 2, "coverage": coverage, "dist1": 1.0, "dist2": 2.0, "dist3": 3.0}
    path.write_text(json.dumps({"name": name, "results": {"cg/tau0": res, "cg/lm": dict(res, coverage=0.5)}}))
    return path


def table(tmp_path, *files):
    out = tmp_path / "table.md"
    run = subprocess.run(
        [sys.executable, SCRIPT, "table", "--scores", *files, "--out-md", out], capture_output=True, text=True
    )
    return run, out


def test_each_run_gets_its_rows(tmp_path):
    run, out = table(tmp_path, scores(tmp_path / "a.json", "cocon", 11.0), scores(tmp_path / "b.json", "long", 22.0))
    assert run.returncode == 0, run.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in out.read_text().splitlines()[4:7]}
    assert rows == {"lm": "0.50", "cocon/tau0": "11.00", "long/tau0": "22.00"}


def test_two_files_with_one_run_name_are_refused(tmp_path):
    first, copy = scores(tmp_path / "a.json", "cocon", 11.0), scores(tmp_path / "b.json", "cocon", 22.0)
    run, out = table(tmp_path, first, copy)
    assert run.returncode == 2
    assert f"error: {copy}:" in run.stderr and f"is also the name in {first}" in run.stderr
    assert not out.exists()
