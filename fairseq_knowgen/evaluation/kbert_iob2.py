"""Valid IOB2 tag sequences for K-BERT's tagger: the allowed transitions and a Viterbi pass over them.

K-BERT's tagger (Liu et al., 2020, the NER experiments) predicts each character's tag on its own
(a softmax per position, as the authors' ``run_kbert_ner.py``), so its argmax can emit ``I-X``
with no ``B-X`` before it, or ``B-X I-Y``. seqeval's strict IOB2 scoring drops such spans. NER
toolkits decode instead the best sequence among the valid ones: with per-position scores
``s_t(y) = log p(y_t = y | x)`` and transitions that are allowed (0) or not (-inf),

    y* = argmax_{y_1..y_T valid}  sum_t s_t(y_t)

found by Viterbi in O(T K^2). Valid IOB2 (seqeval's strict scheme): the first tag is ``O`` or
``B-X``; after ``O`` comes ``O`` or ``B-X``; after ``B-X`` or ``I-X`` comes ``O``, ``B-Y`` or
``I-X`` (the same type). A tag of another form (e.g. ``[ENT]``, the authors' label of injected
tokens) is never chosen. Without any disallowed pair the result is the argmax, so the pass only
changes predictions that strict scoring would partly drop.

``scripts/kbert_score.py --viterbi`` predicts this way (the default is the per-position argmax, the
paper's and the authors' tagger).

Also here: the strict entities of a tag sequence (typed, and untyped through :func:`untyped`), which
the ``kbert_tagging`` criterion counts in validation.
"""

from typing import List, Sequence, Set, Tuple

import torch
from torch import Tensor


def iob2_transitions(labels: Sequence[str]) -> Tuple[Tensor, Tensor]:
    """``(start, allowed)``: bool K (may begin a sequence) and bool K x K (``allowed[i, j]``: tag j
    may follow tag i) of valid IOB2 over ``labels``; tags other than ``O``, ``B-*``, ``I-*`` are
    never allowed."""
    k = len(labels)
    kind = [t if t == "O" else t[:2] if t[:2] in ("B-", "I-") and len(t) > 2 else None for t in labels]
    start = torch.tensor([x in ("O", "B-") for x in kind])
    allowed = torch.zeros(k, k, dtype=torch.bool)
    for i, (a, ta) in enumerate(zip(kind, labels)):
        for j, (b, tb) in enumerate(zip(kind, labels)):
            if a is None or b is None:
                continue
            allowed[i, j] = b in ("O", "B-") or (b == "I-" and a in ("B-", "I-") and ta[2:] == tb[2:])
    return start, allowed


def viterbi(scores: Tensor, start: Tensor, allowed: Tensor) -> Tensor:
    """The best tag sequence under the transition constraints.

    Args:
        scores: T x K per-position scores (log-probabilities)
        start: K bool, tags a sequence may begin with
        allowed: K x K bool, ``allowed[i, j]``: tag j may follow tag i

    Returns:
        T long: the tag ids of the highest-scoring allowed sequence (empty for T = 0)
    """
    t_len, k = scores.shape
    if t_len == 0:
        return torch.zeros(0, dtype=torch.long)
    neg = torch.tensor(float("-inf"), dtype=scores.dtype)
    trans = torch.where(allowed, torch.zeros((), dtype=scores.dtype), neg)  # K x K
    best = torch.where(start, scores[0], neg)  # K: best score of a valid prefix ending in each tag
    back = []
    for t in range(1, t_len):
        total = best.unsqueeze(1) + trans  # K (previous) x K (next)
        best, arg = total.max(dim=0)
        best = best + scores[t]
        back.append(arg)
    path = [int(best.argmax())]
    for arg in reversed(back):
        path.append(int(arg[path[-1]]))
    return torch.tensor(path[::-1], dtype=torch.long)


def strict_entities(tags: Sequence[str]) -> Set[Tuple[int, int, str]]:
    """``(start, end, type)`` of the IOB2 entities of ``tags`` in seqeval's strict mode: ``B-X``
    and the ``I-X`` right after it; an ``I-`` that does not continue a ``B-`` of its type is no entity."""
    out, i, n = set(), 0, len(tags)
    while i < n:
        if tags[i].startswith("B-"):
            kind, j = tags[i][2:], i + 1
            while j < n and tags[j] == "I-" + kind:
                j += 1
            out.add((i, j, kind))
            i = j
        else:
            i += 1
    return out


def untyped(tags: Sequence[str]) -> List[str]:
    """``B-Disease`` -> ``B-ENT``: the spans without their types (``O`` and other tags as they are),
    whose strict entities are span boundaries only: how the authors' ``run_kbert_ner.py`` scores."""
    return [t[:2] + "ENT" if t[:2] in ("B-", "I-") else t for t in tags]
