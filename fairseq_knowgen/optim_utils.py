"""Holding some parameters out of one fairseq optimizer step.

CoCon's discriminator learns only every ``--cocon-disc-update-freq`` updates (the authors step it
every 5), yet it shares fairseq's one optimizer with the CoCon block (so that it is checkpointed,
scheduled and all-reduced with it). A zero gradient is not a pause: Adam would still move it
through its moments. :func:`no_optimizer_step` makes an update leave the given parameters and their
optimizer state exactly as they were, for each of fairseq's optimizer wrappers:

- fp32 training, ``--memory-efficient-fp16/bf16`` and ``--amp``: the optimizer steps the model's own
  parameters, and fairseq's (and torch's) optimizers skip a parameter whose ``grad`` is None;
- ``--fp16/--bf16`` (fairseq's ``FP16Optimizer``): the step updates fp32 master copies and copies
  them back. Unflattened copies (``--fp16-no-flatten-grads``) get ``grad = None`` as above; in the
  flat master buffer the parameters' slices of the buffer and of every optimizer state tensor
  are saved before the step and written back after it, with the fp16 parameters themselves. (The
  optimizer's shared step count still advances: Adam's bias correction is per buffer there.)
"""

import contextlib
from typing import Iterable

import torch


def _flat_slices(optimizer, params):
    """``(flat buffer, [(start, end)])`` of ``params`` in an FP16Optimizer's flat fp32 master copy."""
    wanted = {id(p) for p in params}
    buffers = optimizer.fp32_params
    if len(buffers) != 1:
        raise NotImplementedError("no_optimizer_step: flat fp32 master parameters on several devices")
    flat = next(iter(buffers.values()))
    slices, offset = [], 0
    for p in optimizer.fp16_params:
        if not p.requires_grad:
            continue
        n = p.numel()
        if id(p) in wanted:
            slices.append((offset, offset + n))
        offset += n
    return flat, slices


@contextlib.contextmanager
def no_optimizer_step(params: Iterable[torch.nn.Parameter], optimizer):
    """Within the block, ``optimizer.step()`` leaves ``params`` and their optimizer state untouched
    (see the module docstring). ``optimizer``: a fairseq optimizer (``FairseqOptimizer`` or one of
    its fp16/AMP wrappers)."""
    params = [p for p in params if p.requires_grad]
    fp32 = getattr(optimizer, "fp32_params", None)
    if fp32 is None or not getattr(optimizer, "has_flat_params", False):
        if fp32 is not None:  # unflattened fp32 master copies, aligned with the fp16 parameters
            index = {id(p): i for i, p in enumerate(optimizer.fp16_params)}
            targets = [fp32[index[id(p)]] for p in params]
        else:
            targets = params
        for p in targets:
            p.grad = None
        yield
        return
    flat, slices = _flat_slices(optimizer, params)
    state = optimizer.fp32_optimizer.optimizer.state.get(flat, {})
    per_elem = {k: v for k, v in state.items() if torch.is_tensor(v) and v.shape == flat.shape}
    saved = [(a, b, flat.data[a:b].clone(), {k: v[a:b].clone() for k, v in per_elem.items()}) for a, b in slices]
    own = [p.data.clone() for p in params]
    yield
    for a, b, values, moments in saved:
        flat.data[a:b] = values
        for k, v in moments.items():
            per_elem[k][a:b] = v
    for p, v in zip(params, own):
        p.data.copy_(v)
