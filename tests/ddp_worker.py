"""Run ``fairseq-train`` and record what it ended with (for test_ddp.py and test_checkpoints.py).

Usage: python tests/ddp_worker.py OUT.pt <fairseq-train arguments>

Saves the final model parameters and the exact (unrounded) training loss of every update,
as aggregated by fairseq over all ranks, to OUT.pt. The Trainer is only observed, not changed.

Faults for the tests of a failing rank, set through the environment:

- ``DDP_WORKER_EXIT_AFTER_UPDATE=N``: after update N the process dies at once with exit code 3
  (``os._exit``: no cleanup, as a crashed or OOM-killed rank);
- ``DDP_WORKER_HANG_AFTER_UPDATE=N``: after update N the process stops itself (SIGSTOP): a stuck
  rank whose sockets stay open and whose own heartbeat thread stops too.

With fairseq's default ``--ddp-backend c10d`` (torch's DistributedDataParallel) on CPU, the worker
drops the ``device_ids=[device_id]`` that fairseq's wrapper always passes and torch refuses for a CPU
module (:class:`CpuDistributedDataParallel`); everything else is torch's DDP as fairseq sets it up,
``find_unused_parameters`` included (off by default).

``DDP_WORKER_PG_TIMEOUT=S`` creates the process groups (the default one and fairseq's global
group) with a timeout of S seconds (torch's default is 30 minutes; fairseq passes none): a
collective that waits longer raises an error.
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from fairseq import trainer as trainer_module
from fairseq.logging import metrics

captured = {"losses": []}
_init = trainer_module.Trainer.__init__
_step = trainer_module.Trainer.train_step
_reduce = trainer_module.Trainer._reduce_and_log_stats
EXIT_AFTER = int(os.environ.get("DDP_WORKER_EXIT_AFTER_UPDATE", "0"))
HANG_AFTER = int(os.environ.get("DDP_WORKER_HANG_AFTER_UPDATE", "0"))
PG_TIMEOUT = int(os.environ.get("DDP_WORKER_PG_TIMEOUT", "0"))
_init_process_group = dist.init_process_group
_new_group = dist.new_group


def init_process_group(*args, **kwargs):
    return _init_process_group(*args, timeout=timedelta(seconds=PG_TIMEOUT), **kwargs)


def new_group(*args, **kwargs):
    # fairseq's collectives run on a group of its own (distributed_utils.get_global_group)
    return _new_group(*args, timeout=timedelta(seconds=PG_TIMEOUT), **kwargs)


class CpuDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch's DDP without ``device_ids``/``output_device`` for a CPU module (torch takes None there)."""

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


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
        print(f"ddp_worker: exiting after update {n} on purpose at {time.time()}", file=sys.stderr, flush=True)
        os._exit(3)
    if out is not None and n == HANG_AFTER:
        print(f"ddp_worker: stopping after update {n} on purpose at {time.time()}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
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
    from fairseq.models import distributed_fairseq_model

    distributed_fairseq_model.DistributedDataParallel = CpuDistributedDataParallel
    if "--data-buffer-size" not in sys.argv:  # no prefetch thread to abort a short run at exit (conftest.py)
        from conftest import NO_PREFETCH_THREAD

        sys.argv += NO_PREFETCH_THREAD
    trainer_module.Trainer.__init__ = init
    trainer_module.Trainer.train_step = train_step
    trainer_module.Trainer._reduce_and_log_stats = reduce_and_log_stats
    if PG_TIMEOUT > 0:
        dist.init_process_group = init_process_group
        dist.new_group = new_group
    train.cli_main()
    t = captured["trainer"]
    torch.save(
        {
            "params": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
            # a criterion's own trained state (CoCon's discriminator), outside the model
            "criterion": {k: v.detach().clone() for k, v in t.criterion.state_dict().items() if torch.is_tensor(v)},
            "losses": captured["losses"],
            "num_updates": t.get_num_updates(),
            # the data-parallel wrapper fairseq put around the model (inside its ModuleProxyWrapper)
            "wrapper": type(getattr(t.model, "module", t.model)).__name__,
        },
        out_path,
    )
