"""scripts/gpu_wheels.sh --dry-run: every wheel gpu_check.sh needs on the GPU machine (Python 3.12, no fairseq,
no network) is found on the registry for CPython 3.12 / manylinux x86_64 (or pure Python), with its size, and
together they fit the limit of what travels there; nothing is downloaded. Reads the registry's JSON API."""

import subprocess
import urllib.request

import pytest
from conftest import ROOT

NEEDED = ["fairseq-fixed==0.12.3.1", "numpy==1.26.4", "hydra-core==1.3.2", "omegaconf==2.3.0",
          "antlr4-python3-runtime==4.9.3", "bitarray=="]  # fmt: skip


def registry_reachable():
    try:
        urllib.request.urlopen("https://pypi.org/pypi/bitarray/json", timeout=30).close()
        return True
    except OSError:
        return False


def test_dry_run_lists_cp312_wheels_and_their_total(tmp_path):
    if not registry_reachable():
        pytest.skip("the package registry (pypi.org) is not reachable from here")
    proc = subprocess.run(["bash", "scripts/gpu_wheels.sh", "--dry-run", tmp_path / "whl"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = proc.stdout.splitlines()
    for spec in NEEDED:
        row = next((r for r in rows if r.startswith(spec)), None)
        assert row is not None, (spec, proc.stdout)
        assert "MiB" in row and ("cp312-cp312-manylinux" in row or "py3-none-any" in row or "from source" in row)
    assert "fairseq_fixed-0.12.3.1-cp312-cp312-manylinux" in proc.stdout
    total = float(rows[-1].split()[1])
    assert rows[-1].startswith("total") and 30 < total <= 48, rows[-1]
    assert not (tmp_path / "whl").exists()  # nothing downloaded


def test_a_stray_option_is_refused():
    proc = subprocess.run(["bash", "scripts/gpu_wheels.sh", "--dryrun"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr
