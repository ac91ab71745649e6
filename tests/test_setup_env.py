"""scripts/setup_env.sh: refuses an old Python with a clear message, and waits for a set-up
already running in the same checkout instead of racing it on .venv."""

import os
import shutil
import subprocess
import time

from conftest import ROOT


def checkout_copy(tmp_path):
    """The files setup_env.sh reads, in a fresh folder without .venv."""
    (tmp_path / "scripts").mkdir()
    for f in ("scripts/setup_env.sh", "requirements.txt", "setup.py"):
        shutil.copy(os.path.join(ROOT, f), tmp_path / f)
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python 3.9.18'; exit 0; fi\nexit 1\n")
    fake.chmod(0o755)
    return fake


def test_old_python_is_refused_naming_the_version(tmp_path):
    fake = checkout_copy(tmp_path)
    out = subprocess.run(
        ["bash", "scripts/setup_env.sh"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHON=str(fake)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "needs Python 3.10 or newer; found: Python 3.9.18" in out.stderr
    assert not (tmp_path / ".venv").exists()


def test_second_setup_waits_for_the_first(tmp_path):
    fake = checkout_copy(tmp_path)
    lock = open(tmp_path / ".setup.lock", "w")
    holder = subprocess.Popen(["flock", str(tmp_path / ".setup.lock"), "sleep", "3"])
    try:
        time.sleep(0.5)
        t0 = time.time()
        out = subprocess.run(
            ["bash", "scripts/setup_env.sh"],
            cwd=tmp_path,
            env=dict(os.environ, PYTHON=str(fake)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        waited = time.time() - t0
    finally:
        holder.wait(timeout=30)
        lock.close()
    assert "another set-up is running" in out.stderr
    assert waited >= 2.0  # it ran only after the holder released the lock
    assert out.returncode == 2  # then went on (and met the old Python)


def test_an_installed_checkout_is_recognised_without_installing():
    """In this checkout (set up by scripts/test.sh) the script finds everything installed and installs nothing: the
    recipes and demo.sh call it at every run. (Its check reads the installed distributions' metadata: fairseq-fixed
    at its version owns the `fairseq` import name; it does not import fairseq.)"""
    out = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "[setup]" not in out.stderr, out.stderr[-2000:]
