"""``kbert_tagging``: token-level cross-entropy over the sentence characters of K-BERT trees.

Only positions with a tag count (the dataset marks ``<s>``, ``</s>``, padding and every injected
branch token with -100), so injected knowledge never gets a label and never enters the loss (the
original code trained its NER head on labels of injected tokens). ``sample_size`` is the number
of tagged characters.

In validation it also counts strict typed entities (IOB2: ``B-X`` followed by ``I-X`` of the same
type, as seqeval's ``mode="strict"``), so that ``--best-checkpoint-metric f1`` picks the checkpoint
on dev entity F1 (logged as ``f1``, in percent; the recipe's final scores come from seqeval).
"""

import math
from dataclasses import dataclass, field
from typing import Sequence, Set, Tuple

import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..data.kbert_dataset import IGNORE


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


@dataclass
class KBertTaggingConfig(FairseqDataclass):
    tagging_head_name: str = field(default="tagging_head", metadata={"help": "name of the model's tagging head"})


@register_criterion("kbert_tagging", dataclass=KBertTaggingConfig)
class KBertTaggingCriterion(FairseqCriterion):
    def __init__(self, task, tagging_head_name="tagging_head"):
        super().__init__(task)
        self.head = tagging_head_name
        self.labels = getattr(task, "labels", None)

    def forward(self, model, sample, reduce=True):
        logits, _ = model(**sample["net_input"], features_only=True, tagging_head_name=self.head)  # B x T x tags
        target = sample["target"]  # B x T, IGNORE off the sentence characters
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)).float(), target.view(-1), ignore_index=IGNORE, reduction="sum"
        )
        tagged = target.ne(IGNORE)
        sample_size = int(tagged.sum())
        ncorrect = int((logits.argmax(-1).eq(target) & tagged).sum())
        logging_output = {
            "loss": loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": sample_size,
            "ncorrect": ncorrect,
        }
        if self.labels is not None and not model.training:
            logging_output.update(self.entity_counts(logits.argmax(-1), target))
        return loss, sample_size, logging_output

    def entity_counts(self, pred, target) -> dict:
        """Strict typed entities: correct, predicted and gold counts over the tagged positions."""
        tp = n_pred = n_gold = 0
        for p_row, t_row in zip(pred.tolist(), target.tolist()):
            keep = [i for i, t in enumerate(t_row) if t != IGNORE]
            gold = strict_entities([self.labels[t_row[i]] for i in keep])
            guess = strict_entities([self.labels[p_row[i]] for i in keep])
            tp, n_pred, n_gold = tp + len(gold & guess), n_pred + len(guess), n_gold + len(gold)
        return {"entity_tp": tp, "entity_pred": n_pred, "entity_gold": n_gold}

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        size = sum(log.get("sample_size", 0) for log in logging_outputs)
        correct = sum(log.get("ncorrect", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(size, 1) / math.log(2), size, round=3)
        metrics.log_scalar("accuracy", 100.0 * correct / max(size, 1), size, round=2)
        if any("entity_tp" in log for log in logging_outputs):
            for key in ("entity_tp", "entity_pred", "entity_gold"):
                metrics.log_scalar_sum(key, sum(log.get(key, 0) for log in logging_outputs))
            metrics.log_derived(
                "f1",
                # float(): after a multi-rank all-reduce the sums are tensors, which round() refuses
                lambda m: round(
                    float(200.0 * m["entity_tp"].sum / max(m["entity_pred"].sum + m["entity_gold"].sum, 1)), 2
                ),
            )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
