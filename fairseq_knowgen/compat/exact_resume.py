"""Exact resume across epochs: a resumed run trains on the batches an uninterrupted run trains on.

fairseq 0.12 builds a training epoch's batches in ``FairseqTask.get_batch_iterator``: it orders
the examples by size under ``numpy_seed(seed + epoch)`` (``dataset.ordered_indices()`` breaks
ties between equal sizes by a random permutation; ``--sample-break-mode none`` makes every size
equal, so the whole order is random) and cuts them into batches. When the dataset allows it
(``can_reuse_epoch_itr_across_epochs``, true for fairseq's datasets) the resulting
``EpochBatchIterator`` is cached and reused for every later epoch, which only reshuffles these
*frozen* batches under ``seed + epoch``.

So an uninterrupted run trains every epoch on the batches built for epoch 1, while a run resumed
in (or at the start of) epoch ``e > 1`` (``checkpoint_utils.load_checkpoint`` calls
``trainer.get_train_iterator(epoch=e)``) builds them anew under ``seed + e``: other examples share
a batch, and parameters drift from the uninterrupted run from the first update after the restart
(without this module, 45 of 47 tensors differed after a resume in epoch 2).

:func:`batches_as_first_built` wraps ``get_batch_iterator`` so that an iterator that fairseq
will cache is always built as at epoch 1 (the dataset's ``set_epoch(1)`` and ``seed + 1``, as
the uninterrupted run built it) and then moved to the requested epoch (``iterator.epoch`` and the
dataset's ``set_epoch``). fairseq then restores the position in the epoch and shuffles under
``seed + epoch`` as before. A fresh run is unchanged (it builds at epoch 1 anyway), and so is
every case where fairseq rebuilds the batches each epoch in both runs (sharded data,
``--update-epoch-batch-itr``/``--grouped-shuffling``, a dataset that cannot reuse its
iterator, the task config's ``rebuild_batches``).

Importing this package applies it to ``FairseqTask.get_batch_iterator`` itself, so it holds
for every task that reaches fairseq's method (the package's tasks, and fairseq's own
``translation``, ``language_modeling``, ``masked_lm``... run with ``--user-dir fairseq_knowgen``,
as the recipes do). It cannot hold for:

- a run without ``--user-dir fairseq_knowgen``: fairseq never imports the package, so no code of
  it runs; such a run resumed after epoch 1 trains on other batches than an uninterrupted one;
- a task that overrides ``get_batch_iterator`` without calling ``super()``
  (fairseq's ``translation_multi_simple_epoch``);
- ``--update-ordered-indices-seed``: the trainer then passes ``seed = common.seed + epoch``, which
  the task cannot tell from a plain ``--seed``, so the iterator's own shuffle seed differs.

Nothing new is stored in a checkpoint: one written without this module resumes exactly too.
"""

import functools
import inspect
import logging

from fairseq.tasks import FairseqTask

logger = logging.getLogger(__name__)


def _cached(task, args) -> bool:
    """Whether fairseq caches the iterator it builds with these arguments (its own test)."""
    return (
        not args.get("disable_iterator_cache", False)
        and not args.get("update_epoch_batch_itr", False)
        and task.can_reuse_epoch_itr(args["dataset"])
        and not getattr(task.cfg, "rebuild_batches", False)
    )


def batches_as_first_built(get_batch_iterator):
    """``get_batch_iterator`` building an iterator that fairseq caches across epochs as at
    epoch 1, whatever ``epoch`` it is asked for (see the module's docstring)."""
    if getattr(get_batch_iterator, "_batches_as_first_built", False):
        return get_batch_iterator
    signature = inspect.signature(get_batch_iterator)

    @functools.wraps(get_batch_iterator)
    def wrapper(task, *args, **kwargs):
        bound = signature.bind(task, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        epoch, dataset = given["epoch"], given["dataset"]
        if epoch <= 1 or dataset in task.dataset_to_epoch_iter or not _cached(task, given):
            return get_batch_iterator(*bound.args, **bound.kwargs)
        logger.info(f"epoch {epoch}: batches built as at epoch 1, as an uninterrupted run has them (exact resume)")
        given["epoch"] = 1
        iterator = get_batch_iterator(*bound.args, **bound.kwargs)
        iterator.epoch = epoch
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        return iterator

    wrapper._batches_as_first_built = True
    return wrapper


def install():
    """Apply :func:`batches_as_first_built` to ``FairseqTask.get_batch_iterator`` (once)."""
    FairseqTask.get_batch_iterator = batches_as_first_built(FairseqTask.get_batch_iterator)


install()
