#!/usr/bin/env python
"""Train and decode ``--arch`` and fairseq's ``transformer`` of the same size (or ``--against``
another profiled arch), interleaved, and print one final JSON line of ratios (arch / baseline;
1.0 is parity, higher is faster)::

    python scripts/benchmark.py --arch transformer_dimattn            # ~4 minutes
    python scripts/benchmark.py --arch transformer_dimattn --quick    # < 60 s on 2 cores
    python scripts/benchmark.py --arch transformer_dimattn --data data-bin/webnlg
    python scripts/benchmark.py --arch copy_transformer_small --against transformer_pointer_generator --quick
    python scripts/benchmark.py --arch eki_transformer+copy+dimattn --quick   # vs eki_transformer
    python scripts/benchmark.py --arch eki_transformer+copy --quick --vocab 8000   # a real-size vocabulary

``--arch BASE+METHOD[+METHOD]`` measures a composed configuration (the methods switched on by
flags, see ``benchmarks/profiles.py``) against BASE, the same model with them off.

Synthetic data (the built-in triples-to-text set) unless ``--data`` names a binarized
fairseq data directory with ``train`` and ``valid`` splits, or a folder of real data sets in
``shared/data``'s layout (``commongen/``, ``webnlg/``): then the pairs of ``--real-set``'s dev
split, cycled to ``--n-train`` / ``--n-valid``, with its real lengths. One thread per process;
every worker runs pinned to one core (``--core``, default the first this process may use), the
two models alternating A B B A ...; the ratios are medians over rounds of the two runs of a
round, printed with their range.

At the sizes users run (``docs/benchmarks.md``)::

    python scripts/benchmark.py --size base --arch eki_transformer            # 6+6 x 512, 50k types, CommonGen
    python scripts/benchmark.py --size base --arch copy_transformer --against transformer_pointer_generator
    python scripts/benchmark.py --size base --arch all --device cuda          # every profile, one table
    python scripts/benchmark.py --growth copy                                 # time per step against length
    python scripts/benchmark.py --size base --arch transformer_dimattn --model-args "--dimattn-layers all" --memory
"""

import argparse
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks import harness as benchmarking  # noqa: E402


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    composed = "; ".join(benchmarking.describe(name) for name in benchmarking.COMPOSED)
    p.add_argument(
        "--arch",
        choices=sorted(benchmarking.PROFILES) + ["all"],
        help=f"profile to measure (its own baseline unless --against; 'all': every profile, one table row each); "
        f"composed configurations: {composed}",
    )
    p.add_argument(
        "--size",
        choices=sorted(benchmarking.SIZE_PRESETS),
        help="preset sizes: base = 6+6 layers, 512 wide, 8 heads, ffn 2048, a 50,000-type vocabulary, real-length "
        "inputs (--data's real sets, default ../shared/data when it exists) and --rounds 5",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the workers train and decode")
    p.add_argument("--core", type=int, help="the core every worker is pinned to (default: the first allowed)")
    p.add_argument(
        "--real-set",
        choices=benchmarking.REAL_SETS,
        default="commongen",
        help="with --data naming a folder of real data sets: whose lengths the inputs have",
    )
    p.add_argument(
        "--growth",
        choices=sorted(benchmarking.GROWTH),
        help="time per training step and per decoded sentence against the length that grows with METHOD "
        "(see docs/benchmarks.md) instead of a comparison",
    )
    p.add_argument(
        "--against",
        choices=sorted(benchmarking.PROFILES),
        help="measure against this profiled arch (same sizes, the arch's data) instead of the profile's baseline, "
        "e.g. --arch copy_transformer_small --against transformer_pointer_generator (fairseq's own copy model)",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="instead of timings: the bytes one training step keeps for backward, and parameters + gradients + "
        "Adam moments, of --arch and its baseline on the same batch (exact, in-process)",
    )
    p.add_argument("--quick", action="store_true", help="small workload: under a minute on 2 cores")
    p.add_argument("--data", help="binarized data directory (default: synthetic)")
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers (both models)")
    p.add_argument("--embed-dim", type=int, default=128, help="model width (ffn = 4x)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--model-args", default="", help="extra arguments for --arch only, one string")
    p.add_argument("--updates", type=int, default=60, help="timed training updates per round")
    p.add_argument("--gen-sents", type=int, default=200, help="sentences decoded per round")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--gen-len", type=int, default=20, help="output length every hypothesis decodes")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument(
        "--rounds", type=int, default=None, help="worker runs per model, interleaved ABBA (default 4; 2 with --quick)"
    )
    p.add_argument("--n-train", type=int, default=2000, help="synthetic training examples")
    p.add_argument("--n-valid", type=int, default=200, help="synthetic valid examples")
    p.add_argument(
        "--vocab",
        type=int,
        default=0,
        help="pad the synthetic data's dictionary to this many types (e.g. 8000, as CommonGen's BPE), so that "
        "costs growing with the vocabulary show; default: its own few hundred",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data-args", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    return p


def main():
    parser = get_parser()
    opts = parser.parse_args()
    if opts.arch is None and opts.growth is None:
        parser.error("one of --arch or --growth is needed")
    if opts.size:
        benchmarking.apply_size(opts, parser, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if opts.quick:
        opts.updates, opts.gen_sents, opts.n_train, opts.n_valid = 20, 256, 600, 256
    opts.rounds = opts.rounds or (2 if opts.quick else 4)
    opts.data_args = json.loads(opts.data_args)
    opts.real = None
    if opts.data and benchmarking.is_real_root(opts.data):
        opts.real, opts.data = (os.path.abspath(opts.data), opts.real_set), None
    if opts.growth:
        benchmarking.print_growth(benchmarking.growth(opts.growth, opts))
        return
    if opts.memory:
        print(json.dumps(benchmarking.training_memory(opts)))
        return
    if opts.arch == "all":
        benchmarking.print_table(os.path.abspath(__file__), opts)
        return
    if opts.worker:
        prof = (
            benchmarking.baseline_profile(opts.arch, opts.against) if opts.baseline else benchmarking.profile(opts.arch)
        )
        model_args = benchmarking.size_args(opts.layers, opts.embed_dim, opts.heads, sizes=prof.get("sizes", "seq2seq"))
        model_args += opts.data_args.get("baseline" if opts.baseline else "arch", [])
        if not opts.baseline:
            model_args += shlex.split(opts.model_args)
        res = benchmarking.worker(
            opts.arch,
            opts.data,
            model_args,
            opts.updates,
            opts.gen_sents,
            opts.max_tokens,
            opts.beam,
            opts.gen_len,
            opts.baseline,
            opts.against,
            opts.device,
        )
        print(json.dumps(res))
        return
    print(json.dumps(benchmarking.compare(os.path.abspath(__file__), opts)))


if __name__ == "__main__":
    main()
