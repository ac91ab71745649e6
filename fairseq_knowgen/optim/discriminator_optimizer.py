"""The optimizer of CoCon's discriminator, apart from fairseq's (Chan et al., ICLR 2021, Section 3.1,
"Adversarial Loss"; the authors' ``traininfer_cocon.py`` gives the discriminator an AdamW, a learning-rate
schedule and a gradient clip of its own, and steps it every ``--disc_update_interval`` steps).

:class:`DiscriminatorOptimizer` holds the discriminator's weights in fp32 (they stay fp32 under fairseq's
``--fp16``), outside fairseq's optimizer and outside torch's DDP (``requires_grad`` False: fairseq builds its
optimizer from the parameters that require gradients, DDP synchronizes only those). Each update in which the
discriminator learns:

1. the ``cocon`` criterion computes ``L_disc`` on detached states and hands it to :meth:`accumulate`, which takes
   its gradient with ``torch.autograd.grad`` (a graph of its own: nothing reaches the CoCon block, and the block's
   loss puts nothing into these weights) and adds it up over the update's batches;
2. after fairseq's step of the block (the ``cocon_generation`` task's ``optimizer_step``), :meth:`step` averages
   the gradients over the batches and over the data-parallel ranks, clips their norm and takes one AdamW step::

       g <- g * min(1, clip / ||g||);   theta <- AdamW(theta, g; lr, betas (0.9, 0.999), eps 1e-8, weight decay 0)

Its state (the weights, AdamW's moments and step count) is part of the criterion's ``state_dict``, which fairseq
saves in every checkpoint and restores on resume (the AdamW state through ``get_extra_state``).
"""

from typing import List, Optional

import torch
import torch.nn as nn


def _data_parallel():
    """``(group, world size)`` of fairseq's data-parallel ranks, or ``(None, 1)`` outside distributed training."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None, 1
    from fairseq.distributed import utils as distributed_utils

    return distributed_utils.get_data_parallel_group(), distributed_utils.get_data_parallel_world_size()


class DiscriminatorOptimizer(nn.Module):
    """A discriminator and its own AdamW (module docstring).

    Args:
        discriminator: the module (its weights become fp32 and stop requiring gradients)
        lr: a fixed learning rate, or None to take the one :meth:`step` is given (the block's, at each update)
        clip_norm: the largest gradient norm (the authors' ``--max_grad_norm``: 1.0); 0 = no clipping
    """

    def __init__(self, discriminator: nn.Module, lr: Optional[float] = None, clip_norm: float = 1.0):
        super().__init__()
        self.discriminator = discriminator.float()
        for p in self.discriminator.parameters():
            p.requires_grad_(False)
        self.lr, self.clip_norm = lr, clip_norm
        self.optimizer: Optional[torch.optim.AdamW] = None
        self._loaded_state = None
        self._grads: Optional[List[torch.Tensor]] = None
        self._batches = 0

    # fairseq turns the criterion to fp16/bf16 under --fp16/--bf16: these weights stay fp32
    def _apply(self, fn, recurse: bool = True):
        """Moves follow the criterion (``.to(device)``, ``.cuda()``); dtype casts do not: fairseq casts the whole
        criterion with ``--fp16`` / ``--bf16`` (``criterion.half()`` applies the cast to every submodule's
        tensors), and the discriminator and its AdamW keep float32 weights."""

        def move_only(t):
            moved = fn(t)
            return moved if moved.dtype == t.dtype else t.to(moved.device)  # the cast dropped, unrounded

        return super()._apply(move_only, recurse)

    def weights(self):
        """A name -> tensor dict of the weights, each a fresh leaf that requires gradients (for one
        ``functional_call`` whose gradient :meth:`accumulate` takes)."""
        return {k: v.detach().requires_grad_() for k, v in self.discriminator.named_parameters()}

    def begin_update(self):
        """Forget the gradients of an earlier update that fairseq did not step (an fp16 overflow, a NaN)."""
        self._grads, self._batches = None, 0

    def accumulate(self, loss: torch.Tensor, weights) -> None:
        """Add the gradient of ``loss`` with respect to ``weights`` (from :meth:`weights`)."""
        grads = torch.autograd.grad(loss, list(weights.values()), allow_unused=True)
        grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, weights.values())]
        self._grads = grads if self._grads is None else [a + b for a, b in zip(self._grads, grads)]
        self._batches += 1

    def step(self, lr: float) -> bool:
        """One AdamW step on the gradients accumulated since :meth:`begin_update` (none: no step). Returns whether
        it stepped."""
        if self._grads is None:
            return False
        params = list(self.discriminator.parameters())
        flat = torch.cat([g.reshape(-1) for g in self._grads]) / self._batches
        group, world = _data_parallel()
        if world > 1:
            torch.distributed.all_reduce(flat, group=group)
            flat = flat / world
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        if self.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
            if self._loaded_state is not None:
                self.optimizer.load_state_dict(self._loaded_state)
                self._loaded_state = None
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr if self.lr else lr
        self.optimizer.step()
        for p in params:
            p.grad = None
        self.begin_update()
        return True

    def get_extra_state(self):
        state = self.optimizer.state_dict() if self.optimizer is not None else self._loaded_state
        return {"adamw": state}

    def set_extra_state(self, state):
        adamw = state.get("adamw") if isinstance(state, dict) else None
        if self.optimizer is not None and adamw is not None:
            self.optimizer.load_state_dict(adamw)
        else:
            self._loaded_state = adamw
