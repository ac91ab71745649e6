"""scripts/cocon_score.py table: one row per run and system; two score files with one run name
(a copied run folder) are refused instead of one silently hiding the other."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cocon_score.py"


def load_script():
    """scripts/cocon_score.py as a module, without putting scripts/ on sys.path for every later test."""
    spec = importlib.util.spec_from_file_location("cocon_score", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_content_coverage_counts_the_contents_words_the_output_uses(tmp_path):
    """Held-back-text sets: content coverage = mean over inputs of the share of the content's words
    (distinct, less stop words and punctuation) whose lemma the output has. Hand-computed:
    content 1 "the dogs chased a red ball ." -> {dogs, chased, red, ball}; the output has "dog" (lemma of
    "dogs") and "ball": 2/4. Content 2 "an old house , an old tree" -> {old, house, tree}; output: none: 0/3.
    Mean 25.0. The prompt fairseq forced ("the") is removed before scoring."""
    cocon_score = load_script()
    gen = tmp_path / "ht5.tau0.out"
    gen.write_text("H-0\t-1.0\ta dog played with the ball\nH-1\t-1.0\tthe sun is bright\n")
    src = tmp_path / "ht5.src"
    src.write_text("the dogs chased a red ball .\n<prompt> the\n")
    contents = ["the dogs chased a red ball .", "an old house , an old tree"]
    assert cocon_score.content_words(contents[1]) == ["old", "house", "tree"]
    res = cocon_score.score_file(str(gen), str(src), judge=None, contents=contents)
    assert res["content_coverage"] == 25.0


def test_a_content_file_with_the_wrong_line_count_is_named(tmp_path):
    """One content per held-back-text input: a content file one line short is refused (exit 2, naming it)
    before anything is scored, and no score file is written."""
    (tmp_path / "ht5.tau0.out").write_text("H-0\t-1.0\ta dog\nH-1\t-1.0\ta cat\n")
    (tmp_path / "ht5.src").write_text("x\ny\n")
    content = tmp_path / "ht5.content"
    content.write_text("the dogs chased a red ball .\n")
    out = tmp_path / "scores.json"
    run = subprocess.run(
        [sys.executable, SCRIPT, "score", "--gen-dir", tmp_path, "--inputs", tmp_path, "--json-out", out],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2, run.stderr
    assert f"error: {content}: 1 contents for 2 inputs in {tmp_path / 'ht5.src'}" in run.stderr
    assert not out.exists()
