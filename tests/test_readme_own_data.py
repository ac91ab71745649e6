"""The README's "Each method on your own data" commands, as the README prints them, on a tiny folder of each
documented layout: every recipe command runs its data stage (``STOP_STAGE=1``, the one variable added:
training is what the other recipe tests cover), and the placeholder-encoding command runs whole. ``DATA``, ``OUT``,
``DIR``, ``RAW`` and ``TEXT`` become folders made here, ``bart.large`` a stand-in BART folder; ``my_kg.spo`` stays
as printed (it is found in ``DIR``, as the README says). The commands that need a converted checkpoint
(``PRETRAINED=bert-zh-fairseq``, ``LM_PATH=my_lm/``, ``convert.hf_bert``, ``ENCODER=minilm``) and the plain
``fairseq-train`` line (20,000 updates) are listed in ``NOT_RUN`` and checked elsewhere."""

import os
import random
import re
import shlex
import shutil
import subprocess

import pytest
from conftest import ROOT
from test_cocon_recipe import make_raw

SECTION = "## Each method on your own data"
NOT_RUN = ("PRETRAINED=bert-zh-fairseq", "LM_PATH=my_lm/", "convert.hf_bert", "fairseq-train BIN", "ENCODER=minilm")


def readme_commands():
    """The shell commands of the section's code blocks, continuation lines joined, comments dropped."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = re.sub(r"\s+#.*$", "", cmd).strip()
            if cmd:
                commands.append(" ".join(cmd.split()))
    return commands


def test_the_section_has_every_method():
    joined = "\n".join(readme_commands())
    for recipe in ("commongen", "eki", "webnlg", "kbert", "cocon"):
        assert f"examples/{recipe}/run.sh" in joined
    assert "prep.placeholders encode" in joined


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """DATA (commongen/, webnlg/, kbert/, wikitext-2/), DIR (a K-BERT TSV task and my_kg.spo), RAW (text),
    a stand-in bart.large."""
    root = tmp_path_factory.mktemp("user")
    data = root / "DATA"
    make_raw(data)
    # CoCon's stage 1 holds back 600 sentences and 1,000 lines of running text: more WikiText articles
    with open(data / "wikitext-2" / "valid.txt", "a") as f:
        words = "the dog cat ball park river boat field runs jumps swims plays sits near with under".split()
        for k in range(200):
            f.write(f" = Article {k + 100} = \n \n")
            for _ in range(12):
                sents = [" ".join(random.Random(k * 100 + _).sample(words, 10)) + " ." for _ in range(4)]
                f.write(" " + " ".join(sents) + " \n")
            f.write(" \n")
    shutil.copytree(data / "webnlg" / "train", data / "webnlg" / "dev")
    rng = random.Random(3)
    chars = "头痛发热咳嗽感冒胃炎肝病药物治疗医生"
    kg = "".join(f"{a}{b}\t类别\t症状\n" for a, b in zip(chars[::2], chars[1::2]))

    def tagging_tsv(n):
        rows = ["text_a\tlabel"]
        for _ in range(n):
            s = [rng.choice(chars) for _ in range(8)]
            rows.append(" ".join(s) + "\t" + " ".join("B-DIS" if i == 0 else "O" for i in range(8)))
        return "\n".join(rows) + "\n"

    for task_dir in (data / "kbert" / "medical_ner", root / "DIR"):
        task_dir.mkdir(parents=True)
        (task_dir / "train.tsv").write_text(tagging_tsv(12))
        (task_dir / "dev.tsv").write_text(tagging_tsv(4))
    (data / "kbert" / "kgs").mkdir()
    (data / "kbert" / "kgs" / "Medical.spo").write_text(kg)
    (root / "DIR" / "my_kg.spo").write_text(kg)
    cls = root / "DIR-cls"
    cls.mkdir()
    (cls / "my_kg.spo").write_text(kg)
    for split, n in (("train", 12), ("dev", 4)):
        rows = ["label\ttext_a"] + [f"{rng.randint(0, 1)}\t{''.join(rng.sample(chars, 6))}" for _ in range(n)]
        (cls / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (root / "RAW").mkdir()
    for split, n in (("train", 20), ("valid", 4)):
        src = [" ".join(rng.sample(["alan", "bean", "flew", "to", "the", "moon", "in", "1969"], 5)) for _ in range(n)]
        (root / "RAW" / f"{split}.src").write_text("\n".join(src) + "\n")
        (root / "RAW" / f"{split}.tgt").write_text("\n".join(s.upper().lower() for s in src) + "\n")
    bart = root / "bart.large"
    bart.mkdir()
    for f in ("model.pt", "dict.txt", "encoder.json", "vocab.bpe"):
        (bart / f).write_text("")  # stage 1 checks that they are there; it reads none
    return root


def runnable():
    return [c for c in readme_commands() if not any(x in c for x in NOT_RUN)]


@pytest.mark.parametrize("printed", runnable())
def test_readme_command_runs_as_printed(printed, user_files, tmp_path):
    root = user_files
    subs = {"DATA": root / "DATA", "OUT": tmp_path / "OUT", "DIR": root / "DIR", "RAW": root / "RAW",
            "TEXT": tmp_path / "TEXT", "bart.large": root / "bart.large"}  # fmt: skip
    if "my_cls" in printed:  # the classification task's own folder (the README calls both DIR)
        subs["DIR"] = root / "DIR-cls"
    command = re.sub(r"(?<![\w./-])(DATA|OUT|DIR|RAW|TEXT|bart\.large)(?![\w-])", lambda m: str(subs[m.group(1)]),
                     printed)  # fmt: skip
    command = command.replace("[CORPUS.txt]", "")  # optional argument
    words = shlex.split(command)
    env = dict(os.environ, STOP_STAGE="1", OMP_NUM_THREADS="1")
    while words and re.match(r"^[A-Z_]+=", words[0]):  # the command's own variables
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    if words[0] == "python":
        words[0] = os.path.join(ROOT, ".venv", "bin", "python")
    proc = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{printed}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr
