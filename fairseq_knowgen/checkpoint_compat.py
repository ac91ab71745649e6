"""Let torch >= 2.6's weights-only ``torch.load`` read fairseq checkpoints.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses any pickled
global that is not allow-listed. fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``
calls ``torch.load`` without the argument, so ``fairseq-generate --path`` and
``fairseq-train --restore-file`` fail on the ``argparse.Namespace`` that fairseq (and every
released BART / RoBERTa checkpoint) stores under ``"args"``.

Importing this package allow-lists exactly the non-tensor types that fairseq checkpoints
hold, via ``torch.serialization.add_safe_globals``. Weights-only loading stays on for
everything else: we never set ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` nor pass
``weights_only=False``.

What fairseq puts in a checkpoint (``Trainer.state_dict``): tensors, plain containers,
numbers and strings, ``argparse.Namespace`` (legacy ``"args"``), and in
``extra_state["metrics"]`` the meter states, whose numbers may be NumPy scalars. fairseq 0.9 and
earlier pickled the meter objects themselves under ``extra_state["train_meters"]`` (released
checkpoints do, pytorch/hub#86), from the module ``fairseq.meters`` that is now
``fairseq.logging.meters``.
"""

import argparse

import numpy as np
import torch


def fairseq_checkpoint_globals():
    """The types (besides tensors and builtins) found in fairseq checkpoints.

    - ``argparse.Namespace``: the legacy ``"args"`` and the model config under ``"cfg"``;
    - NumPy arrays (``_reconstruct``, ``ndarray``, ``dtype``): meter states, e.g. the BLEU
      n-gram counts logged by ``--eval-bleu``;
    - NumPy scalars (``scalar``): meter sums that were NumPy numbers;
    - fairseq <= 0.9's ``fairseq.meters.AverageMeter``, ``TimeMeter``, ``StopwatchMeter``
      (``extra_state["train_meters"]``), under that old module path.
    """
    try:  # numpy >= 2 moved the pickling helpers to numpy._core (1.26 has both names)
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # pragma: no cover - numpy < 1.26
        from numpy.core.multiarray import _reconstruct, scalar
    from fairseq.logging import meters

    # a checkpoint names the helpers by the module of the NumPy that wrote it: allow both spellings
    numpy_helpers = [
        (f, f"{module}.multiarray.{f.__name__}")
        for f in (_reconstruct, scalar)
        for module in ("numpy.core", "numpy._core")
    ]
    old_meters = [(getattr(meters, n), f"fairseq.meters.{n}") for n in ("AverageMeter", "TimeMeter", "StopwatchMeter")]
    # an array or scalar pickles its dtype as an instance of a per-type class (Int64DType...)
    dtype_classes = [type(np.dtype(t)) for t in _NUMERIC_DTYPES]
    return [argparse.Namespace, np.ndarray, np.dtype] + numpy_helpers + old_meters + dtype_classes


_NUMERIC_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")


def allow_fairseq_checkpoints():
    """Register :func:`fairseq_checkpoint_globals` with torch's weights-only unpickler."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 loads full pickles by default and needs nothing
        add(fairseq_checkpoint_globals())


allow_fairseq_checkpoints()


def accept_empty_optimizer_history():
    """A checkpoint stripped of its training state with ``optimizer_history = []`` (a common way of
    shrinking a released model, and what a weights-only export may hold) makes fairseq's
    ``_upgrade_state_dict`` index ``[-1]`` of the empty list (IndexError). It is read as a
    checkpoint without optimizer history, which fairseq already upgrades (one entry, no optimizer
    state); everything else is fairseq's own upgrade."""
    from fairseq import checkpoint_utils

    upgrade = checkpoint_utils._upgrade_state_dict
    if getattr(upgrade, "_knowgen", False):
        return

    def _upgrade_state_dict(state):
        if state.get("optimizer_history") == []:
            state["optimizer_history"] = [
                {"criterion_name": "CrossEntropyCriterion", "best_loss": None, "num_updates": 0}
            ]
            state.setdefault("last_optimizer_state", None)
        return upgrade(state)

    _upgrade_state_dict._knowgen = True
    checkpoint_utils._upgrade_state_dict = _upgrade_state_dict


accept_empty_optimizer_history()
