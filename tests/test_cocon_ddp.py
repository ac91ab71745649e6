"""CoCon under fairseq's data parallel training with 2 CPU ranks (gloo): the frozen LM, the CoCon block
and the criterion's discriminator end identical on both ranks, with every loss on (cycle and adversarial from
update 1 and 2 on)."""

import torch
from conftest import TRAIN_COMMON
from test_cocon import cocon_data  # noqa: F401  (the fixture: tiny sentences and an untrained LM)
from test_ddp import TwoRanks


def test_two_ranks_end_identical(cocon_data, tmp_path):  # noqa: F811
    """legacy_ddp (TwoRanks' backend; fairseq's pytorch_ddp wrapper passes device_ids=[0], which torch
    refuses for CPU modules). The criterion computes every loss inside one model forward, as torch's
    DDP needs (tests/test_cocon.py::test_losses_run_inside_one_model_forward)."""
    data, lm = cocon_data
    args = [
        data,
        *TRAIN_COMMON,
        "--task",
        "cocon_generation",
        "--arch",
        "cocon_lm_small",
        "--cocon-lm-path",
        lm,
        "--cocon-sample-mode",
        "lines",  # (the fixture's short sentences)
        "--criterion",
        "cocon",
        "--cocon-cycle-start",
        "1",
        "--cocon-adv-start",
        "2",
        "--cocon-cycle-steps",
        "2",
        "--max-update",
        "5",
        "--max-tokens",
        "300",
        "--save-dir",
        tmp_path / "ckpt",
    ]
    with TwoRanks(tmp_path, args) as ranks:
        ranks.wait()
    for r in range(2):
        assert ranks.returncode(r) == 0, ranks.log(r)[-4000:]
    assert "loss_disc" in ranks.log(0) and "loss_cycle" in ranks.log(0)  # (rank 0 logs)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["num_updates"] == r1["num_updates"] == 5
    assert r0["losses"] == r1["losses"]
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), k
    lm_state = torch.load(lm, weights_only=False)["model"]
    for k, v in lm_state.items():
        assert torch.equal(r0["params"]["decoder.lm." + k.split("decoder.", 1)[1]], v), k
    # the discriminator (the criterion's, with its own optimizer: its gradients averaged over the ranks by hand)
    assert any(k.startswith("discriminator.") for k in r0["criterion"])
    for k in r0["criterion"]:
        assert torch.equal(r0["criterion"][k], r1["criterion"][k]), k
    assert not ranks.leftovers()
