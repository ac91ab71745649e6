"""Average the parameters of a run's newest checkpoints into one checkpoint that
``fairseq-generate --path`` reads.

fairseq's own ``scripts/average_checkpoints.py`` is not installed with the fairseq package
(it lives in the repository's ``scripts/`` folder), so the recipes call this module:

    python -m fairseq_knowgen.checkpoint_average --dir RUN/checkpoints --last N --out AVG.pt

It collects ``checkpointEPOCH.pt`` (kept with ``fairseq-train --keep-last-epochs K``; the
recipes' ``KEEP_EPOCHS=K``), ``checkpoint_EPOCH_UPDATES.pt`` (``--save-interval-updates``, kept with
``--keep-interval-updates K``) and ``checkpoint_last.pt``, identifies each by its update count
(``optimizer_history[-1]["num_updates"]``; ``checkpoint_last.pt`` equals the newest epoch
checkpoint when training stopped at an epoch's end, and a time limit usually stops it in
the middle of one), and averages the N with the most updates:

    theta_avg = (1 / N) * sum_i theta_i        (every floating-point tensor, in float64)

Integer and boolean buffers must agree across the checkpoints (they are not averaged).
The output is the newest checkpoint's state (config, update count, extra state) with the
averaged model and without the optimizer state (decoding does not need it; resuming from an
average is not meant). It is written to a temporary file and renamed, so a failed run leaves
an earlier output as it was. Fewer than N distinct checkpoints, a checkpoint without
``num_updates``, one that cannot be read (missing, truncated, not a checkpoint, refused by
weights-only loading: :func:`fairseq_knowgen.compat.checkpoint_compat.read_checkpoint`), with other
parameter names or shapes, or an output that cannot be written: ``error: FILE: ...`` and exit 2.
"""

import argparse
import os
import re
import sys
from typing import Dict, List, Tuple

import torch

from .compat.checkpoint_compat import read_checkpoint
from .textio import DataError, atomic_write, check_writable, cli_entry

# checkpointEPOCH.pt and checkpoint_EPOCH_UPDATES.pt (fairseq-train --save-interval-updates)
_TRAINING_CHECKPOINT = re.compile(r"checkpoint(\d+|_\d+_\d+)\.pt$")


class CheckpointAverageError(ValueError):
    """A checkpoint set that cannot be averaged; the message names the file."""


def num_updates(state: dict, path: str) -> int:
    try:
        return int(state["optimizer_history"][-1]["num_updates"])
    except (KeyError, IndexError, TypeError):
        raise CheckpointAverageError(
            f"{path}: no optimizer_history[-1]['num_updates']: not a fairseq training checkpoint"
        )


def candidate_paths(directory: str) -> List[str]:
    """checkpoint_last.pt, every checkpointEPOCH.pt and every checkpoint_EPOCH_UPDATES.pt of
    ``directory`` (not checkpoint_best.pt, which is one of them)."""
    names = sorted(n for n in os.listdir(directory) if _TRAINING_CHECKPOINT.fullmatch(n) or n == "checkpoint_last.pt")
    return [os.path.join(directory, n) for n in names]


def newest_distinct(paths: List[str], n: int, directory: str = ".") -> List[Tuple[int, str, dict]]:
    """(num_updates, path, state) of the ``n`` checkpoints with the most updates, one per update
    count, newest first (``directory``: where they are, for the error)."""
    by_updates: Dict[int, Tuple[str, dict]] = {}
    for path in paths:
        state = read_checkpoint(path)
        by_updates.setdefault(num_updates(state, path), (path, state))
    if len(by_updates) < n:
        found = ", ".join(f"{os.path.basename(p)} ({u} updates)" for u, (p, _) in sorted(by_updates.items()))
        raise CheckpointAverageError(
            f"{directory}: {n} checkpoints with distinct update counts needed, found {len(by_updates)}: "
            f"{found or 'none'} (train with --keep-last-epochs {n}, the recipes' KEEP_EPOCHS, or with "
            f"--save-interval-updates and --keep-interval-updates {n})"
        )
    newest = sorted(by_updates.items(), reverse=True)[:n]
    return [(u, p, s) for u, (p, s) in newest]


def average_models(models: List[Tuple[str, Dict[str, torch.Tensor]]]) -> Dict[str, torch.Tensor]:
    """The mean of each floating-point tensor over ``models`` ([(path, state_dict)]); other tensors must be equal."""
    first_path, first = models[0]
    averaged = {}
    for path, model in models[1:]:
        if model.keys() != first.keys():
            diff = sorted(set(model) ^ set(first))[:5]
            raise CheckpointAverageError(f"{path}: other parameter names than {first_path}: {diff}")
    for key, tensor in first.items():
        tensors = [m[key] for _, m in models]
        for (path, _), t in zip(models, tensors):
            if t.shape != tensor.shape:
                raise CheckpointAverageError(
                    f"{path}: {key} has shape {tuple(t.shape)}, {first_path} {tuple(tensor.shape)}"
                )
        if tensor.is_floating_point():
            averaged[key] = (sum(t.double() for t in tensors) / len(tensors)).to(tensor.dtype)
        else:
            for (path, _), t in zip(models, tensors):
                if not torch.equal(t, tensor):
                    raise CheckpointAverageError(f"{path}: non-float tensor {key} differs from {first_path}")
            averaged[key] = tensor.clone()
    return averaged


def average_checkpoints(directory: str, n: int, out: str) -> List[str]:
    """Write the average of the ``n`` newest checkpoints of ``directory`` to ``out``; returns their paths."""
    if n < 1:
        raise CheckpointAverageError(f"{directory}: --last must be at least 1, got {n}")
    if not os.path.isdir(directory):
        raise CheckpointAverageError(f"{directory}: no such folder")
    check_writable(out)  # before reading N checkpoints
    chosen = newest_distinct(candidate_paths(directory), n, directory)
    state = chosen[0][2]
    state["model"] = average_models([(p, s["model"]) for _, p, s in chosen])
    state.pop("last_optimizer_state", None)
    state["averaged_checkpoints"] = [os.path.basename(p) for _, p, _ in chosen]
    with atomic_write(out, "wb") as f:
        torch.save(state, f)
    return [p for _, p, _ in chosen]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="a run's checkpoint folder")
    parser.add_argument("--last", type=int, required=True, help="how many of the newest checkpoints to average")
    parser.add_argument("--out", required=True, help="the averaged checkpoint to write")
    args = parser.parse_args(argv)
    try:
        paths = average_checkpoints(args.dir, args.last, args.out)
    except (CheckpointAverageError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)}) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_entry(main))
