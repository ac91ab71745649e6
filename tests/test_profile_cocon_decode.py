"""``dev/profile_cocon_decode.py`` (the measurement behind docs/benchmarks.md's CoCon decoding
paragraph) still runs on the package's current benchmark helpers: at a tiny size it prints one
timing line per round with both models' times and their ratio, and an op table for each model."""

import re

from conftest import run_cli


def test_profile_prints_rounds_and_both_op_tables():
    out = run_cli(
        "dev/profile_cocon_decode.py",
        *("--layers", 2, "--embed-dim", 32, "--heads", 2, "--rounds", 2, "--ops", 3, "--sentences", 4, "--gen-len", 5),
        timeout=300,
    ).stdout
    rounds = re.findall(r"^round (\d): lm ([\d.]+) s, cocon ([\d.]+) s, ratio ([\d.]+)$", out, flags=re.M)
    assert [r[0] for r in rounds] == ["0", "1"], out
    for _, lm, cocon, ratio in rounds:
        assert float(lm) > 0 and float(cocon) > 0
        assert abs(float(ratio) - float(lm) / float(cocon)) < 0.01
    for name in ("lm", "cocon"):
        table = out.split(f"== {name}: ops by self CPU time (ms, calls)\n")[1].splitlines()[:3]
        assert all(re.match(r"^\S.*\s[\d.]+\s+\d+$", row) for row in table), table


def test_profile_shapes_splits_ops_by_input_shape():
    """``--shapes``: the rows end with the input shapes, and one op appears in several rows (without the flag each op
    is one row; this fails if the flag stops reaching torch's ``group_by_input_shape``)."""
    out = run_cli(
        "dev/profile_cocon_decode.py",
        *("--layers", 2, "--embed-dim", 32, "--heads", 2, "--rounds", 1, "--ops", 40, "--sentences", 4, "--gen-len", 5),
        "--shapes",
        timeout=300,
    ).stdout
    table = out.split("== cocon: ops by self CPU time (ms, calls, input shapes)\n")[1].splitlines()
    assert all(re.match(r"^\S.*\s[\d.]+\s+\d+ \[.*\]$", row) for row in table), table
    keys = [row.split()[0] for row in table]
    assert len(set(keys)) < len(keys), table
