"""A resumed run's batches are those of an uninterrupted run (fairseq_knowgen.compat.exact_resume), for every
task the package registers and for fairseq's own tasks run with --user-dir fairseq_knowgen.
The end-to-end check (a training killed in epoch 3 and resumed, torch.equal to an uninterrupted one)
is tests/test_checkpoints.py::test_resume_is_exact."""

import argparse

import numpy as np
import pytest
import torch
from fairseq.data import FairseqDataset
from fairseq.tasks import TASK_REGISTRY, FairseqTask

import fairseq_knowgen  # noqa: F401  (registers the tasks, applies exact_resume)


class EqualLengths(FairseqDataset):
    """60 examples of one length: fairseq's order is then a random permutation under the epoch's
    seed (as with ``--sample-break-mode none``), so any other seed gives other batches."""

    def __init__(self, n=60):
        self.n, self.epochs = n, []

    def __getitem__(self, i):
        return torch.tensor([i])

    def __len__(self):
        return self.n

    def num_tokens(self, i):
        return 4

    def size(self, i):
        return 4

    @property
    def sizes(self):
        return np.full(self.n, 4)

    def ordered_indices(self):
        return np.random.permutation(self.n)

    def collater(self, samples):
        return torch.cat(samples).tolist()

    def set_epoch(self, epoch):
        self.epochs.append(epoch)


def _bare(cls):
    """A task object of ``cls`` with FairseqTask's own state only (no data, no dictionaries)."""
    task = cls.__new__(cls)
    FairseqTask.__init__(task, argparse.Namespace())
    return task


def _iterator(task, dataset, epoch, **kwargs):
    return task.get_batch_iterator(dataset, max_sentences=8, seed=7, epoch=epoch, **kwargs)


def _batches(iterator):
    return [list(map(int, b)) for b in iterator.frozen_batches]


def _epoch(iterator):
    return list(iterator.next_epoch_itr(shuffle=True))


OURS = sorted(name for name, cls in TASK_REGISTRY.items() if cls.__module__.startswith("fairseq_knowgen."))
PLAIN = ["translation", "language_modeling", "masked_lm"]


def test_the_package_registers_tasks():
    assert {"translation_constrained", "eki_generation", "kbert_classification", "cocon_generation"} <= set(OURS)


@pytest.mark.parametrize("name", OURS + PLAIN)
def test_resumed_iterator_has_the_uninterrupted_batches(name):
    """An iterator built fresh for epoch 3 (a run resumed there) yields the batches of epoch 3 of an
    iterator built at epoch 1 and reused, as an uninterrupted run does; the dataset is told epoch 3."""
    cls = TASK_REGISTRY[name]
    uninterrupted = _iterator(_bare(cls), EqualLengths(), 1)
    epochs = [_epoch(uninterrupted) for _ in range(3)]
    assert uninterrupted.epoch == 3
    dataset = EqualLengths()
    resumed = _iterator(_bare(cls), dataset, 3)
    assert resumed.epoch == 3 and dataset.epochs[-1] == 3
    assert _batches(resumed) == _batches(uninterrupted)
    assert _epoch(resumed) == epochs[2]
    # and from the middle of epoch 3, after fairseq restores the position
    resumed = _iterator(_bare(cls), EqualLengths(), 3)
    resumed.load_state_dict({"version": 2, "epoch": 3, "iterations_in_epoch": 2, "shuffle": True})
    assert _epoch(resumed) == epochs[2][2:]


def test_fairseq_alone_rebuilds_other_batches():
    """Without the wrapper, fairseq's own method builds epoch 3's batches under seed + 3: other batches
    (what made a resumed run drift from an uninterrupted one)."""
    original = FairseqTask.get_batch_iterator.__wrapped__
    task = _bare(FairseqTask)
    first = original(task, EqualLengths(), max_sentences=8, seed=7, epoch=1)
    third = original(_bare(FairseqTask), EqualLengths(), max_sentences=8, seed=7, epoch=3)
    assert _batches(first) != _batches(third)


def test_rebuilt_every_epoch_is_left_alone():
    """Where fairseq rebuilds the batches every epoch in both runs (no iterator cache), nothing changes."""
    task = _bare(FairseqTask)
    rebuilt = _iterator(task, EqualLengths(), 3, disable_iterator_cache=True)
    original = FairseqTask.get_batch_iterator.__wrapped__
    assert _batches(rebuilt) == _batches(original(_bare(FairseqTask), EqualLengths(), max_sentences=8, seed=7, epoch=3))
    assert not task.dataset_to_epoch_iter


def test_positional_arguments_reach_fairseq():
    """Callers that pass fairseq's arguments by position (as tasks/cocon_generation.py may) are served."""
    task = _bare(FairseqTask)
    iterator = task.get_batch_iterator(EqualLengths(), None, 8, None, False, 1, 7, 1, 0, 0, 3)
    assert iterator.epoch == 3
    assert _batches(iterator) == _batches(_iterator(_bare(FairseqTask), EqualLengths(), 1))
