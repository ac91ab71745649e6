"""Two ordinary fairseq options that read ``np.compat.long``, which NumPy 2 removed: the environment
(scripts/setup_env.sh, requirements.txt) keeps a NumPy that has it, so each trains one update, with plain
``fairseq-train`` and through the plugin's --user-dir.

- ``--task language_modeling --sample-break-mode eos``: fairseq/data/token_block_dataset.py (eos fast path);
- ``--num-batch-buckets``: fairseq/data/language_pair_dataset.py.
"""

import pytest
import torch
from conftest import TINY_MODEL, run_cli

ONE_UPDATE = [
    "--cpu",
    "--optimizer",
    "adam",
    "--lr",
    "1e-3",
    "--max-update",
    "1",
    "--no-progress-bar",
    "--log-interval",
    "1",
    "--no-epoch-checkpoints",
    "--disable-validation",
]


@pytest.fixture(scope="module")
def lm_bin(tiny_raw, tmp_path_factory):
    """The tiny targets as a monolingual corpus, one sentence a line."""
    out = tmp_path_factory.mktemp("lmbin")
    run_cli(
        "fairseq-preprocess",
        "--only-source",
        "--trainpref",
        tiny_raw / "train.tgt",
        "--validpref",
        tiny_raw / "valid.tgt",
        "--destdir",
        out,
        "--workers",
        "1",
    )
    return out


def train_one_update(args, save_dir, user_dir):
    extra = ["--user-dir", "fairseq_knowgen"] if user_dir else []
    out = run_cli("fairseq-train", *args, *extra, *ONE_UPDATE, "--save-dir", save_dir)
    log = out.stdout + out.stderr
    assert "np.compat" not in log
    assert torch.load(save_dir / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 1
    return log


@pytest.mark.parametrize("user_dir", [False, True], ids=["plain", "user_dir"])
def test_language_model_with_sample_break_mode_eos(lm_bin, tmp_path, user_dir):
    args = [lm_bin, "--task", "language_modeling", "--sample-break-mode", "eos", "--arch", "transformer_lm"]
    args += ["--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32"]
    args += ["--decoder-attention-heads", "2", "--tokens-per-sample", "64", "--max-tokens", "512"]
    train_one_update(args, tmp_path, user_dir)


@pytest.mark.parametrize("user_dir", [False, True], ids=["plain", "user_dir"])
def test_translation_with_num_batch_buckets(tiny_bin, tmp_path, user_dir):
    args = [tiny_bin, "--arch", "transformer", *TINY_MODEL, "--num-batch-buckets", "4", "--max-tokens", "400"]
    log = train_one_update(args, tmp_path, user_dir)
    assert "bucketing source lengths" in log
