"""The CoCon toy probe: the self/null validation gap (nats per token) of the block under several
configurations, on the set-up of ``tests/test_cocon_learning.py`` (random-word sentences over 40
types, a frozen untrained 2-layer 32-wide transformer_lm, L_self and L_null only, no content
mask, Adam 3e-3, 16 sentences a step).

    python dev/cocon_toy_probe.py [STEPS] ["[(content_kv, init, split, zero_init, jitter, prev_key), ...]"] \
        [measured|defaults]

``init`` is ``--cocon-content-kv-init`` (fresh or copy). ``measured`` (default) runs every configuration
with the settings the table of docs/methods/cocon.md's "Toy probe" section was measured with (the test's
``MEASURED``: sentence lines, Xavier, no attention dropout, the block's states at every position);
``defaults`` with the package's current defaults (30-token windows of the same lines, attention dropout
0.1, the LM's own states before the prefix's last token, ...).

Prints one Markdown row per configuration: L_self, L_null, the gap, seconds. A measurement tool
for docs/methods/cocon.md, not a test.
"""

import ast
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.chdir(ROOT)

import test_cocon_learning as setup  # noqa: E402  (the test's data and training loop)

DEFAULT = [
    (kv, init, split, zero, jitter, prev_key)
    for prev_key in ("1", "0")
    for kv, init, split, zero, jitter in [
        ("separate", "fresh", "fixed", "0", 2),
        ("separate", "copy", "fixed", "0", 2),
        ("shared", "fresh", "fixed", "0", 2),
        ("separate", "fresh", "uniform", "0", 2),
        ("separate", "fresh", "fixed", "1", 2),
        ("separate", "fresh", "fixed", "0", 0),
    ]
]


class TmpDirs:
    """A stand-in for pytest's tmp_path_factory."""

    def mktemp(self, name):
        return pathlib.Path(tempfile.mkdtemp(prefix=name))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    configs = ast.literal_eval(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else DEFAULT
    settings = sys.argv[3] if len(sys.argv) > 3 else "measured"
    if settings not in ("measured", "defaults"):
        sys.exit(f"error: settings {settings!r}: measured or defaults")
    base = setup.MEASURED if settings == "measured" else ()
    data = setup.random_words.__wrapped__(TmpDirs())
    print(f"settings: {settings} {' '.join(base)}")
    print("| content K/V | init | split | zero start | jitter J | prev key | L_self | L_null | gap | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kv, init, split, zero, jitter, prev_key in configs:
        t0 = time.time()
        extra = (*base, "--cocon-content-kv-init", init, "--cocon-zero-init", zero)
        extra += ("--cocon-content-prev-key", prev_key)
        s, n = setup.self_null_gap(data, kv, steps, *extra, split=split, jitter=jitter)
        row = f"| {kv} | {init} | {split} | {zero} | {jitter} | {prev_key} | {s:.3f} | {n:.3f} | {n - s:.3f}"
        print(f"{row} | {time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
