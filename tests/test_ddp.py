"""fairseq's distributed data parallel with 2 CPU processes (gloo), one rank each."""

import os
import socket
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TINY_MODEL, TRAIN_COMMON


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
}


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_two_ranks_end_identical(request, name, tmp_path):
    data, arch_args = ARCHS[name]
    data_dir = request.getfixturevalue(data)
    port = free_port()
    procs = []
    for rank in range(2):
        cmd = [
            sys.executable,
            "tests/ddp_worker.py",
            str(tmp_path / f"rank{rank}.pt"),
            str(data_dir),
            *TRAIN_COMMON,
            *arch_args,
            *TINY_MODEL,
            "--max-update",
            "5",
            "--max-tokens",
            "400",
            "--save-dir",
            str(tmp_path / "ckpt"),
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
            "--ddp-backend",
            "legacy_ddp",
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=dict(os.environ, OMP_NUM_THREADS="1"),
            )
        )
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["num_updates"] == r1["num_updates"] == 5
    assert len(r0["losses"]) == 5 and r0["losses"] == r1["losses"]
    for k in r0["params"]:
        torch.testing.assert_close(r0["params"][k], r1["params"][k], atol=0, rtol=0)
    assert "distributed init (rank 0)" in logs[0]
    assert "distributed init (rank 1)" in logs[1]
