"""Run ``fairseq-train`` and record what it ended with (for test_ddp.py and test_checkpoints.py).

Usage: python tests/ddp_worker.py OUT.pt <fairseq-train arguments>

Saves the final model parameters and the exact (unrounded) training loss of every update,
as aggregated by fairseq over all ranks, to OUT.pt. The Trainer is only observed, not changed.

Faults for the tests of a failing rank, set through the environment:

- ``DDP_WORKER_EXIT_AFTER_UPDATE=N``: after update N the process dies at once with exit code 3
  (``os._exit``: no cleanup, as a crashed or OOM-killed rank);
- ``DDP_WORKER_HANG_AFTER_UPDATE=N``: after update N the process sleeps for an hour without
  exiting (a stuck rank whose sockets stay open).
"""

import os
import sys
import time

import torch
from fairseq import trainer as trainer_module
from fairseq.logging import metrics

captured = {"losses": []}
_init = trainer_module.Trainer.__init__
_step = trainer_module.Trainer.train_step
_reduce = trainer_module.Trainer._reduce_and_log_stats
EXIT_AFTER = int(os.environ.get("DDP_WORKER_EXIT_AFTER_UPDATE", "0"))
HANG_AFTER = int(os.environ.get("DDP_WORKER_HANG_AFTER_UPDATE", "0"))


def init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    captured["trainer"] = self


def train_step(self, *args, **kwargs):
    captured["in_train_step"] = True
    try:
        out = _step(self, *args, **kwargs)
    finally:
        captured["in_train_step"] = False
    n = self.get_num_updates()
    if out is not None and n == EXIT_AFTER:
        print(f"ddp_worker: exiting after update {n} on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    if out is not None and n == HANG_AFTER:
        print(f"ddp_worker: hanging after update {n} on purpose", file=sys.stderr, flush=True)
        time.sleep(3600)
    return out


def reduce_and_log_stats(self, logging_outputs, *args, **kwargs):
    # an aggregator of our own receives the same log_scalar calls as fairseq's (nested
    # aggregators all stay active); its meter keeps the loss unrounded
    with metrics.aggregate() as agg:
        out = _reduce(self, logging_outputs, *args, **kwargs)
    if captured.get("in_train_step") and logging_outputs is not None and "loss" in agg:
        captured["losses"].append(float(agg["loss"].avg))
    return out


if __name__ == "__main__":
    from fairseq_cli import train

    out_path = sys.argv.pop(1)
    trainer_module.Trainer.__init__ = init
    trainer_module.Trainer.train_step = train_step
    trainer_module.Trainer._reduce_and_log_stats = reduce_and_log_stats
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
