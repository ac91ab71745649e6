"""transformer_dimattn / bart_dimattn_*: incremental decoding, fairseq-generate, BART fine-tuning."""

import pytest
import torch
from conftest import TINY_BART, TINY_MODEL, TRAIN_COMMON, pretrain_tiny_bart, run_cli
from helpers import build_task_and_model, decode_full_and_stepwise, first_batch

from fairseq_knowgen.modules.diminishing_attention import DiminishingMultiheadAttention


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--dimattn-type", "dydim", "--dimattn-g", "sqrt", "--dimattn-layers", "all"],
        ["--dimattn-normalize", "--dimattn-g", "pow:0.5", "--dimattn-layers", "0"],
    ],
)
def test_incremental_equals_full_decoding(tiny_bin, flags):
    task, model, _ = build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL, *flags)
    model.eval()
    sample = first_batch(task)
    net = sample["net_input"]
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    prev = net["prev_output_tokens"]
    (full, _), steps = decode_full_and_stepwise(model, enc, prev)
    # compare real target positions (padding after EOS differs in fairseq's own transformer too)
    real = prev.ne(task.target_dictionary.pad())
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1)[real], full[real], atol=1e-5, rtol=1e-5)
    n_dim = sum(isinstance(m, DiminishingMultiheadAttention) for m in model.modules())
    assert n_dim == (2 if "all" in flags else 1)


def test_same_parameters_as_transformer(tiny_bin):
    """DimAttn adds no parameters: the state dicts of both models have the same keys."""
    _, dim, _ = build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL)
    _, base, _ = build_task_and_model(tiny_bin, "transformer", *TINY_MODEL)
    assert dim.state_dict().keys() == base.state_dict().keys()


def test_bad_layer_spec(tiny_bin):
    with pytest.raises(ValueError, match="out of range"):
        build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL, "--dimattn-layers", "5")


def test_train_and_generate_beam5(tiny_bin, tmp_path):
    run_cli(
        "fairseq-train",
        tiny_bin,
        *TRAIN_COMMON,
        "--arch",
        "transformer_dimattn",
        *TINY_MODEL,
        "--dimattn-type",
        "dydim",
        "--max-update",
        "8",
        "--save-dir",
        tmp_path
    )
    out = run_cli(
        "fairseq-generate",
        tiny_bin,
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--beam",
        "5",
        "--batch-size",
        "8",
    )
    assert out.stdout.count("\nH-") == 24


def test_bart_dimattn_finetunes_from_bart_checkpoint(tiny_bin, tmp_path):
    """A tiny BART checkpoint in fairseq's format loads into bart_dimattn_base unchanged."""
    pre = tmp_path / "bart"
    bart_path, bart = pretrain_tiny_bart(tiny_bin, pre, updates=3)
    ft = tmp_path / "ft"
    run_cli(
        "fairseq-train",
        tiny_bin,
        *TRAIN_COMMON,
        "--arch",
        "bart_dimattn_base",
        *TINY_BART,
        "--restore-file",
        bart_path,
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
        "--reset-lr-scheduler",
        "--lr",
        "1e-12",
        "--max-update",
        "1",
        "--save-dir",
        ft
    )
    tuned = torch.load(ft / "checkpoint_last.pt")
    assert tuned["cfg"]["model"].arch == "bart_dimattn_base"
    for k, v in bart.items():
        torch.testing.assert_close(tuned["model"][k], v, atol=1e-6, rtol=0)
    gen = run_cli(
        "fairseq-generate",
        tiny_bin,
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--path",
        ft / "checkpoint_last.pt",
        "--beam",
        "5",
        "--batch-size",
        "8",
    )
    # the fine-tuned bart_dimattn checkpoint decodes every test input with beam 5
    assert gen.stdout.count("\nH-") == 24


def test_coverage_maps_telescope(tiny_bin):
    """The maps used for plots and entropy: summed DimAttn weights = log(1 + summed raw)."""
    from fairseq_knowgen.analysis.coverage import coverage_entropy, teacher_forced_maps

    task, model, _ = build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL)
    net = first_batch(task)["net_input"]
    maps = teacher_forced_maps(model.eval(), net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
    torch.testing.assert_close(maps["used"].sum(2), torch.log1p(maps["raw"].sum(2)), atol=1e-5, rtol=1e-5)
    pad = task.source_dictionary.pad()
    ent = coverage_entropy(maps["used"], net["src_tokens"].ne(pad), net["prev_output_tokens"].ne(pad))
    n_src = net["src_tokens"].ne(pad).sum(-1).float()
    assert (ent > 0).all() and (ent <= torch.log(n_src) + 1e-5).all()


def test_plot_coverage_writes_png(tiny_bin, tmp_path):
    run_cli(
        "fairseq-train",
        tiny_bin,
        *TRAIN_COMMON,
        "--arch",
        "transformer_dimattn",
        *TINY_MODEL,
        "--max-update",
        "2",
        "--save-dir",
        tmp_path
    )
    png = tmp_path / "cov.png"
    run_cli(
        "scripts/plot_coverage.py",
        "--data",
        tiny_bin,
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--index",
        "2",
        "--out",
        png,
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = run_cli(
        "scripts/plot_coverage.py", "--data", tiny_bin, "--path", tmp_path / "checkpoint_last.pt", "--entropy"
    )
    assert '"n": 24' in out.stdout
