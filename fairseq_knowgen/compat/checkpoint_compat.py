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

A checkpoint that cannot be read stops with ``error: PATH: what is wrong`` and exit status 2 (no
traceback), in the package's own loaders (:func:`read_checkpoint`) and in fairseq's
(``fairseq-generate --path``, ``fairseq-train --restore-file``/``--finetune-from-model``,
``fairseq-interactive``... through ``checkpoint_utils.load_checkpoint_to_cpu``): missing, a
folder, empty, truncated (or not a torch file at all), not a dict with ``"model"``, or refused
because it names a Python object outside the allow-list (:func:`describe_load_error`).
"""

import argparse
import os
import pickle
import re
import sys

import numpy as np
import torch

from ..textio import DataError


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


class CheckpointError(DataError):
    """A checkpoint that cannot be read; the message names the file and says what is wrong."""

    def __init__(self, path: str, message: str):
        super().__init__(path, 0, message)


def describe_load_error(err: BaseException) -> str:
    """What ``torch.load``'s exception ``err`` says about the file, in one line."""
    text = str(err)
    first = text.strip().splitlines()[0].split(". ")[0] if text.strip() else type(err).__name__
    not_pickle = re.search(r"Unsupported operand \d+|invalid load key[^,.]*", text)
    if "Weights only load failed" in text and not_pickle:  # bytes no pickle starts with: not a torch file at all
        return f"cannot be read: not a torch checkpoint ({not_pickle.group(0)})"
    if "Weights only load failed" in text:
        refused = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", text)
        what = f"the Python object {refused.group(1)}" if refused else "a Python object"
        return (
            f"refused: it names {what}, which weights-only loading does not allow (a checkpoint holds tensors "
            "and plain values; only the types fairseq checkpoints hold are allowed: "
            "fairseq_knowgen.compat.checkpoint_compat)"
        )
    truncated = ("central directory", "zip archive", "Ran out of input", "unexpected EOF", "truncated")
    if isinstance(err, EOFError) or any(t in text for t in truncated):
        return f"cannot be read: truncated, or not a torch checkpoint ({first})"
    return f"cannot be read: not a torch checkpoint ({type(err).__name__}: {first})"


def check_checkpoint_file(path: str):
    """A :class:`CheckpointError` for a path that cannot be a checkpoint before anything is read."""
    if os.path.isdir(path):
        raise CheckpointError(path, "is a folder, not a checkpoint file")
    if not os.path.isfile(path):
        raise CheckpointError(path, "checkpoint file not found")
    if os.path.getsize(path) == 0:
        raise CheckpointError(path, "empty file, not a checkpoint")


def read_checkpoint(path: str, map_location="cpu") -> dict:
    """``torch.load`` (weights-only) of a checkpoint holding a dict; anything else is a
    :class:`CheckpointError` naming ``path`` (see :func:`describe_load_error`)."""
    check_checkpoint_file(path)
    try:
        state = torch.load(path, map_location=map_location)
    except Exception as err:  # truncated, not a torch file, a refused global: torch raises many kinds
        raise CheckpointError(path, describe_load_error(err)) from None
    if not isinstance(state, dict):
        raise CheckpointError(path, f"holds a {type(state).__name__}, not a checkpoint (a dict)")
    return state


class _TorchWithCheckedLoad:
    """``torch`` as fairseq's ``checkpoint_utils`` sees it: the same module, except that ``load``
    raises a :class:`CheckpointError` naming the file for what cannot be read or is no dict with
    ``"model"`` (every checkpoint fairseq reads there is a training checkpoint)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(f, *args, **kwargs):
        path = str(getattr(f, "name", f))
        try:
            state = torch.load(f, *args, **kwargs)
        except Exception as err:  # truncated, not a torch file, a refused global: torch raises many kinds
            raise CheckpointError(path, describe_load_error(err)) from None
        if not isinstance(state, dict) or "model" not in state:
            what = "a dict without 'model'" if isinstance(state, dict) else f"a {type(state).__name__}"
            raise CheckpointError(path, f"holds {what}, not a fairseq checkpoint")
        return state


def stop_on_unreadable_checkpoints():
    """fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` and ``load_model_ensemble_and_task``
    (every fairseq command that reads a checkpoint) end with ``error: PATH: ...`` and exit status 2
    for a checkpoint that cannot be read (:func:`read_checkpoint`'s cases, and a dict without
    ``"model"``), as the package's own commands do, instead of a traceback. ``torch.load`` there is
    :class:`_TorchWithCheckedLoad`'s; the rest of fairseq's reading is unchanged."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(load, "_knowgen", False):
        return
    checkpoint_utils.torch = _TorchWithCheckedLoad()

    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        try:
            if "://" not in str(path):  # a local file (fairseq's PathManager also reads URLs)
                check_checkpoint_file(path)
            state = load(path, arg_overrides, load_on_all_ranks)
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        return state

    ensemble = checkpoint_utils.load_model_ensemble_and_task

    def load_model_ensemble_and_task(filenames, *args, **kwargs):
        try:
            return ensemble(filenames, *args, **kwargs)
        except OSError as err:  # fairseq: IOError("Model file not found: PATH")
            found = re.match(r"Model file not found: (.+)", str(err))
            if not found:
                raise
            print(f"error: {found.group(1)}: checkpoint file not found", file=sys.stderr)
            sys.exit(2)

    load_checkpoint_to_cpu._knowgen = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task


stop_on_unreadable_checkpoints()
