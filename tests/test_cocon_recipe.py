"""examples/cocon/run.sh end to end on tiny raw data in the original formats (wikitext-2, CommonGen,
WebNLG XML): the base LM, the judge LM and CoCon train, fairseq-generate decodes, the tables and
the plot are written; and the same from a pretrained LM (a converted tiny GPT-2, LM_PATH) with its
own dictionary and GPT-2 BPE."""

import json
import math
import os
import random
import re
import string
import subprocess

from conftest import BIN, ROOT

WORDS = "dog cat ball park run jump play throw catch field river boat sit swim red green big small".split()


# the openings prep.cocon's prompts start with: in the corpus too, so that the tiny BPE knows their pieces
OPENINGS = ["the", "in the morning ,", "yesterday ,", "there is", "in this picture ,", "last weekend ,", "it was",
            "my friend", "at the park ,", "when we arrived ,"]  # fmt: skip


def make_raw(root, seed=0):
    """Raw data in the original formats. CoCon trains on 30-token windows of running text: WikiText articles
    of long paragraphs and WebNLG texts of 30+ words give them (in train and valid alike); CommonGen's
    references are short documents."""
    rng = random.Random(seed)

    def sent(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def paragraph():
        parts = [(rng.choice(OPENINGS), sent(rng.randint(10, 14)), sent(rng.randint(8, 12))) for _ in range(2)]
        return " ".join(f"{a} {b} , {c} ." for a, b, c in parts)

    (root / "wikitext-2").mkdir(parents=True)
    lines = [" "]
    for k in range(8):
        lines += [f" = Article {k} = ", " "] + [f" {paragraph()} " for _ in range(8)] + [" "]
    (root / "wikitext-2" / "valid.txt").write_text("\n".join(lines) + "\n")
    (root / "commongen").mkdir()
    for split, n in (("train", 12), ("dev", 8)):
        src, tgt = [], []
        for _ in range(n):
            cs = rng.sample(WORDS, 3)
            for _ in range(2):
                src.append(" ".join(cs))
                tgt.append(f"The {cs[0]} and the {cs[1]} {cs[2]} in the {rng.choice(WORDS)}.")
        (root / "commongen" / f"commongen.{split}.src_alpha.txt").write_text("\n".join(src) + "\n")
        (root / "commongen" / f"commongen.{split}.tgt.txt").write_text("\n".join(tgt) + "\n")
    (root / "webnlg" / "train" / "1triples").mkdir(parents=True)
    entries = []
    for i in range(20):
        a, b = rng.sample(WORDS, 2)
        entries.append(
            f'<entry category="Animal" eid="Id{i + 1}" size="1"><modifiedtripleset><mtriple>{a.title()} | likes | '
            f'{b.title()}</mtriple></modifiedtripleset><lex comment="good" lid="Id1"><text>{a.title()} likes {b} '
            f"a lot and plays with the {rng.choice(WORDS)} in the park every day , {sent(20)} .</text></lex></entry>"
        )
    (root / "webnlg" / "train" / "1triples" / "Animal.xml").write_text(
        '<?xml version="1.0" ?>\n<benchmark><entries>\n' + "\n".join(entries) + "\n</entries></benchmark>\n"
    )


RECIPE_ENV = dict(
    OMP_NUM_THREADS="1",
    BPE_OPS="50",
    HELDOUT="20",
    VALID="20",
    LM_LAYERS="2",
    LM_DIM="16",
    LM_HEADS="2",
    LM_MAX_UPDATE="3",
    COCON_MAX_UPDATE="3",
    CYCLE_START="1",
    ADV_START="1",
    CG_LEN="6",
    HT_LEN="6",
    FIXED_LEN="5",
    TAUS="5",
    SETS="cg ht5",
    MAX_TOKENS="1000",
    COCON_BATCH="8",
)


def run_recipe(data, out, **env):
    """examples/cocon/run.sh DATA OUT with RECIPE_ENV and ``env``; fails the test when it fails."""
    proc = subprocess.run(
        ["bash", "examples/cocon/run.sh", data, out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,  # minutes on an idle core; far longer on a core shared with trainings
        env={**os.environ, **RECIPE_ENV, **env},  # env wins over RECIPE_ENV
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def hypotheses(path):
    """The H- lines of fairseq-generate output in input order."""
    hyps = {}
    for line in path.read_text().splitlines():
        if line.startswith("H-"):
            idx, _, text = line[2:].split("\t")
            hyps[int(idx)] = text
    return [hyps[i] for i in sorted(hyps)]


def distinct1(texts):
    """Distinct unigrams / unigrams in percent over lower-cased word and punctuation tokens (hand count)."""
    toks = [t for x in texts for t in re.findall(r"\w+|[^\w\s]", x.lower())]
    return 100.0 * len(set(toks)) / len(toks)


def check_scores(table):
    """Every score a finite number in its range."""
    for rows in table.values():
        for row in rows.values():
            for k, v in row.items():
                assert isinstance(v, (int, float)) and math.isfinite(v), (k, v)
                if k == "judge_ppl":
                    assert v > 1
                elif k not in ("n", "len"):
                    assert 0 <= v <= 100, (k, v)


def check_fixed_length(out, run, n, sets=("cg", "ht5")):
    """Every system decoded every input from its prompt for exactly n tokens: an output is the input's prompt (the
    prompted LM's: the content, then the prompt; as the dictionary reads it) and n tokens after it."""
    from fairseq.data import Dictionary

    d = Dictionary.load(str(out / "bin" / "gen" / "dict.txt"))
    for name in sets:
        for system, src in (("lm", f"{name}.src"), ("lm-prompt", f"{name}.prompt.src"), ("tau5", f"{name}.src")):
            sources = (out / "bin" / "gen" / src).read_text().splitlines()
            hyps = hypotheses(run / "gen" / f"{name}.{system}.out")
            assert len(hyps) == len(sources) > 0, (name, system)
            for source, hyp in zip(sources, hyps):
                prompt = [d[i] for i in d.encode_line(source.split("<prompt>")[1], add_if_not_exist=False,
                                                      append_eos=False)]  # fmt: skip
                assert prompt and hyp.split()[: len(prompt)] == prompt, (name, system, source, hyp)
                assert len(hyp.split()) == len(prompt) + n, (name, system, source, hyp)


def after_prompts(out, run, name="cg", system="tau5"):
    """The outputs without their prompts (what the scores read)."""
    sources = (out / "bin" / "gen" / f"{name}.src").read_text().splitlines()
    hyps = hypotheses(run / "gen" / f"{name}.{system}.out")
    return [" ".join(h.split()[len(src.split("<prompt>")[1].split()) :]) for h, src in zip(hyps, sources)]


def test_recipe_end_to_end(tmp_path):
    make_raw(tmp_path / "data")
    out, plot = tmp_path / "out", tmp_path / "plot.png"
    run_recipe(tmp_path / "data", out, PLOT=str(plot))
    run = out / "runs" / "cocon"
    # CoCon trained with every loss on (cycle and adversarial from update 1 on)
    log = (run / "train.log").read_text()
    assert "loss_cycle" in log and "loss_adv" in log and "loss_disc" in log
    n_sets = len((out / "raw" / "commongen" / "valid.concepts").read_text().splitlines())
    for system in ("lm", "lm-prompt", "tau5"):
        hyps = [x for x in (run / "gen" / f"cg.{system}.out").read_text().splitlines() if x.startswith("H-")]
        assert len(hyps) == n_sets, system
    scores = json.loads((out / "table.json").read_text())
    assert set(scores["commongen"]) == {"lm", "lm-prompt", "cocon/tau5", "references"}
    assert {"coverage", "judge_ppl", "dist1", "dist2", "rep3_outputs"} <= set(scores["commongen"]["cocon/tau5"])
    assert {"bleu_content", "judge_ppl", "dist3"} <= set(scores["heldout"]["ht5 cocon/tau5"])
    assert plot.stat().st_size > 0
    # every system from the same prompts for FIXED_LEN tokens (as the authors decode)
    check_fixed_length(out, run, 5)
    assert "<prompt>" in (out / "bin" / "gen" / "cg.src").read_text()
    # the prompted LM's hypotheses start with the prompt: scoring removed it
    assert "| lm-prompt |" in (out / "table.md").read_text()
    check_scores(scores)
    hyps = [re.sub(r"@@( |$)", "", h) for h in after_prompts(out, run)]
    assert abs(scores["commongen"]["cocon/tau5"]["dist1"] - distinct1(hyps)) < 1e-6


def test_recipe_from_converted_gpt2(tmp_path):
    """LM_PATH: a tiny GPT-2 converted by ``python -m fairseq_knowgen.convert.hf_gpt2``, with its GPT-2
    BPE files: no BPE learned, no dictionary built, no LM trained; CoCon trains inside it, decodes,
    and the outputs are scored as text."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    from test_convert_gpt2 import WORDS as GPT2_WORDS
    from test_convert_gpt2 import save_tiny_gpt2

    make_raw(tmp_path / "data")
    chars = string.ascii_letters + string.digits + string.punctuation
    # half the words one token each, the rest spelled out: scoring BPE ids instead of text would miscount
    words = GPT2_WORDS + WORDS[: len(WORDS) // 2] + "likes lot plays with every day heading".split()
    save_tiny_gpt2(tmp_path / "hf", words=words, chars=chars, n_positions=64)
    lm = tmp_path / "gpt2"
    conv = subprocess.run(
        [f"{BIN}/python", "-m", "fairseq_knowgen.convert.hf_gpt2", tmp_path / "hf", lm],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert conv.returncode == 0, conv.stderr[-3000:]
    out = tmp_path / "out"
    # the CommonGen set only (the held-out sets decode the same way: test_recipe_end_to_end)
    run_recipe(tmp_path / "data", out, LM_PATH=str(lm), TOKENS_PER_SAMPLE="64", PLOT=str(tmp_path / "plot.png"),
               SETS="cg")  # fmt: skip
    # the LM's own dictionary and BPE: nothing learned, no LM trained
    assert (out / "bin" / "lm" / "dict.txt").read_text() == (lm / "dict.txt").read_text()
    assert (out / "runs" / "judge" / "checkpoints" / "dict.txt").read_text() == (lm / "dict.txt").read_text()
    assert not (out / "bpe" / "codes").exists() and not (out / "runs" / "lm").exists()
    bpe = get_encoder(str(lm / "encoder.json"), str(lm / "vocab.bpe"))
    first = (out / "bpe" / "valid.txt").read_text().splitlines()[0]
    assert bpe.decode([int(t) for t in first.split()]).split()[0] == (out / "raw" / "valid.txt").read_text().split()[0]
    # CoCon inside the converted GPT-2 decodes every concept set; the scores read the decoded text
    run = out / "runs" / "cocon"
    n_sets = len((out / "raw" / "commongen" / "valid.concepts").read_text().splitlines())
    # (a sampled output may hold <unk>: the LM's extra rows have probability <= 1/V, not 0)
    check_fixed_length(out, run, 5, sets=("cg",))
    hyps = [bpe.decode([int(t) if t.isdigit() else t for t in h.split()]) for h in after_prompts(out, run)]
    assert len(hyps) == n_sets
    scores = json.loads((out / "table.json").read_text())
    check_scores(scores)
    assert abs(scores["commongen"]["cocon/tau5"]["dist1"] - distinct1(hyps)) < 1e-6
