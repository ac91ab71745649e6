#!/usr/bin/env python
"""Draw, for one example, the raw cross-attention, the weights the model used (for DimAttn:
the diminishing weights) and the final effective coverage, as heatmaps in one PNG; or, with
``--entropy``, print the mean entropy of normalized final coverage over a whole split.

    python scripts/plot_coverage.py --data work/commongen/bin --path RUN/checkpoints/checkpoint_best.pt \\
        --index 0 --out coverage.png [--hyp RUN/gen.out]
    python scripts/plot_coverage.py --data ... --path ... --hyp RUN/gen.out --entropy

With ``--hyp`` (fairseq-generate output) the model is teacher-forced on its own outputs,
which is what decoding saw; otherwise on the reference target of the split.
"""

import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="binarized data directory")
    p.add_argument("--path", required=True, help="checkpoint")
    p.add_argument("--subset", default="valid")
    p.add_argument("--hyp", help="fairseq-generate output to teacher-force (H- lines)")
    p.add_argument("--bpe-codes", help="subword-nmt codes to re-apply to the --hyp lines (if they were de-BPE'd)")
    p.add_argument("--layer", type=int, default=-1, help="decoder layer (default: last)")
    p.add_argument("--index", type=int, default=0, help="example id to draw")
    p.add_argument("--out", default="coverage.png")
    p.add_argument("--entropy", action="store_true", help="print mean coverage entropy over the split")
    p.add_argument("--batch-size", type=int, default=64)
    return p


def load(args):
    from fairseq import checkpoint_utils

    import fairseq_knowgen  # noqa: F401

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides={"data": args.data})
    task.load_dataset(args.subset)
    model = models[0].eval()
    return model, task


def hypotheses_as_targets(task, path, n, bpe_codes=None):
    """Token ids of each H- line (re-segmented with ``bpe_codes`` when given)."""
    import re

    segment = None
    if bpe_codes:
        from subword_nmt.apply_bpe import BPE

        with open(bpe_codes, encoding="utf-8") as f:
            segment = BPE(f).process_line
    hyps = {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^H-(\d+)\t[^\t]*\t(.*)$", line.rstrip("\n"))
        if m and int(m.group(1)) not in hyps:
            hyps[int(m.group(1))] = segment(m.group(2)) if segment else m.group(2)
    d = task.target_dictionary
    return [d.encode_line(hyps.get(i, ""), add_if_not_exist=False, append_eos=True).long() for i in range(n)]


def batch_for(task, subset, ids, targets=None):
    """A collated batch of the given example ids, targets replaced by ``targets`` if given."""
    ds = task.dataset(subset)
    items = []
    for i in ids:
        it = ds[i]
        if targets is not None:
            it = dict(it, target=targets[i])
        items.append(it)
    return ds.collater(items)


def main():
    args = get_parser().parse_args()
    import torch

    from fairseq_knowgen.analysis.coverage import coverage_entropy, teacher_forced_maps

    model, task = load(args)
    ds = task.dataset(args.subset)
    targets = hypotheses_as_targets(task, args.hyp, len(ds), args.bpe_codes) if args.hyp else None
    pad = task.source_dictionary.pad()
    if args.entropy:
        ents = []
        for start in range(0, len(ds), args.batch_size):
            s = batch_for(task, args.subset, range(start, min(start + args.batch_size, len(ds))), targets)
            net = s["net_input"]
            maps = teacher_forced_maps(
                model, net["src_tokens"], net["src_lengths"], net["prev_output_tokens"], args.layer
            )
            ents.append(coverage_entropy(maps["used"], net["src_tokens"].ne(pad), net["prev_output_tokens"].ne(pad)))
        ent = torch.cat(ents)
        print(json.dumps({"coverage_entropy": round(float(ent.mean()), 4), "n": len(ent)}))
        return
    s = batch_for(task, args.subset, [args.index], targets)
    net = s["net_input"]
    maps = teacher_forced_maps(model, net["src_tokens"], net["src_lengths"], net["prev_output_tokens"], args.layer)
    draw(task, net, s["target"], maps, args.out)
    print(f"wrote {args.out}")


def draw(task, net, target, maps, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src_d, tgt_d = task.source_dictionary, task.target_dictionary
    src = [src_d[t] for t in net["src_tokens"][0].tolist() if t != src_d.pad()]
    tgt = [tgt_d[t] for t in target[0].tolist() if t != tgt_d.pad()]
    keep = net["src_tokens"][0].ne(src_d.pad())
    raw = maps["raw"][0].mean(0)[: len(tgt)][:, keep].numpy()
    used = maps["used"][0].mean(0)[: len(tgt)][:, keep].numpy()
    cov = used.cumsum(0)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    fig, axes = plt.subplots(1, 3, figsize=(3 * (2 + 0.3 * len(src)), 2 + 0.3 * len(tgt)))
    for ax, m, title in zip(axes, (raw, used, cov), ("raw attention a", "weights used", "effective coverage")):
        im = ax.imshow(m, aspect="auto", cmap="viridis")
        ax.set_title(title)
        ax.set_xticks(range(len(src)), src, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(tgt)), tgt, fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
