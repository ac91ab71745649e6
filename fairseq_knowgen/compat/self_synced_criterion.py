"""A criterion whose parameters train with their own optimizer stays out of fairseq's DDP wrapper.

fairseq's ``Trainer.criterion`` wraps every criterion that has parameters in the distributed wrapper
(``DistributedFairseqModel``) when more than one rank trains. With ``--ddp-backend pytorch_ddp`` that is torch's
DistributedDataParallel, which refuses a module none of whose parameters requires a gradient
(``RuntimeError: DistributedDataParallel is not needed when a module doesn't have any parameter that requires a
gradient``). The ``cocon`` criterion holds CoCon's discriminator: fairseq must checkpoint it (it saves a criterion's
state only when the criterion has parameters), but fairseq's optimizer and DDP must not train or synchronize it
(its own optimizer averages its gradients over the ranks). A criterion that sets ``self_synced = True`` is used
unwrapped; every other criterion is wrapped as fairseq wraps it.
"""

from fairseq import trainer as _trainer

_criterion = _trainer.Trainer.criterion


def _criterion_unless_self_synced(self):
    if self._wrapped_criterion is None and getattr(self._criterion, "self_synced", False):
        self._wrapped_criterion = self._criterion
    return _criterion.fget(self)


if not getattr(_criterion.fget, "_knowgen_patched", False):
    _criterion_unless_self_synced._knowgen_patched = True
    _trainer.Trainer.criterion = property(_criterion_unless_self_synced)
