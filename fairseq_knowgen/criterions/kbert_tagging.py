"""``kbert_tagging``: token-level cross-entropy over the sentence characters of K-BERT trees.

Only positions with a tag count (the dataset marks ``<s>``, ``</s>``, padding and every injected
branch token with -100), so injected knowledge never gets a label and never enters the loss (the
original code trained its NER head on labels of injected tokens). ``sample_size`` is the number
of tagged characters.
"""

import math
from dataclasses import dataclass, field

import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..data.kbert_dataset import IGNORE


@dataclass
class KBertTaggingConfig(FairseqDataclass):
    tagging_head_name: str = field(default="tagging_head", metadata={"help": "name of the model's tagging head"})


@register_criterion("kbert_tagging", dataclass=KBertTaggingConfig)
class KBertTaggingCriterion(FairseqCriterion):
    def __init__(self, task, tagging_head_name="tagging_head"):
        super().__init__(task)
        self.head = tagging_head_name

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
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        size = sum(log.get("sample_size", 0) for log in logging_outputs)
        correct = sum(log.get("ncorrect", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(size, 1) / math.log(2), size, round=3)
        metrics.log_scalar("accuracy", 100.0 * correct / max(size, 1), size, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
