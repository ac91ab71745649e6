"""examples/cocon/run.sh end to end on tiny raw data in the original formats (wikitext-2, CommonGen,
WebNLG XML): the base LM, the judge LM and CoCon train, fairseq-generate decodes, the tables and
the plot are written."""

import json
import os
import random
import subprocess

from conftest import ROOT

WORDS = "dog cat ball park run jump play throw catch field river boat sit swim red green big small".split()


def make_raw(root, seed=0):
    rng = random.Random(seed)

    def sent(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    (root / "wikitext-2").mkdir(parents=True)
    lines = [" ", " = Heading = ", " "]
    lines += [" " + " . ".join(sent(rng.randint(22, 30)) for _ in range(2)) + " . " for _ in range(60)]
    (root / "wikitext-2" / "valid.txt").write_text("\n".join(lines) + "\n")
    (root / "commongen").mkdir()
    for split, n in (("train", 120), ("dev", 8)):
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
            f"a lot and plays with the {rng.choice(WORDS)} in the park every day .</text></lex></entry>"
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
    COCON_LAYER="1",
    COCON_MAX_UPDATE="3",
    CYCLE_START="1",
    ADV_START="1",
    CG_LEN="6",
    HT_LEN="6",
    TAUS="5",
    SETS="cg ht5",
    MAX_TOKENS="1000",
    COCON_MAX_TOKENS="1000",
)


def test_recipe_end_to_end(tmp_path):
    make_raw(tmp_path / "data")
    out, plot = tmp_path / "out", tmp_path / "plot.png"
    proc = subprocess.run(
        ["bash", "examples/cocon/run.sh", tmp_path / "data", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, **RECIPE_ENV, PLOT=str(plot)),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
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
    # the prompted LM's hypotheses start with the prompt: scoring removed it
    assert "| lm-prompt |" in (out / "table.md").read_text()
