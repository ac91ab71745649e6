#!/usr/bin/env python
"""Where the CoCon block's attention goes: the share of each head's attention mass on the content
columns (Eq. 6's ``W_{:, :l_c}`` after the softmax), on validation sentences split as in training.

For every sentence of ``--subset`` the split of the self-reconstruction loss is drawn (the
criterion's own, with a fixed seed per batch as its validation does; ``--split fixed`` puts every
checkpoint on the authors' split so that runs trained with another one are read on the same
inputs), the block runs over the prefix-and-continuation states with the content x^b and the
checkpoint's content mask, and for each predicted position of x^b (the positions L_self counts)
the attention weights of each head are summed over the content columns. Printed per head:

- ``own``: the mean share on the sentence's own content;
- ``other``: the same with another sentence's content (the batch's contents rolled by one row):
  a head that reads content regardless of what it says has own ~ other;
- ``uniform``: the share a head attending uniformly over the visible columns would give
  (visible content columns / all visible columns), the reference for "no preference".

The last line is one JSON object with the same numbers. A measurement tool for
docs/results/cocon.md (issue 29: the aims were missed, so where does the attention go)::

    python dev/cocon_attention.py --path RUN/checkpoints/checkpoint_best.pt --data OUT/bin/lm \\
        --lm OUT/runs/lm/checkpoints/checkpoint_best.pt [--subset valid] [--max-sentences 1000]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fairseq_knowgen.textio import DataError, cli_entry  # noqa: E402


def head_shares(weights: torch.Tensor, S: int, counted: torch.Tensor) -> torch.Tensor:
    """Summed attention mass on the first ``S`` columns, per head, summed over the counted queries.

    weights: ``B x H x T x (S + L)``; counted: ``B x T`` bool. Returns ``H`` sums."""
    share = weights[..., :S].sum(-1)  # B x H x T
    return (share * counted[:, None, :]).sum((0, 2))


def uniform_share(weights: torch.Tensor, S: int, counted: torch.Tensor) -> torch.Tensor:
    """Summed over the counted queries: visible content columns / visible columns (a column is
    visible where its weight is not exactly zero after the masked softmax; eval mode, no dropout)."""
    visible = weights[:, 0] > 0  # B x T x (S + L): the mask is the same for every head
    frac = visible[..., :S].sum(-1).float() / visible.sum(-1).clamp(min=1).float()
    return (frac * counted).sum()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", required=True, help="the CoCon checkpoint")
    ap.add_argument("--data", required=True, help="the binarized LM data (bin/lm) it was trained on")
    ap.add_argument("--lm", required=True, help="the frozen LM checkpoint (cocon_lm_path)")
    ap.add_argument("--subset", default="valid")
    ap.add_argument("--split", choices=("fixed", "own"), default="fixed", help="the authors' split, or the checkpoint's")
    ap.add_argument("--max-sentences", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=2048)
    args = ap.parse_args(argv)
    for path, what in ((args.path, "CoCon checkpoint"), (args.lm, "frozen LM checkpoint")):
        if not os.path.isfile(path):
            raise DataError(path, 0, f"no {what} here")
    if not os.path.isfile(os.path.join(args.data, "dict.txt")):
        raise DataError(os.path.join(args.data, "dict.txt"), 0, "no dictionary: --data is the binarized bin/lm folder")

    from fairseq import checkpoint_utils, utils

    import fairseq_knowgen  # noqa: F401  (registers the task, model, criterion)

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [args.path], arg_overrides={"data": args.data, "cocon_lm_path": args.lm}
    )
    model = models[0].eval()
    if args.split == "fixed":
        cfg.criterion.cocon_split = "fixed"
    crit = task.build_criterion(cfg.criterion)
    dec = model.decoder
    task.load_dataset(args.subset)
    itr = task.get_batch_iterator(
        task.dataset(args.subset), max_tokens=args.max_tokens, max_positions=utils.resolve_max_positions(
            task.max_positions(), model.max_positions()), ignore_invalid_inputs=True, seed=1,
    ).next_epoch_itr(shuffle=False)
    H = dec.block.attn.num_heads
    own, other, uni, n, sentences = torch.zeros(H), torch.zeros(H), 0.0, 0, 0
    with torch.no_grad():
        for sample in itr:
            if sentences >= args.max_sentences:
                break
            target, prev = sample["target"], sample["net_input"]["prev_output_tokens"]
            B, T = target.shape
            if B < 2:
                continue
            n_words = target.ne(crit.padding_idx).sum(1) - 1
            gen = torch.Generator().manual_seed(int(sample["id"].sum()) + 1)
            t, m, loss_mask = crit.draw_splits(n_words, T, gen)
            h, _ = dec.lower(prev, padding_mask=False)
            _, c_states, c_pad, qmask = crit.self_content(dec, target, t, m, gen)
            S = c_states.size(0)
            _, w = dec.block(h, c_states, c_pad, None, content_attn_mask=qmask, need_weights=True)
            own += head_shares(w, S, loss_mask)
            uni += float(uniform_share(w, S, loss_mask))
            # another sentence's content (and its padding), the same per-query mask
            _, w2 = dec.block(
                h, c_states.roll(1, dims=1), c_pad.roll(1, dims=0), None, content_attn_mask=qmask, need_weights=True
            )
            other += head_shares(w2, S, loss_mask)
            n += int(loss_mask.sum())
            sentences += B
    own, other, uni = own / n, other / n, uni / n
    print(f"{args.path}: {sentences} sentences, {n} predicted positions, split {cfg.criterion.cocon_split}")
    print("| head | own content | other content | uniform |")
    print("|---|---|---|---|")
    for i in range(H):
        print(f"| {i} | {own[i]:.3f} | {other[i]:.3f} | {uni:.3f} |")
    print(f"| mean | {own.mean():.3f} | {other.mean():.3f} | {uni:.3f} |")
    print(json.dumps({"path": args.path, "sentences": sentences, "positions": n, "own": own.tolist(),
                      "other": other.tolist(), "uniform": uni}))
    return 0


if __name__ == "__main__":
    sys.exit(cli_entry(main))
