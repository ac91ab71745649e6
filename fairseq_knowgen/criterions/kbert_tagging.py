"""``kbert_tagging``: token-level cross-entropy over the sentence characters of K-BERT trees.

Only positions with a tag count (the dataset marks ``<s>``, ``</s>``, padding and every injected
branch token with -100), so injected knowledge never gets a label and never enters the loss (the
paper tags the sentence's characters). The authors' ``run_kbert_ner.py`` labels injected tokens
``[ENT]`` and trains on them: ``--kg-injected-label ent`` of the ``kbert_tagging`` task; their
positions then count in the loss and ``sample_size`` (as in the authors' loss), never in the
entity counts, and ``[ENT]`` is never predicted for a character. ``sample_size`` is the number of
tagged positions.

In validation it also counts strict typed entities (IOB2: ``B-X`` followed by ``I-X`` of the same
type, as seqeval's ``mode="strict"``), so that ``--best-checkpoint-metric f1`` picks the checkpoint
on dev entity F1 (logged as ``f1``, in percent; the recipe's final scores come from seqeval), and
the same without types (``span_f1``: span boundaries only, how the authors' code scores NER).
"""

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..data.kbert_dataset import ENT, IGNORE
from ..evaluation.kbert_iob2 import strict_entities, untyped


def _f1(name: str, meters) -> float:
    """F1 in percent of the summed ``{name}_tp/_pred/_gold`` meters; float(): after a multi-rank
    all-reduce the sums are tensors, which round() refuses."""
    tp, n_pred, n_gold = (meters[f"{name}_{k}"].sum for k in ("tp", "pred", "gold"))
    return round(float(200.0 * tp / max(n_pred + n_gold, 1)), 2)


@dataclass
class KBertTaggingConfig(FairseqDataclass):
    tagging_head_name: str = field(default="tagging_head", metadata={"help": "name of the model's tagging head"})


@register_criterion("kbert_tagging", dataclass=KBertTaggingConfig)
class KBertTaggingCriterion(FairseqCriterion):
    def __init__(self, task, tagging_head_name="tagging_head"):
        super().__init__(task)
        self.head = tagging_head_name
        self.labels = getattr(task, "labels", None)
        self.ent = self.labels.index(ENT) if self.labels is not None and ENT in self.labels else None

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
            scores = logits.detach()
            if self.ent is not None:  # a character is never [ENT]
                scores = scores.index_fill(-1, scores.new_tensor([self.ent], dtype=torch.long), float("-inf"))
            logging_output.update(self.entity_counts(scores.argmax(-1), target))
        return loss, sample_size, logging_output

    def entity_counts(self, pred, target) -> dict:
        """Strict entities, typed (``entity_*``) and untyped (``span_*``): correct, predicted and
        gold counts over the sentence's characters (tagged positions other than ``[ENT]``)."""
        counts = dict.fromkeys(("entity_tp", "entity_pred", "entity_gold", "span_tp", "span_pred", "span_gold"), 0)
        for p_row, t_row in zip(pred.tolist(), target.tolist()):
            keep = [i for i, t in enumerate(t_row) if t != IGNORE and t != self.ent]
            gold_tags = [self.labels[t_row[i]] for i in keep]
            pred_tags = [self.labels[p_row[i]] for i in keep]
            for name, typed in (("entity", True), ("span", False)):
                gold = strict_entities(gold_tags if typed else untyped(gold_tags))
                guess = strict_entities(pred_tags if typed else untyped(pred_tags))
                counts[f"{name}_tp"] += len(gold & guess)
                counts[f"{name}_pred"] += len(guess)
                counts[f"{name}_gold"] += len(gold)
        return counts

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        size = sum(log.get("sample_size", 0) for log in logging_outputs)
        correct = sum(log.get("ncorrect", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(size, 1) / math.log(2), size, round=3)
        metrics.log_scalar("accuracy", 100.0 * correct / max(size, 1), size, round=2)
        if any("entity_tp" in log for log in logging_outputs):
            for name, derived in (("entity", "f1"), ("span", "span_f1")):
                for key in (f"{name}_tp", f"{name}_pred", f"{name}_gold"):
                    metrics.log_scalar_sum(key, sum(log.get(key, 0) for log in logging_outputs))
                metrics.log_derived(derived, functools.partial(_f1, name))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
