"""fairseq's default ``--ddp-backend c10d`` (torch's DistributedDataParallel) with 2 CPU ranks (gloo),
one run per registered architecture family. torch's DDP, unlike fairseq's ``legacy_ddp``, refuses a model
with a trainable parameter that gets no gradient (fairseq leaves ``--find-unused-parameters`` off), so each
run also checks that every configuration uses all its parameters in every update. Both ranks must end
with identical parameters and the same finite losses."""

import math

import pytest
import torch
from conftest import TINY_BART, TINY_MODEL, TRAIN_COMMON
from test_cocon import cocon_data  # noqa: F401  (fixture: tiny sentences and an untrained LM)
from test_ddp import ARCHS as LEGACY_ARCHS
from test_ddp import TwoRanks
from test_kbert_generation import SIZES as KBERT_GEN_SIZES
from test_kbert_generation import webnlg_like  # noqa: F401  (fixture: tiny data and its KG)
from test_kbert_model import TINY as KBERT_TINY
from test_kbert_model import classification_dir, tagging_dir  # noqa: F401  (fixtures)

UPDATES = 3


def kbert(task, criterion):
    def args(data):
        return [data, "--task", task, "--kg", f"{data}/kg.spo", "--arch", "kbert_small", *KBERT_TINY]

    return args, ["--criterion", criterion, "--batch-size", "8"]


# name -> (fixture, arguments from its value, more arguments)
RUNS = {
    **{name: (data, lambda d: [d], [*arch, *TINY_MODEL]) for name, (data, arch) in LEGACY_ARCHS.items()},
    "dimattn_all_layers": (
        "tiny_bin",
        lambda d: [d],
        ["--arch", "transformer_dimattn", "--dimattn-type", "dydim", "--dimattn-layers", "all", *TINY_MODEL],
    ),
    "bart_dimattn": ("tiny_bin", lambda d: [d], ["--arch", "bart_dimattn_base", *TINY_BART]),
    "eki_bart": (
        "eki_bin",
        lambda d: [d, "--task", "eki_generation"],
        ["--arch", "eki_bart_base", *TINY_BART, "--eki-scaling-dim", "8"]
        + ["--criterion", "eki_label_smoothed_cross_entropy"],
    ),
    "kbert_classification": ("classification_dir", *kbert("kbert_classification", "sentence_prediction")),
    "kbert_tagging": ("tagging_dir", *kbert("kbert_tagging", "kbert_tagging")),
    "kbert_transformer": (
        "webnlg_like",
        lambda d: [d[0], "--task", "kbert_translation", "--kg", d[1]],
        ["--arch", "kbert_transformer", *KBERT_GEN_SIZES, "--criterion", "label_smoothed_cross_entropy"],
    ),
    # every CoCon loss from the first update: self, null content, cycle, and adversarial with its discriminator
    "cocon": (
        "cocon_data",
        lambda d: [d[0], "--task", "cocon_generation", "--cocon-lm-path", d[1], "--cocon-sample-mode", "lines"],
        ["--arch", "cocon_lm_small", "--criterion", "cocon", "--cocon-cycle-start", "0", "--cocon-adv-start", "0"],
    ),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_two_ranks_end_identical_under_torch_ddp(request, name, tmp_path):
    fixture, data_args, arch_args = RUNS[name]
    args = [*data_args(request.getfixturevalue(fixture)), *TRAIN_COMMON, *arch_args]
    args += ["--max-update", str(UPDATES), "--max-tokens", "400", "--save-dir", tmp_path / "ckpt"]
    with TwoRanks(tmp_path, args, ddp_backend=None) as ranks:
        ranks.wait()
    for r in range(2):
        assert ranks.returncode(r) == 0, ranks.log(r)[-4000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["wrapper"] == r1["wrapper"] == "CpuDistributedDataParallel"  # torch's DDP, not legacy_ddp
    assert r0["num_updates"] == r1["num_updates"] == UPDATES
    assert len(r0["losses"]) == UPDATES and r0["losses"] == r1["losses"]
    assert all(math.isfinite(x) for x in r0["losses"]), r0["losses"]
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), k
    if name == "cocon":
        log = ranks.log(0)
        losses = ("loss_self", "loss_null", "loss_cycle", "loss_adv", "loss_disc")
        assert all(f"{k}=" in log for k in losses), log[-2000:]
    assert not ranks.leftovers()
