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


def test_resume_is_exact(tiny_bin, tmp_path):
    """Training 6 updates in one go equals 3 + resume + 3 (same data order, same weights)."""
    args = [
        tiny_bin,
        *TRAIN_COMMON,
        "--arch",
        "transformer_dimattn",
        *TINY_MODEL,
        "--dropout",
        "0.1",
        "--max-tokens",
        "300",
    ]
    run_cli("fairseq-train", *args, "--max-update", "6", "--save-dir", tmp_path / "a")
    run_cli("fairseq-train", *args, "--max-update", "3", "--save-dir", tmp_path / "b")
    run_cli("fairseq-train", *args, "--max-update", "6", "--save-dir", tmp_path / "b")
    a = torch.load(tmp_path / "a" / "checkpoint_last.pt")["model"]
    b = torch.load(tmp_path / "b" / "checkpoint_last.pt")["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)
