"""scripts/test.sh: one pytest-xdist worker per core the process may run on, plus one, also where OMP_NUM_THREADS is
set (GNU nproc reads it as a core count, and test.sh itself sets it to 1)."""

import os
import re
import subprocess

from conftest import ROOT


def test_runs_one_worker_per_core_plus_one():
    out = subprocess.run(
        ["bash", "scripts/test.sh", "tests/test_setup_env.py", "-k", "installed_checkout"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    workers = len(os.sched_getaffinity(0)) + 1
    assert re.search(rf"created: {workers}/{workers} workers", out.stdout), out.stdout[-2000:]
