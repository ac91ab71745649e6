"""Checkpoints round-trip under torch's weights-only loading, through the plugin's --user-dir."""

import argparse
import os
import pickle

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL, TRAIN_COMMON, run_cli


class NotAllowListed:
    pass


def test_allow_list_is_exact_and_global_switch_is_off(tmp_path):
    import fairseq_knowgen  # noqa: F401

    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
    p = tmp_path / "ck.pt"
    torch.save({"args": argparse.Namespace(arch="transformer"), "m": np.arange(3), "s": np.float64(2)}, p)
    state = torch.load(p)
    assert state["args"].arch == "transformer" and state["m"].tolist() == [0, 1, 2]
    # anything else is still refused
    torch.save({"x": NotAllowListed()}, p)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(p)


def test_fairseq_09_train_meters_load(tmp_path, capsys):
    """fairseq <= 0.9 pickled its meters, from the module ``fairseq.meters``, in
    ``extra_state["train_meters"]`` (released checkpoints, pytorch/hub#86). Such a file, written in
    torch's legacy format with the classes under their old module, loads through fairseq's own
    ``load_checkpoint_to_cpu`` (weights-only), meter values intact."""
    import collections

    import fairseq_knowgen  # noqa: F401
    from fairseq import checkpoint_utils
    from fairseq.logging import meters

    classes = (meters.AverageMeter, meters.TimeMeter, meters.StopwatchMeter)
    loss, wps, wall = (cls() for cls in classes)
    loss.update(3.0, n=2)
    loss.update(6.0, n=1)
    wps.update(40)
    wall.start()
    wall.stop(n=5)
    state = {
        "model": {"w": torch.arange(3.0)},
        "args": argparse.Namespace(arch="transformer"),
        "optimizer_history": [
            {
                "criterion_name": "CrossEntropyCriterion",
                "optimizer_name": "Adam",
                "lr_scheduler_state": {"best": 1.0},
                "num_updates": 7,
            }
        ],
        "extra_state": {"train_meters": collections.OrderedDict(loss=loss, wps=wps, wall=wall)},
    }
    try:
        for cls in classes:
            cls.__module__ = "fairseq.meters"
        torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    finally:
        for cls in classes:
            cls.__module__ = "fairseq.logging.meters"
    raw = (tmp_path / "old.pt").read_bytes()
    assert b"fairseq.meters" in raw and b"fairseq.logging" not in raw
    loaded = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "old.pt"))
    got = loaded["extra_state"]["train_meters"]
    assert isinstance(got["loss"], meters.AverageMeter) and got["loss"].avg == 4.0 and got["loss"].count == 3
    assert isinstance(got["wps"], meters.TimeMeter) and got["wps"].n == 40
    assert isinstance(got["wall"], meters.StopwatchMeter) and got["wall"].n == 5
    assert torch.equal(loaded["model"]["w"], torch.arange(3.0))
    # the loader stays weights-only: an unlisted class in the same place is still refused, and fairseq's
    # loader says so in one line naming the file (exit 2; checkpoint_compat.stop_on_unreadable_checkpoints)
    state["extra_state"]["train_meters"] = {"other": NotAllowListed()}
    torch.save(state, tmp_path / "other.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(SystemExit) as stop:
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "other.pt"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"error: {tmp_path / 'other.pt'}: refused: it names the Python object" in err
    assert "NotAllowListed" in err


@pytest.mark.parametrize("written_by", ["numpy.core", "numpy._core"])
def test_numpy_meter_values_load_under_either_numpy_module_name(tmp_path, written_by):
    """NumPy 1.x pickles arrays and scalars through ``numpy.core.multiarray``, NumPy 2 through
    ``numpy._core.multiarray``: a checkpoint's meter values load whichever NumPy wrote it (the
    module name in torch's legacy pickle is rewritten to the other spelling)."""
    import fairseq_knowgen  # noqa: F401

    torch.save({"m": np.arange(3), "s": np.float64(2.5)}, tmp_path / "ck.pt", _use_new_zipfile_serialization=False)
    raw = (tmp_path / "ck.pt").read_bytes()
    here = "numpy._core" if b"numpy._core.multiarray" in raw else "numpy.core"
    (tmp_path / "ck.pt").write_bytes(raw.replace(f"{here}.multiarray".encode(), f"{written_by}.multiarray".encode()))
    assert f"{written_by}.multiarray".encode() in (tmp_path / "ck.pt").read_bytes()
    state = torch.load(tmp_path / "ck.pt")
    assert state["m"].tolist() == [0, 1, 2] and state["s"] == 2.5


def _log_updates(stdout_stderr):
    return [line for line in stdout_stderr.splitlines() if "num_updates" in line]


def test_train_stop_resume_generate(tiny_bin, tmp_path):
    common = [
        tiny_bin,
        *TRAIN_COMMON,
        "--arch",
        "transformer_dimattn",
        *TINY_MODEL,
        "--save-dir",
        tmp_path,
        "--eval-bleu",
        "--eval-bleu-args",
        '{"beam": 1}',
        "--best-checkpoint-metric",
        "bleu",
        "--maximize-best-checkpoint-metric",
    ]
    run_cli("fairseq-train", *common, "--max-update", "4")
    first = torch.load(tmp_path / "checkpoint_last.pt")
    assert first["optimizer_history"][-1]["num_updates"] == 4
    # resume: fairseq reads checkpoint_last.pt (the default --restore-file) and continues
    out = run_cli("fairseq-train", *common, "--max-update", "7", "--restore-file", tmp_path / "checkpoint_last.pt")
    log = out.stdout + out.stderr
    assert "Loaded checkpoint" in log and "@ 4 updates" in log
    resumed = torch.load(tmp_path / "checkpoint_last.pt")
    assert resumed["optimizer_history"][-1]["num_updates"] == 7
    assert "last_optimizer_state" in resumed
    gen = run_cli(
        "fairseq-generate",
        tiny_bin,
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--path",
        tmp_path / "checkpoint_best.pt",
        "--beam",
        "5",
        "--batch-size",
        "8",
    )
    assert gen.stdout.count("\nH-") == 24


def _training_state(path):
    """What a resumed run must reproduce: weights, optimizer state (Adam's step and moments), the
    schedule's state, the update count and the position in the data."""
    state = torch.load(path)
    return {
        "model": state["model"],
        "optimizer": state["last_optimizer_state"],
        "history": state["optimizer_history"][-1],
        "iterator": state["extra_state"]["train_iterator"],
    }


def _unequal(a, b, where=""):
    """The paths at which two nested checkpoint structures differ (tensors by torch.equal)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where} keys {sorted(set(a) ^ set(b), key=str)}"]
        return [d for k in a for d in _unequal(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where} length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _unequal(x, y, f"{where}/{i}")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def test_resume_is_exact(tiny_bin, tmp_path):
    """17 updates in one go equal the same training stopped and resumed twice, bit for bit: every
    parameter and every tensor of Adam's state (torch.equal), the schedule, the data position and the
    exact loss of every update. 5 batches an epoch, dropout 0.1, the package's translation_constrained
    task. The interrupted run stops at the end of epoch 1 (update 5), is resumed and crashes
    (``os._exit``, no clean-up) after update 14, in epoch 3, so that it resumes from its last
    interval checkpoint (update 12, the middle of epoch 3) and runs to 17 (epoch 4).

    What makes it exact: fairseq reseeds torch's RNG with seed + num_updates before every update
    (dropout), saves the position in the epoch, the per-epoch shuffle seed and Adam's state, and
    :mod:`fairseq_knowgen.compat.exact_resume` makes a resumed run build its batches as the uninterrupted
    run built them, at epoch 1 (fairseq alone builds them anew with the seed of the epoch it resumes
    in: 87 of the 89 parameters differed here without it). tests/ddp_worker.py records the
    unrounded losses."""
    args = [
        tiny_bin,
        *TRAIN_COMMON,
        "--task",
        "translation_constrained",
        "--arch",
        "transformer_dimattn",
        *TINY_MODEL,
        "--dropout",
        "0.1",
        "--save-interval-updates",
        "3",
        "--disable-validation",
    ]
    a = tmp_path / "a"
    b = tmp_path / "b"
    run_cli("tests/ddp_worker.py", tmp_path / "a.pt", *args, "--max-update", "17", "--save-dir", a)
    run_cli("tests/ddp_worker.py", tmp_path / "b1.pt", *args, "--max-update", "5", "--save-dir", b)
    crash = run_cli(
        "tests/ddp_worker.py",
        tmp_path / "b2.pt",
        *args,
        "--max-update",
        "17",
        "--save-dir",
        b,
        check=False,
        env={"DDP_WORKER_EXIT_AFTER_UPDATE": "14"},
    )
    assert crash.returncode == 3, crash.stderr[-2000:]
    log = crash.stdout + crash.stderr
    assert "(epoch 2 @ 5 updates)" in log and "begin training epoch 3" in log
    out = run_cli("tests/ddp_worker.py", tmp_path / "b3.pt", *args, "--max-update", "17", "--save-dir", b)
    log = out.stdout + out.stderr
    assert "(epoch 3 @ 12 updates)" in log and "begin training epoch 4" in log
    ra, rb1, rb3 = (torch.load(tmp_path / f"{r}.pt") for r in ("a", "b1", "b3"))
    assert ra["num_updates"] == rb3["num_updates"] == 17
    different = [k for k in ra["params"] if not torch.equal(ra["params"][k], rb3["params"][k])]
    assert not different, f"{len(different)} of {len(ra['params'])} parameters differ after resuming: {different[:5]}"
    assert len(ra["losses"]) == 17 and ra["losses"][:5] == rb1["losses"] and ra["losses"][12:] == rb3["losses"]
    full, resumed = _training_state(a / "checkpoint_last.pt"), _training_state(b / "checkpoint_last.pt")
    assert full["history"]["num_updates"] == 17 and full["optimizer"]["state"]
    assert not _unequal(full, resumed), _unequal(full, resumed)[:10]


def test_checkpoint_with_empty_optimizer_history_loads(tmp_path):
    """A checkpoint stripped to ``optimizer_history = []`` loads through fairseq's loader (fairseq alone
    indexes [-1] of the empty list: IndexError), its weights untouched."""
    import torch
    from fairseq import checkpoint_utils

    w = torch.arange(4.0)
    path = tmp_path / "stripped.pt"
    torch.save({"model": {"w": w}, "optimizer_history": [], "extra_state": {}}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert torch.equal(state["model"]["w"], w)
    assert len(state["optimizer_history"]) == 1
