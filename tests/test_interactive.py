"""``fairseq-interactive`` on raw text equals ``fairseq-generate`` on the binarized text.

One tiny model per architecture (EKI: ``tests/test_eki.py``), trained in-process and decoded by
both tools with the same checkpoint and beam: the hypotheses, their scores and the sources the
model saw must agree. The copy models read raw text through the placeholder pipe of
``fairseq_knowgen.prep.placeholders`` (``encode-source | fairseq-interactive | restore``), run
here exactly as documented, and every ``<unk-N>`` they copy must come back as source word N.
"""

import contextlib
import importlib
import io
import re
import subprocess
import sys
from unittest import mock

import pytest
import torch
from conftest import BIN, ROOT, TINY_BART, TINY_MODEL, TRAIN_COMMON

from fairseq_knowgen.prep import placeholders

ARCHS = {
    "transformer_dimattn": [*TINY_MODEL],
    "bart_dimattn_base": [*TINY_BART],
    "copy_transformer": [*TINY_MODEL, "--criterion", "force_copy"],
    "copy_transformer_small": [*TINY_MODEL, "--criterion", "force_copy"],
}
DECODE = [
    "--user-dir",
    "fairseq_knowgen",
    "--cpu",
    "--beam",
    "3",
    "--batch-size",
    "8",
    "--max-len-a",
    "0",
    "--max-len-b",
    "20",
]
PLACEHOLDER = re.compile(r"^<unk-(\d+)>$")


def in_process(tool, *args, stdin=""):
    """Run ``fairseq-TOOL ARGS`` in this process (``fairseq_cli.TOOL.cli_main``); its standard output."""
    module = importlib.import_module(f"fairseq_cli.{tool}")
    out = io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(sys, "argv", [f"fairseq-{tool}", *map(str, args)]))
        stack.enter_context(mock.patch.object(sys, "stdin", io.StringIO(stdin)))
        stack.enter_context(contextlib.redirect_stdout(out))
        module.cli_main()
    return out.getvalue()


def by_id(output, kind):
    """``{id: fields}`` of the KIND- lines (``S``, ``H``, ``D``) of fairseq-generate/-interactive output."""
    lines = [line.split("\t") for line in output.splitlines() if line.startswith(f"{kind}-")]
    out = {int(fields[0].split("-", 1)[1]): fields[1:] for fields in lines}
    assert len(out) == len(lines), f"more than one {kind}- line for an id"
    return out


