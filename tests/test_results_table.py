"""scripts/results_table.py: cells are mean ± sample std over seeds, missing runs print '-'."""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "results_table.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def write_scores(run_dir, split, **metrics):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, f"{split}.scores.json"), "w") as f:
        json.dump({"name": metrics}, f)


def test_seeds_give_mean_and_sample_std_and_missing_runs_a_dash(tmp_path):
    write_scores(tmp_path / "s1", "valid", bleu4=10.0)
    write_scores(tmp_path / "s2", "valid", bleu4=13.0)
    write_scores(tmp_path / "s1", "valid.cons", bleu4=5.0)
    out = run(
        "--row", f"two seeds={tmp_path / 's1'},{tmp_path / 's2'}",
        "--row", f"one={tmp_path / 's1'}",
        "--col", "BLEU=valid:bleu4", "--col", "constrained=valid.cons:bleu4", "--col", "held-out=heldout:bleu4",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = out.stdout.strip().splitlines()
    assert rows[0] == "| system | BLEU | constrained | held-out |"
    # mean 11.5; sample std of (10, 13) = sqrt(((1.5)^2 + (1.5)^2) / 1) = 2.1213
    assert rows[2] == "| two seeds | 11.50 ± 2.12 | 5.00 | - |"
    assert rows[3] == "| one | 10.00 | 5.00 | - |"


def test_broken_score_file_names_file_and_line_exit_2(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "valid.scores.json").write_text('{"name":\n {"bleu4": }}\n')
    out = run("--row", f"r={tmp_path / 'r'}", "--col", "BLEU=valid:bleu4")
    assert out.returncode == 2
    assert f"{tmp_path / 'r' / 'valid.scores.json'}:2: not JSON" in out.stderr
