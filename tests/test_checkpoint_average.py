"""Checkpoint averaging (fairseq_knowgen.checkpoint_average): which checkpoints it picks, the
mean by hand, and what it refuses. The recipes' CHECKPOINT=avgN on a real run is in
tests/test_recipes.py."""

import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from fairseq_knowgen.checkpoint_average import average_checkpoints


def save(path, updates, weight, steps=7, shape=(2, 3)):
    torch.save(
        {
            "model": {
                "w": torch.full(shape, float(weight)),
                "h": torch.full((2,), float(weight), dtype=torch.float16),
                "steps": torch.tensor([steps]),
            },
            "optimizer_history": [{"num_updates": updates - 1}, {"num_updates": updates}],
            "last_optimizer_state": {"state": {0: torch.zeros(3)}},
            "cfg": {"note": f"run at {updates}"},
        },
        path,
    )


def cli(*args):
    return subprocess.run([sys.executable, "-m", "fairseq_knowgen.checkpoint_average", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True)  # fmt: skip


def test_the_newest_distinct_checkpoints_are_averaged_and_best_is_ignored(tmp_path):
    save(tmp_path / "checkpoint1.pt", 10, 1)
    save(tmp_path / "checkpoint2.pt", 20, 2)
    save(tmp_path / "checkpoint3.pt", 30, 4)
    save(tmp_path / "checkpoint_last.pt", 35, 8)  # stopped in the middle of epoch 4
    save(tmp_path / "checkpoint_best.pt", 40, 100)  # never a candidate, whatever its count
    save(tmp_path / "checkpoint_3_30.pt", 30, 4)  # an update-interval checkpoint of epoch 3's count: counts once
    out = tmp_path / "avg.pt"
    used = average_checkpoints(str(tmp_path), 3, str(out))
    assert [p.split("/")[-1] for p in used] == ["checkpoint_last.pt", "checkpoint3.pt", "checkpoint2.pt"]
    avg = torch.load(out)
    assert torch.allclose(avg["model"]["w"], torch.full((2, 3), (8 + 4 + 2) / 3))
    assert avg["model"]["h"].dtype == torch.float16
    assert torch.allclose(avg["model"]["h"].float(), torch.full((2,), 14 / 3), atol=1e-2)
    assert avg["model"]["steps"].tolist() == [7]
    # the newest checkpoint's state, without the optimizer's
    assert avg["optimizer_history"][-1]["num_updates"] == 35 and avg["cfg"]["note"] == "run at 35"
    assert "last_optimizer_state" not in avg


def test_checkpoint_last_equal_to_the_newest_epoch_counts_once(tmp_path):
    save(tmp_path / "checkpoint1.pt", 10, 1)
    save(tmp_path / "checkpoint2.pt", 20, 2)
    save(tmp_path / "checkpoint_last.pt", 20, 2)  # training ended at the end of epoch 2
    out = tmp_path / "avg.pt"
    average_checkpoints(str(tmp_path), 2, str(out))
    assert torch.allclose(torch.load(out)["model"]["w"], torch.full((2, 3), 1.5))
    proc = cli("--dir", tmp_path, "--last", 3, "--out", out)
    assert proc.returncode == 2
    assert f"error: {tmp_path}: 3 checkpoints with distinct update counts needed, found 2" in proc.stderr
    assert torch.allclose(torch.load(out)["model"]["w"], torch.full((2, 3), 1.5))  # the earlier output is kept


@pytest.mark.parametrize(
    "other, message",
    [
        (dict(shape=(3, 2)), "w has shape (2, 3), "),
        (dict(steps=8), "non-float tensor steps differs"),
    ],
)
def test_checkpoints_that_do_not_match_are_refused_naming_the_file(tmp_path, other, message):
    save(tmp_path / "checkpoint1.pt", 10, 1)
    save(tmp_path / "checkpoint_last.pt", 20, 2, **other)
    proc = cli("--dir", tmp_path, "--last", 2, "--out", tmp_path / "avg.pt")
    assert proc.returncode == 2 and message in proc.stderr and "checkpoint1.pt" in proc.stderr, proc.stderr
    assert not (tmp_path / "avg.pt").exists()


def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path):
    save(tmp_path / "checkpoint1.pt", 10, 1)
    (tmp_path / "checkpoint_last.pt").write_bytes(b"half a checkpoint")
    proc = cli("--dir", tmp_path, "--last", 2, "--out", tmp_path / "avg.pt")
    assert proc.returncode == 2 and f"error: {tmp_path / 'checkpoint_last.pt'}: cannot be read" in proc.stderr


def test_update_interval_checkpoints_are_candidates(tmp_path):
    """checkpoint_EPOCH_UPDATES.pt (--save-interval-updates) are averaged like epoch checkpoints, by update count."""
    save(tmp_path / "checkpoint_1_100.pt", 100, 1)
    save(tmp_path / "checkpoint_1_200.pt", 200, 2)
    save(tmp_path / "checkpoint_2_300.pt", 300, 4)
    out = tmp_path / "avg.pt"
    used = average_checkpoints(str(tmp_path), 2, str(out))
    assert [p.split("/")[-1] for p in used] == ["checkpoint_2_300.pt", "checkpoint_1_200.pt"]
    assert torch.allclose(torch.load(out)["model"]["w"], torch.full((2, 3), 3.0))


def test_a_folder_without_checkpoints_is_named(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("no checkpoints here\n")
    proc = cli("--dir", tmp_path / "run", "--last", 2, "--out", tmp_path / "avg.pt")
    assert proc.returncode == 2, proc.stderr
    assert f"error: {tmp_path / 'run'}: 2 checkpoints with distinct update counts needed, found 0: none" in proc.stderr
