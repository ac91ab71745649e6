"""Run ``fairseq-train`` as one rank and record what it ended with (for test_ddp.py).

Usage: python tests/ddp_worker.py OUT.pt <fairseq-train arguments>

Saves the rank's final model parameters and the loss of every update (as aggregated by
fairseq over all ranks) to OUT.pt. The Trainer is only observed, not changed.
"""

import sys

import torch
from fairseq import trainer as trainer_module
from fairseq_cli import train

captured = {"losses": []}
_init = trainer_module.Trainer.__init__
_step = trainer_module.Trainer.train_step


def init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    captured["trainer"] = self


def train_step(self, *args, **kwargs):
    out = _step(self, *args, **kwargs)
    if out is not None:
        captured["losses"].append(float(out["loss"]))
    return out


if __name__ == "__main__":
    out_path = sys.argv.pop(1)
    trainer_module.Trainer.__init__ = init
    trainer_module.Trainer.train_step = train_step
    train.cli_main()
    t = captured["trainer"]
    torch.save(
        {
            "params": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
            "losses": captured["losses"],
            "num_updates": t.get_num_updates(),
        },
        out_path,
    )
