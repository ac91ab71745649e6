"""examples/lib/stages.sh's guards against lost or half-written outputs (issue 40), run in bash with the file
sourced as the recipes source it: ``into`` replaces a file only when its command succeeded; ``same_lines`` stops
with exit 2 naming both parallel files; ``remove_stray_temps`` removes what a killed writer left (its PID gone)
and keeps a live writer's; a failing fairseq-generate (a stand-in that prints half an output, then fails) leaves
the earlier output of stage_generate byte-identical, and a good one replaces it."""

import os
import subprocess
import textwrap

from conftest import ROOT


def bash(tmp_path, script):
    prologue = f"""
        set -euo pipefail
        ROOT={ROOT}; OUT={tmp_path}/out; STAGE=1; STOP_STAGE=9
        mkdir -p "$OUT"
        . "$ROOT/examples/lib/stages.sh"
    """
    return subprocess.run(["bash", "-c", textwrap.dedent(prologue) + textwrap.dedent(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def stand_in(tmp_path, tool, script):
    """tmp_path/bin/TOOL: an executable bash script standing in for a fairseq command; returns tmp_path/bin."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / tool).write_text("#!/bin/bash\n" + script)
    (fake / tool).chmod(0o755)
    return fake


def temps(folder):
    return [n for _, dirs, names in os.walk(folder) for n in dirs + names if n.startswith(".tmp-")]


def test_into_replaces_only_on_success(tmp_path):
    proc = bash(tmp_path, """
        echo old > "$OUT/f.txt"
        half() { echo half; return 3; }
        into "$OUT/f.txt" half || echo "rc=$?"
        cat "$OUT/f.txt"
        into "$OUT/f.txt" echo new
        cat "$OUT/f.txt"
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rc=3", "old", "new"]
    assert not temps(tmp_path)


def test_same_lines_names_both_files(tmp_path):
    proc = bash(tmp_path, """
        printf 'a\\nb\\n' > "$OUT/x.src"; printf 'a\\n' > "$OUT/x.tgt"
        same_lines "$OUT/x.src" "$OUT/x.src"
        same_lines "$OUT/x.src" "$OUT/x.tgt"
        echo not reached
    """)
    assert proc.returncode == 2 and "not reached" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path}/out/x.tgt: 1 lines, but {tmp_path}/out/x.src has 2 (parallel files: one line each)"
    )


def test_strays_of_dead_writers_are_removed(tmp_path):
    out = tmp_path / "out" / "raw"
    out.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / f".tmp-{dead.pid}-train.src").write_text("half\n")
    (out / f".tmp-{dead.pid}-12345-bin").mkdir()
    live = out / f".tmp-{os.getpid()}-valid.src"
    live.write_text("being written\n")
    proc = bash(tmp_path, "true")
    assert proc.returncode == 0, proc.stderr
    assert temps(tmp_path) == [live.name]


def test_a_failed_decode_keeps_the_earlier_output(tmp_path):
    fake = stand_in(tmp_path, "fairseq-generate",
                    "printf 'H-0\\t-0.1\\thalf\\n'\n[ \"$FAIL\" = 1 ] && exit 1\nprintf 'H-1\\t-0.2\\tall\\n'\n")
    proc = bash(tmp_path, f"""
        BIN={fake}; RUN=$OUT/runs/x; DATA_BIN=$OUT/bin; BEAM=5; mkdir -p "$RUN/checkpoints"
        printf 'earlier output\\n' > "$RUN/valid.out"
        FAIL=1 stage_generate valid "$RUN/valid.out" || echo "failed as it should"
        cat "$RUN/valid.out"
        FAIL=0 stage_generate valid "$RUN/valid.out"
        cat "$RUN/valid.out"
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "failed as it should" in lines[1] and lines[2] == "earlier output"
    assert lines[3:] == ["H-0\t-0.1\thalf", "H-1\t-0.2\tall"]
    assert not temps(tmp_path)


def test_a_resumed_training_keeps_the_earlier_log(tmp_path):
    """train_logged appends to RUN/train.log: the first run's lines survive a rerun (a resume), each run after a
    header line of its own (a stand-in fairseq-train that writes one line and a checkpoint)."""
    fake = stand_in(tmp_path, "fairseq-train",
                    'echo "run $RUN_NO"\nmkdir -p "$4"; touch "$4/checkpoint_best.pt" "$4/checkpoint_last.pt"\n')
    proc = bash(tmp_path, f"""
        BIN={fake}
        RUN_NO=1 train_logged "$OUT/runs/x" data-bin
        RUN_NO=2 train_logged "$OUT/runs/x" data-bin
        cat "$OUT/runs/x/train.log"
    """)
    assert proc.returncode == 0, proc.stderr
    log = proc.stdout.splitlines()
    assert [x for x in log if x.startswith("run ")] == ["run 1", "run 2"]
    assert sum(x.startswith("== ") and "fairseq-train into" in x for x in log) == 2