def assert_same_hypotheses(generated, interactive, n):
    hyp_gen, hyp_int = by_id(generated, "H"), by_id(interactive, "H")
    assert sorted(hyp_gen) == sorted(hyp_int) == list(range(n))
    assert [hyp_int[i][1] for i in range(n)] == [hyp_gen[i][1] for i in range(n)]
    assert [float(hyp_int[i][0]) for i in range(n)] == pytest.approx([float(hyp_gen[i][0]) for i in range(n)], abs=1e-4)
    # the model saw the same source tokens (for copy: encode-source == encode's source side)
    assert by_id(interactive, "S") == by_id(generated, "S")


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    """``arch -> (data dir, checkpoint)``, trained on first use (20 updates, in-process)."""
    cache = {}

    def get(arch):
        if arch not in cache:
            if arch.startswith("copy"):
                data = request.getfixturevalue("word_level_bin") / "bin"
            else:
                data = request.getfixturevalue("tiny_bin")
            save = tmp_path_factory.mktemp(arch)
            in_process(
                "train", data, *TRAIN_COMMON, "--arch", arch, *ARCHS[arch], "--max-update", "20", "--save-dir", save
            )
            cache[arch] = data, save / "checkpoint_last.pt"
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_interactive_equals_generate(arch, trained, tiny_raw):
    """Raw test lines through fairseq-interactive (copy models: after ``encode-source``) give
    fairseq-generate's hypotheses and scores on the binarized test split."""
    data, checkpoint = trained(arch)
    raw = (tiny_raw / "test.src").read_text()
    if arch.startswith("copy"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            placeholders.main(
                ["encode-source", "--dict", str(data / "dict.src.txt"), "--input", str(tiny_raw / "test.src")]
            )
        raw = out.getvalue()
        assert re.search(r"<unk-\d+>", raw)
    n = len(raw.splitlines())
    generated = in_process(
        "generate", data, *DECODE, "--path", checkpoint, "--gen-subset", "test", "--required-batch-size-multiple", "1"
    )
    interactive = in_process("interactive", data, *DECODE, "--path", checkpoint, "--buffer-size", "16", stdin=raw)
    assert_same_hypotheses(generated, interactive, n)


def test_copy_pipe_restores_source_words(trained, tiny_raw, word_level_bin, tmp_path):  # noqa: F811
    """The documented pipe, as a shell pipe: its raw fairseq-interactive output equals
    fairseq-generate's, and in the restored H- and D- lines each copied ``<unk-N>`` is word N of
    that line's raw source (a word outside the vocabulary, first seen at N); nothing else changes."""
    data, trained_checkpoint = trained("copy_transformer_small")
    # the soft switch pinned to copying (p_gen = sigmoid(-30)), as in test_force_copy: the
    # outputs are source tokens, so the placeholders of the sources are copied
    ck = torch.load(trained_checkpoint)
    ck["model"]["decoder.copy_generator.switch.weight"].zero_()
    ck["model"]["decoder.copy_generator.switch.bias"].fill_(-30.0)
    checkpoint = tmp_path / "copy_only.pt"
    torch.save(ck, checkpoint)
    py = sys.executable
    pipe = (
        f"set -euo pipefail; {py} -m fairseq_knowgen.prep.placeholders encode-source --dict {data}/dict.src.txt"
        f" < {tiny_raw}/test.src"
        f" | {BIN}/fairseq-interactive {data} {' '.join(DECODE)} --path {checkpoint} --buffer-size 16"
        f" | tee {tmp_path}/interactive.out"
        f" | {py} -m fairseq_knowgen.prep.placeholders restore --src {tiny_raw}/test.src > {tmp_path}/restored.out"
    )
    proc = subprocess.run(["bash", "-c", pipe], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    interactive = (tmp_path / "interactive.out").read_text()
    restored = (tmp_path / "restored.out").read_text()
    src = [line.split() for line in (tiny_raw / "test.src").read_text().splitlines()]
    generated = in_process(
        "generate", data, *DECODE, "--path", checkpoint, "--gen-subset", "test", "--required-batch-size-multiple", "1"
    )
    assert_same_hypotheses(generated, interactive, len(src))

    vocab = {line.split()[0] for line in (word_level_bin / "text" / "dict.txt").read_text().splitlines()}
    copied = 0
    for kind in "HD":
        before, after = by_id(interactive, kind), by_id(restored, kind)
        assert sorted(before) == sorted(after) == list(range(len(src)))
        for i in range(len(src)):
            assert after[i][0] == before[i][0]  # the score
            tokens, words = before[i][1].split(), after[i][1].split()
            assert len(words) == len(tokens)
            for token, word in zip(tokens, words):
                m = PLACEHOLDER.match(token)
                if m is None:
                    assert word == token
                    continue
                pos = int(m.group(1))
                assert word == src[i][pos] and word not in vocab and word not in src[i][:pos]
                copied += 1
    assert copied > 0, "no placeholder was copied: the test checks nothing"
    # every other line (source, scores, logs) passes through unchanged
    assert [line for line in restored.splitlines() if line[:2] not in ("H-", "D-")] == [
        line for line in interactive.splitlines() if line[:2] not in ("H-", "D-")
    ]


DICT = "the 9\nsat 5\non 4\n<unk-0> 0\n<unk-1> 0\n<unk-2> 0\n"  # K = 3 placeholders


def test_pipe_steps_hand_computed(tmp_path, monkeypatch, capsys):
    """Both pipe steps on standard input and output: a repeated word keeps the placeholder of its
    first position, a word first seen at position >= K becomes <unk>, and restoring leaves
    placeholders beyond the source alone."""
    (tmp_path / "dict.txt").write_text(DICT)
    (tmp_path / "raw.src").write_text("Zorblat sat on Quux Zorblat\n")
    monkeypatch.chdir(tmp_path)
    steps = [
        (["encode-source", "--dict", "dict.txt"], "Zorblat sat on Quux Zorblat\n", "<unk-0> sat on <unk> <unk-0>\n"),
        (
            ["restore", "--src", "raw.src"],
            "S-0\t<unk-0> sat\nH-0\t-0.5\t<unk-0> sat <unk-3> <unk-9>\nD-0\t-0.5\t<unk-4>\n",
            "S-0\t<unk-0> sat\nH-0\t-0.5\tZorblat sat Quux <unk-9>\nD-0\t-0.5\tZorblat\n",
        ),
    ]
    for argv, stdin, expected in steps:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        placeholders.main(argv)
        assert capsys.readouterr().out == expected


@pytest.mark.parametrize(
    "cmd, files, message",
    [
        (["encode-source", "--dict", "d.txt"], {"d.txt": "the 9\non 4\n"}, "d.txt: no <unk-N> placeholders"),
        (["encode-source", "--dict", "d.txt"], {"d.txt": "the 9\nsat\n<unk-0> 0\n"}, "d.txt:2: expected 'WORD COUNT'"),
        (
            ["encode-source", "--dict", "d.txt"],
            {"d.txt": "<unk-0> 0\n<unk-2> 0\n"},
            "d.txt: placeholders must be <unk-0>..<unk-1>, but <unk-1> is missing",
        ),
        (
            ["restore", "--gen", "g.out", "--src", "s.txt"],
            {"g.out": "S-0\ta\nH-0\t-1\ta\nH-1\t-1\tb\n", "s.txt": "a\n"},
            "g.out:3: hypothesis id 1 but s.txt has 1 lines",
        ),
        (
            ["restore", "--gen", "g.out", "--src", "s.txt"],
            {"g.out": "H-x\t-1\ta\n", "s.txt": "a\n"},
            "g.out:1: expected a hypothesis id after 'H-'",
        ),
    ],
)
def test_bad_input_names_file_and_line(cmd, files, message, tmp_path, monkeypatch, capsys):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["placeholders", *cmd, *(["--out", "out.txt"])])
    with pytest.raises(SystemExit) as e:
        placeholders.cli_entry(placeholders.main)
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
    assert not (tmp_path / "out.txt").exists()
