"""scripts/cocon_score.py: the table (one row per run and system; two score files with one run name, a copied run
folder, are refused instead of one silently hiding the other), content coverage, and judge perplexity conditioned
on the prompt (fixed-length outputs: no final </s>) against a hand computation."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

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


def tiny_judge(tmp_path, words):
    """An untrained 1-layer transformer_lm over ``words`` (dict.txt beside it), as scripts/cocon_score.py loads one."""
    from helpers import write_binarized

    from fairseq_knowgen.prep.cocon import save_untrained_lm

    write_binarized(tmp_path / "judge_data", {}, words=words)
    (tmp_path / "judge").mkdir()
    return save_untrained_lm(str(tmp_path / "judge_data"), str(tmp_path / "judge" / "lm.pt"), layers=1, dim=8, heads=2)


def hand_nll(judge, outputs, prompts, final_eos):
    """Each output alone: </s>, its prompt, its tokens (and </s>); the log-probabilities of its own tokens only."""
    import torch

    d = judge.dict
    total, count = 0.0, 0
    for out, pre in zip(outputs, prompts):
        p = [d.index(w) for w in pre.split()]
        o = [d.index(w) for w in out.split()] + ([d.eos()] if final_eos else [])
        seq = [d.eos()] + p + o
        with torch.no_grad():
            lp = torch.log_softmax(judge.model(torch.tensor([seq[:-1]]))[0][0].double(), dim=-1)
        for i, tok in enumerate(o):
            total -= float(lp[len(p) + i, tok])  # position len(p) + i predicts seq[len(p) + i + 1] = o[i]
            count += 1
    return total, count


def test_judge_perplexity_is_conditioned_on_the_prompt(tmp_path):
    """Judge.nll: each output scored after </s> and its prompt, the prompt's tokens not scored, the final </s>
    scored unless the outputs have a fixed length; against a hand computation row by row (the judge batches
    rows of different lengths)."""
    cocon_score = load_script()
    words = "the cat sat on a mat dog ran in park".split()
    judge = cocon_score.Judge(tiny_judge(tmp_path, words))
    outputs, prompts = ["cat sat on a mat", "dog ran", "the park"], ["the", "in the park", ""]
    for final_eos in (True, False):
        total, count = judge.nll(outputs, prefixes=prompts, final_eos=final_eos)
        want, n = hand_nll(judge, outputs, prompts, final_eos)
        assert count == n == 9 + (3 if final_eos else 0)
        assert abs(total - want) < 1e-4 * abs(want)
    # without prompts: each output as its own sentence, </s> w_1 .. w_n </s>
    total, count = judge.nll(outputs)
    assert (total, count) == pytest.approx(hand_nll(judge, outputs, [""] * 3, True), rel=1e-4)
    assert judge.ppl(outputs, prompts, False) == pytest.approx(math.exp(want / n), rel=1e-4)


def test_scores_of_fixed_length_outputs_from_prompts(tmp_path):
    """``score --fixed-len``: every system's outputs lose their forced start (the prompt; the prompted LM's content
    and prompt) and are judged after the prompt of SET.src, without a final </s>; by hand."""
    cocon_score = load_script()
    words = "the cat sat on a mat dog ran in park red ball".split()
    judge_path = tiny_judge(tmp_path, words)
    inputs, gen = tmp_path / "inputs", tmp_path / "gen"
    inputs.mkdir()
    gen.mkdir()
    (inputs / "cg.src").write_text("cat <sep> mat <prompt> the\nball <sep> park <prompt> in the\n")
    (inputs / "cg.prompt.src").write_text("<prompt> cat mat the\n<prompt> ball park in the\n")
    (gen / "cg.tau0.out").write_text("H-0\t-1.0\tthe cat sat on\nH-1\t-1.0\tin the park ran a\n")
    (gen / "cg.lm-prompt.out").write_text("H-1\t-1.0\tball park in the red ball ran\nH-0\t-1.0\tcat mat the mat sat\n")
    out = tmp_path / "scores.json"
    cocon_score.main(["score", "--gen-dir", str(gen), "--inputs", str(inputs), "--judge", str(judge_path),
                      "--fixed-len", "3", "--json-out", str(out)])  # fmt: skip
    res = json.loads(out.read_text())["results"]
    judge = cocon_score.Judge(judge_path)
    for system, outputs in (("tau0", ["cat sat on", "park ran a"]), ("lm-prompt", ["mat sat", "red ball ran"])):
        total, n = hand_nll(judge, outputs, ["the", "in the"], final_eos=False)
        assert res[f"cg/{system}"]["judge_ppl"] == pytest.approx(math.exp(total / n), rel=1e-4), system
