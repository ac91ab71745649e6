"""fairseq's distributed data parallel with 2 CPU processes (gloo), one rank each.

Every rank runs in a session (process group) of its own, and the whole group is killed when a
test ends, passes, fails or times out, so that no rank (or its data-loader worker) outlives it.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, TINY_MODEL, TRAIN_COMMON


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid):
    """Live (non-zombie) processes of process group PGID, from /proc."""
    members = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after the ")"
                state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue
        if int(pgrp) == pgid and state != "Z":
            members.append(int(pid))
    return members


class TwoRanks:
    """Ranks 0 and 1 of a 2-process gloo job, each ``tests/ddp_worker.py`` in a new session.

    ``env`` holds extra environment variables for each rank (see ddp_worker.py for the faults it
    can simulate). ``ddp_backend``: fairseq's ``--ddp-backend``; None leaves fairseq's default,
    torch's DistributedDataParallel (``c10d`` / ``pytorch_ddp``). Logs go to files (a full pipe could block a rank that nobody reads); leaving
    the ``with`` block kills both process groups, whatever happened inside it."""

    def __init__(self, tmp_path, args, env=({}, {}), ddp_backend="legacy_ddp"):
        port = free_port()
        # None: fairseq's default (c10d)
        backend = [] if ddp_backend is None else ["--ddp-backend", ddp_backend]
        self.tmp_path = tmp_path
        self.procs, self.ended = [], {}
        try:
            for rank in range(2):
                cmd = [
                    sys.executable,
                    "tests/ddp_worker.py",
                    str(tmp_path / f"rank{rank}.pt"),
                    *map(str, args),
                    "--distributed-world-size",
                    "2",
                    "--distributed-rank",
                    str(rank),
                    "--distributed-init-method",
                    f"tcp://127.0.0.1:{port}",
                    "--distributed-no-spawn",
                    "--device-id",
                    "0",
                    "--distributed-backend",
                    "gloo",
                    *backend,
                ]
                with open(tmp_path / f"rank{rank}.log", "w") as log:
                    self.procs.append(
                        subprocess.Popen(
                            cmd,
                            cwd=ROOT,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **env[rank]),
                        )
                    )
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait(self, ranks=(0, 1), timeout=300):
        """Wait until the given ranks have exited; record when each did (time.time())."""
        deadline = time.monotonic() + timeout
        while True:
            for r, p in enumerate(self.procs):
                if r not in self.ended and p.poll() is not None:
                    self.ended[r] = time.time()
            if all(r in self.ended for r in ranks):
                return
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"ranks {ranks}", timeout)
            time.sleep(0.2)

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    def returncode(self, rank):
        return self.procs[rank].returncode

    def log(self, rank):
        return (self.tmp_path / f"rank{rank}.log").read_text()

    def leftovers(self, grace=10.0):
        """Processes still alive in the ranks' groups after ``grace`` seconds (a killed process
        takes a moment to go, longer on a loaded machine)."""
        deadline = time.monotonic() + grace
        while True:
            alive = {p.pid: group_members(p.pid) for p in self.procs if group_members(p.pid)}
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)


ARCHS = {
    "dimattn": ("tiny_bin", ["--arch", "transformer_dimattn", "--dimattn-type", "dydim"]),
    "copy": (
        "tiny_bin",
        ["--arch", "copy_transformer", "--criterion", "force_copy", "--copy-supervision", "force-unk"],
    ),
    "eki": (
        "eki_bin",
        [
            "--task",
            "eki_generation",
            "--arch",
            "eki_transformer",
            "--eki-scaling-dim",
            "8",
            "--criterion",
            "eki_label_smoothed_cross_entropy",
        ],
    ),
    "eki_copy_dimattn": (
        "eki_bin",
        [
            "--task",
            "eki_generation",
            "--arch",
            "eki_transformer",
            "--eki-scaling-dim",
            "8",
            "--copy",
            "--dimattn-type",
            "dydim",
            "--criterion",
            "eki_force_copy",
        ],
    ),
}


def train_args(data_dir, arch_args, tmp_path, updates=5):
    return [
        data_dir,
        *TRAIN_COMMON,
        *arch_args,
        *TINY_MODEL,
        "--max-update",
        str(updates),
        "--max-tokens",
        "400",
        "--save-dir",
        tmp_path / "ckpt",
    ]


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_two_ranks_end_identical(request, name, tmp_path):
    data, arch_args = ARCHS[name]
    with TwoRanks(tmp_path, train_args(request.getfixturevalue(data), arch_args, tmp_path)) as ranks:
        ranks.wait()
    for r in range(2):
        assert ranks.returncode(r) == 0, ranks.log(r)[-4000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["num_updates"] == r1["num_updates"] == 5
    assert len(r0["losses"]) == 5 and r0["losses"] == r1["losses"]
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), k
    assert "distributed init (rank 0)" in ranks.log(0)
    assert "distributed init (rank 1)" in ranks.log(1)
    assert not ranks.leftovers()


def test_dead_rank_stops_the_other(tiny_bin, tmp_path):
    """Rank 1 dies after update 2 (os._exit, as a crashed rank): rank 0, waiting in the next
    all-reduce, gets gloo's error from the closed connection and exits non-zero at once,
    without any timeout set."""
    args = train_args(tiny_bin, ARCHS["dimattn"][1], tmp_path, updates=20)
    with TwoRanks(tmp_path, args, env=({}, {"DDP_WORKER_EXIT_AFTER_UPDATE": "2"})) as ranks:
        ranks.wait(timeout=300)
    log0 = ranks.log(0)
    assert ranks.returncode(1) == 3 and "exiting after update 2 on purpose" in ranks.log(1)
    assert ranks.returncode(0) not in (0, None), log0[-4000:]
    assert re.search(r"gloo.*(Connection (reset|closed) by peer|Broken pipe)", log0), log0[-4000:]
    assert "num_updates=3" not in log0
    assert ranks.ended[0] - ranks.ended[1] < 60
    assert not ranks.leftovers()


def test_stuck_rank_times_out(tiny_bin, tmp_path):
    """Rank 1 stops (SIGSTOP) after update 2 with its sockets open. With a process-group timeout
    of 20 s (ddp_worker.py's DDP_WORKER_PG_TIMEOUT, on torch's default group and on fairseq's
    global group), rank 0 raises gloo's timeout error and exits non-zero within 60 s; the stopped
    rank is killed with its group when the test ends. (fairseq's --heartbeat-timeout alone does
    not end rank 0: its SIGINT is not handled while the main thread waits inside gloo.)"""
    args = train_args(tiny_bin, ARCHS["dimattn"][1], tmp_path, updates=20)
    env = ({"DDP_WORKER_PG_TIMEOUT": "20"}, {"DDP_WORKER_PG_TIMEOUT": "20", "DDP_WORKER_HANG_AFTER_UPDATE": "2"})
    with TwoRanks(tmp_path, args, env=env) as ranks:
        ranks.wait(ranks=(0,), timeout=300)
        assert ranks.procs[1].poll() is None  # still there, stopped
    log0, log1 = ranks.log(0), ranks.log(1)
    stopped_at = float(re.search(r"stopping after update 2 on purpose at ([0-9.]+)", log1).group(1))
    assert ranks.returncode(0) not in (0, None), log0[-4000:]
    assert "Timed out waiting 20000ms" in log0, log0[-4000:]
    assert ranks.ended[0] - stopped_at < 60
    assert ranks.returncode(1) == -signal.SIGKILL
    assert not ranks.leftovers()


def test_timeout_kills_every_rank(tiny_bin, tmp_path):
    """When the test's own wait times out, both ranks (and anything they started) are killed."""
    args = train_args(tiny_bin, ARCHS["dimattn"][1], tmp_path)
    ranks = TwoRanks(tmp_path, args)
    with pytest.raises(subprocess.TimeoutExpired):
        with ranks:
            ranks.wait(timeout=2)
    assert [ranks.returncode(r) for r in range(2)] == [-signal.SIGKILL, -signal.SIGKILL]
    assert not ranks.leftovers()
