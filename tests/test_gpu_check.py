"""scripts/gpu_check.sh: without CUDA it says so and exits 2; its CPU dry run (the same runs with --cpu and
2 updates each) goes through every registered architecture and mode to the table."""

import os
import re
import subprocess

from conftest import ROOT

from benchmarks.profiles import BASELINE


def gpu_check(*args, env=None, timeout=60):
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", *map(str, args)],
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_without_cuda_it_says_so_and_exits_2(tmp_path):
    out = gpu_check(tmp_path, env={"CUDA_VISIBLE_DEVICES": ""})  # no device visible, also on a GPU machine
    assert out.returncode == 2, out.stderr[-2000:]
    assert "no CUDA device" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_trains_and_decodes_every_registered_arch_in_every_mode(tmp_path):
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_knowgen  # noqa: F401

    ours = sorted(a for a, cls in ARCH_MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_knowgen."))
    # the tiny model size keeps the CPU run short; everything else is the CUDA path with --cpu and 2 updates
    out = gpu_check("--cpu-dry-run", tmp_path, env={"DIM": "16", "HEADS": "2", "LAYERS": "1"}, timeout=1800)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    rows = [line.split(" | ") for line in out.stdout.splitlines() if " | " in line]
    header, body = rows[0], [[c.strip() for c in r] for r in rows[1:]]
    assert header[0].strip() == "arch" and len(body) == 3 * (len(ours) + 1)
    assert {(r[0], r[1]) for r in body} == {(a, m) for a in [BASELINE, *ours] for m in ("fp16", "bf16", "amp")}
    for arch, mode, finite, ratio, peak, decode, secs, status in body:
        assert status == "ok" and finite == "yes", (arch, mode, status)
        assert decode == "n/a" or re.fullmatch(r"\d+ ok", decode) and int(decode.split()[0]) > 0, (arch, decode)
        assert peak == "-"  # no CUDA memory on CPU
    assert re.search(r"CPU dry run; \d+ runs; elapsed \d+s", out.stdout)
    assert all((tmp_path / "runs" / f"{a}.fp16" / "train.log").exists() for a in ours)
