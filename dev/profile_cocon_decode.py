#!/usr/bin/env python
"""Where CoCon's decoding time goes, against the same frozen LM decoding alone (``--cocon-mode lm``), in one
process: the two models built on ``scripts/benchmark.py``'s CoCon data (an untrained ``transformer_lm`` of
``--layers`` x ``--embed-dim``, the block after layer layers // 2), beam ``--beam``, ``--gen-len`` steps, one batch of
``--sentences`` inputs; LM and CoCon alternate ``--rounds`` times (time per decode: mean of 3 after one warm-up),
then torch's profiler on one more decode of each prints the ops with the most CPU time::

    OMP_NUM_THREADS=1 taskset -c 1 python dev/profile_cocon_decode.py            # 6 x 512, beam 5, 20 steps

Prints per round the two times and their ratio (LM / CoCon: 1.0 is parity; the structural bound is
L / (L + 1), one more layer per step), then the op tables (``--shapes``: one row per op and input shapes, which
tells the block's and the content encoder's matrix products from the LM's). A measurement tool for
docs/benchmarks.md, not a test.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from fairseq.dataclass.configs import GenerationConfig  # noqa: E402

from benchmarks import harness as benchmarking  # noqa: E402
from fairseq_knowgen.prep.cocon import make_benchmark_data  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embed-dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--gen-len", type=int, default=20)
    ap.add_argument("--sentences", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=12, help="rows of each profiler table (0: none)")
    ap.add_argument(
        "--shapes",
        action="store_true",
        help="one row per op and input shapes (torch's group_by_input_shape), shapes last",
    )
    opts = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory(prefix="knowgen-cocon-prof-")
    data, args = make_benchmark_data(tmp.name, 300, 32, (opts.layers, opts.embed_dim, opts.heads))
    sides = {}
    for name, baseline in (("lm", True), ("cocon", False)):
        prof = benchmarking.baseline_profile("cocon_lm") if baseline else benchmarking.profile("cocon_lm")
        task, model, _ = benchmarking.build(prof, data, args["baseline" if baseline else "arch"])
        gen = task.build_generator(
            [model.eval()], GenerationConfig(beam=opts.beam, min_len=opts.gen_len, max_len_a=0, max_len_b=opts.gen_len)
        )
        itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=opts.sentences).next_epoch_itr(shuffle=False)
        sides[name] = (task, model, gen, next(iter(itr)))

    def decode(name):
        task, model, gen, batch = sides[name]
        with torch.no_grad():
            task.inference_step(gen, [model], batch)

    for r in range(opts.rounds):
        times = {}
        for name in ("lm", "cocon"):
            decode(name)  # warm-up
            t0 = time.perf_counter()
            for _ in range(3):
                decode(name)
            times[name] = (time.perf_counter() - t0) / 3
        lm, cocon = times["lm"], times["cocon"]
        print(f"round {r}: lm {lm:.6f} s, cocon {cocon:.6f} s, ratio {lm / cocon:.3f}")
    for name in ("lm", "cocon") if opts.ops else ():
        with torch.profiler.profile(record_shapes=opts.shapes) as p:
            decode(name)
        print(f"== {name}: ops by self CPU time (ms, calls{', input shapes' if opts.shapes else ''})")
        ops = sorted(p.key_averages(group_by_input_shape=opts.shapes), key=lambda e: -e.self_cpu_time_total)
        for e in ops[: opts.ops]:
            shapes = " " + str(e.input_shapes).replace(" ", "") if opts.shapes else ""
            print(f"{e.key:40s} {e.self_cpu_time_total / 1000:9.1f} {e.count:6d}{shapes}")


if __name__ == "__main__":
    main()
