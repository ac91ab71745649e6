"""The constrained-decoding commands of README.md and docs/decoding.md, run as printed on a tiny model.

Each fenced bash block of those files that holds ``--constraints`` is cut into its commands (lines joined at a
trailing backslash, comments dropped). The placeholders ``BIN``, ``TEXT`` and ``CKPT`` become a tiny WebNLG-like
data set with whole-entity placeholders (``<S> <ent-0> <P> birth place <O> <ent-1> ...`` -> ``<ent-0> was born in
<ent-1> . <ent-0> works as <ent-2> .``), its text, and a 2-layer transformer trained on it for 30 updates with
``--task translation``; each command then runs in bash from the repository root, as a user would run it. Checked:

- ``fairseq-generate ... --constraints unordered --constraints-from SUFFIX``: every constraint of line i of
  ``BIN/SPLIT.SUFFIX`` is in every hypothesis of input i, and every input has one;
- ``fairseq-interactive ... --constraints``: fairseq echoes each input's constraints (``C-i``), and each is in the
  hypothesis of input i;
- ``--at-most-once REGEX``: no hypothesis holds a symbol matching REGEX twice, while the same command without the
  rule gives one that does (so the rule, not the model, keeps them apart);
- both files show both tools with ``--constraints``; docs/decoding.md also ``--at-most-once``.
"""

import os
import random
import re
import shlex
import subprocess

import pytest
from conftest import BIN, ROOT, TINY_MODEL, TRAIN_COMMON, preprocess, run_cli
from test_interactive import in_process

DOCS = ["README.md", "docs/decoding.md"]
PREDICATES = [  # (predicate, template of the sentence, object placeholder)
    ("birth place", "<ent-0> was born in {} .", "<ent-1>"),
    ("occupation", "<ent-0> works as {} .", "<ent-2>"),
    ("club", "<ent-0> plays for {} .", "<ent-3>"),
]


def doc_commands(name):
    """The commands of the fenced bash blocks of NAME that hold --constraints, one string each."""
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
    commands = []
    for block in blocks:
        if "--constraints" not in block:
            continue
        for line in re.sub(r"\\\n", " ", block).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(line.strip())
    return commands


def write_split(folder, split, n, rng):
    src, tgt = [], []
    for _ in range(n):
        triples = rng.sample(PREDICATES, rng.randint(1, 3))
        src.append(" ".join(f"<S> <ent-0> <P> {p} <O> {o}" for p, _, o in triples))
        tgt.append(" ".join(t.format(o) for _, t, o in triples))
    (folder / f"{split}.src").write_text("".join(x + "\n" for x in src))
    (folder / f"{split}.tgt").write_text("".join(x + "\n" for x in tgt))


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory):
    """``{"BIN": ..., "TEXT": ..., "CKPT": ...}``: tiny data with entity placeholders and a model trained on it;
    ``BIN/valid.cons`` written as the README says (``prep.constraints entities``)."""
    rng = random.Random(1)
    text = tmp_path_factory.mktemp("text")
    for split, n in (("train", 300), ("valid", 20)):
        write_split(text, split, n, rng)
    data = tmp_path_factory.mktemp("bin")
    preprocess(text, data, "train", "valid")
    save = tmp_path_factory.mktemp("ckpt")
    in_process(
        "train", data, *TRAIN_COMMON, "--arch", "transformer", *TINY_MODEL, "--max-update", "30", "--save-dir", save
    )
    run_cli("-m", "fairseq_knowgen.prep.constraints", "entities", "--src", text / "valid.src", "--out", data / "valid.cons")
    return {"BIN": str(data), "TEXT": str(text), "CKPT": str(save / "checkpoint_last.pt")}


def run(command):
    """COMMAND in bash from the repository root, the package's environment first on PATH; its standard output."""
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    proc = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; {command}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{command}\nfailed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc.stdout


def lines_by_id(output, kind):
    """``{id: [text, ...]}`` of the KIND- lines (``H``: the hypothesis text; ``C``: the constraint)."""
    out = {}
    for line in output.splitlines():
        if line.startswith(f"{kind}-"):
            fields = line.split("\t")
            out.setdefault(int(fields[0][2:]), []).append(fields[-1])
    return out


def contains(hyp, constraint):
    h, c = hyp.split(), constraint.split()
    return any(h[j : j + len(c)] == c for j in range(len(h) - len(c) + 1))


def flag(words, name):
    return words[words.index(name) + 1] if name in words else None


def repeats(hyps, regex):
    """The hypotheses that hold a symbol matching REGEX (as a whole) more than once."""
    out = []
    for texts in hyps.values():
        for h in texts:
            matching = [w for w in h.split() if re.fullmatch(regex, w)]
            if len(matching) > len(set(matching)):
                out.append(h)
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_constrained_decoding_commands_run_as_printed(doc, placeholders):
    commands = doc_commands(doc)
    tools = {"generate": [], "interactive": []}
    for printed in commands:
        command = re.sub(r"\b(BIN|TEXT|CKPT)\b", lambda m: placeholders[m.group(1)], printed)
        out = run(command)
        words = shlex.split(command.split("|")[-1])
        tool = next((t for t in tools if f"fairseq-{t}" in words), None)
        if tool is None:
            continue
        tools[tool].append(printed)
        hyps = lines_by_id(out, "H")
        if tool == "generate":
            split = flag(words, "--gen-subset")
            n = len(open(os.path.join(placeholders["TEXT"], f"{split}.src")).read().splitlines())
            assert sorted(hyps) == list(range(n)), printed  # every input decoded
            suffix = flag(words, "--constraints-from")
            if suffix:
                with open(os.path.join(placeholders["BIN"], f"{split}.{suffix}")) as f:
                    wanted = {i: line.rstrip("\n").split("\t") for i, line in enumerate(f)}
                assert any(wanted.values())
            else:
                wanted = {}
        else:
            wanted = lines_by_id(out, "C")
            assert hyps and wanted, f"{printed}: no hypothesis or no constraint echoed"
        for i, constraints in wanted.items():
            for h in hyps[i]:
                assert all(contains(h, c) for c in constraints if c), (printed, i, h, constraints)
        regex = flag(words, "--at-most-once")
        if regex:
            assert not repeats(hyps, regex), printed
            free = command.replace(f"--at-most-once {shlex.quote(regex)}", "")
            assert free != command
            assert repeats(lines_by_id(run(free), "H"), regex), "the model repeats no such symbol: the rule is untested"
    with_constraints = {t: [c for c in cs if "--constraints " in c] for t, cs in tools.items()}
    assert with_constraints["generate"] and with_constraints["interactive"], (doc, commands)
    if doc == "docs/decoding.md":
        assert any("--at-most-once" in c for cs in tools.values() for c in cs), commands
