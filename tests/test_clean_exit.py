"""No abort at a clean exit (fairseq_knowgen.compat.clean_exit): fairseq's prefetch thread, caught inside a
torch operation when Python shuts down, made a finished training end with ``terminate called without
an active exception`` (SIGABRT)."""

import random
import subprocess
import sys

from conftest import ROOT, run_cli

# a prefetch thread that is inside a torch matmul (no GIL) nearly all the time, as fairseq's is while
# it collates the next batches, when the program ends right after the first batch
RACE = """
import sys, torch
from fairseq.data.iterators import BufferedIterator
if sys.argv[1] == "without":
    import atexit, fairseq_knowgen.compat.clean_exit as c
    atexit.unregister(c.stop_prefetch_threads)
else:
    import fairseq_knowgen  # noqa: F401  (as --user-dir does)

class Slow:
    def __len__(self):
        return 1000

    def __iter__(self):
        for _ in range(1000):
            a = torch.randn(300, 300)
            for _ in range(20):
                a = a @ a.T / 300
            yield a

it = BufferedIterator(2, Slow())
next(it)
print("done", flush=True)
"""


def _race(mode):
    return subprocess.run(
        [sys.executable, "-c", RACE, mode], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )


def test_prefetch_thread_inside_torch_at_exit():
    """Without the exit handler the process aborts after its last line (the cause, shown on purpose);
    with the package imported it exits 0."""
    without = _race("without")
    assert without.returncode == -6 and "terminate called without an active exception" in without.stderr
    assert without.stdout == "done\n"
    with_package = _race("with")
    assert with_package.returncode == 0, with_package.stderr[-2000:]
    assert with_package.stdout == "done\n" and "terminate called" not in with_package.stderr


def test_short_trainings_exit_0(tmp_path):
    """A one-update masked LM with fairseq's prefetch thread on (the default --data-buffer-size 10),
    five times: every run ends with exit status 0 after 'done training'."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    for split, n in (("train", 300), ("valid", 20)):
        lines = (" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(n))
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    run_cli(
        "fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "train.txt", "--validpref",
        tmp_path / "valid.txt", "--destdir", tmp_path / "bin", "--workers", "1",
    )
    for i in range(5):
        out = run_cli(
            "fairseq-train", tmp_path / "bin", "--user-dir", "fairseq_knowgen", "--task", "masked_lm",
            "--arch", "roberta_base", "--encoder-layers", "1", "--encoder-embed-dim", "16",
            "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--max-positions", "64",
            "--tokens-per-sample", "64", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4",
            "--max-update", "1", "--no-save", "--save-dir", tmp_path / f"ck{i}", "--cpu", "--disable-validation",
            "--data-buffer-size", "10", check=False,
        )
        log = out.stdout + out.stderr
        assert out.returncode == 0 and "done training" in log and "terminate called" not in log, (i, log[-2000:])
