#!/usr/bin/env python
"""CPU time of one training step (criterion forward + backward) of a copy model's checkpoint on real batches, with
the copy head's full-vocabulary mixture (as before the training fix) and at the targets only (now), against a model
without the copy head; interleaved rounds in one process, ``time.process_time``::

    OMP_NUM_THREADS=1 python dev/profile_copy_step.py \\
        work/commongen/runs/eki-copy-60/checkpoints/checkpoint_last.pt \\
        work/commongen/runs/eki-60/checkpoints/checkpoint_last.pt

Batches: the first ``--batches`` of each checkpoint's own data's valid split at its training ``--max-tokens``.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from fairseq import checkpoint_utils, tasks  # noqa: E402

import fairseq_knowgen  # noqa: E402,F401  (registers the models)
from fairseq_knowgen.modules.copy_generator import CopyGenerator  # noqa: E402


def setup(ckpt: str, n: int):
    cfg = checkpoint_utils.load_checkpoint_to_cpu(ckpt)["cfg"]
    cfg.task.data = os.path.realpath(cfg.task.data)
    task = tasks.setup_task(cfg.task)
    model, crit = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=cfg.dataset.max_tokens, seed=1)
    itr = itr.next_epoch_itr(shuffle=False)
    return model.train(), crit, [next(itr) for _ in range(n)]


def step_seconds(model, crit, batches) -> float:
    t = time.process_time()
    for b in batches:
        loss, _, _ = crit(model, b)
        loss.backward()
        model.zero_grad()
    return (time.process_time() - t) / len(batches)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("copy_checkpoint")
    p.add_argument("plain_checkpoint", help="the same kind of model without --copy")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    copy_run, plain_run = setup(a.copy_checkpoint, a.batches), setup(a.plain_checkpoint, a.batches)
    targets_only = CopyGenerator.forward

    def full(self, *args, **kw):  # the mixture over the whole vocabulary, also in training
        return targets_only(self, *args, **{**kw, "full": True})

    res = {"full": [], "targets": [], "plain": []}
    for _ in range(a.rounds):
        CopyGenerator.forward = full
        res["full"].append(step_seconds(*copy_run))
        CopyGenerator.forward = targets_only
        res["targets"].append(step_seconds(*copy_run))
        res["plain"].append(step_seconds(*plain_run))
    b = {k: min(v) for k, v in res.items()}
    print(
        f"cpu s/step (best of {a.rounds}): full mixture {b['full']:.2f}, targets only {b['targets']:.2f}, "
        f"without copy {b['plain']:.2f}; speed-up {b['full'] / b['targets']:.2f}x"
    )


if __name__ == "__main__":
    main()
