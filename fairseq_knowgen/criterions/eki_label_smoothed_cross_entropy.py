"""``eki_label_smoothed_cross_entropy``: label-smoothed NLL + lambda * L_E (EKI, Eq. 6 and 10).

L_E is the binary cross-entropy of the scaling module's Mean(Lambda_v) over channels
against the token labels y_v of :class:`~fairseq_knowgen.data.eki_dataset.SourceAnnotator`,
summed over the labelled source tokens::

    L_E = - sum_v [ y_v log Mean(Lambda_v) + (1 - y_v) log(1 - Mean(Lambda_v)) ]       (Eq. 6)
    loss = L_D (label-smoothed) + lambda * L_E

Labels: y_v = I{s_v in T} of :class:`~fairseq_knowgen.data.eki_dataset.SourceAnnotator`: by
default 1 when the source token's id occurs among the target's ids (the task's
``--eki-label-unit token``; ``word`` compares the words rebuilt from the BPE). Eq. 6 sums over
every s_v in S = [C, O] (Eq. 2) with this one indicator, concepts included, so
``--eki-concept-label target`` (the default) is the paper's; ``always`` labels every concept
token 1, as the authors' released code does (the concepts must all appear in the sentence, but
a concept's token may not: ``run`` vs ``runs``, and then the paper's label is 0). ``<sep>``,
``</s>``, ``<s>`` and padding are left out of L_E and of ``acc_e``: they are no tokens of C or O
(Eq. 2), their labels are trivial (every target ends in ``</s>``, none holds ``<sep>``) and would
only inflate the accuracy.

With the copy head (``--arch eki_* --copy``) use ``eki_force_copy`` (in
:mod:`~fairseq_knowgen.criterions.force_copy`): the force-copy losses in place of L_D, plus
lambda * L_E from this module's :func:`eki_token_loss`. (This criterion on such a model
label-smooths the copy mixture; with ``<unk-N>`` placeholders in the dictionary that
mixture has zeros, and the smoothing term is infinite.)

``--eki-lambda`` is lambda, 0.5 by default: the paper's text gives no value, the authors'
``train2.sh`` uses 0.5 (``--decision-lambda``). L_E is logged per labelled source token (``loss_e``, in bits like
fairseq's losses) with the label accuracy of Mean(Lambda) > 0.5 (``acc_e``). A model
without the scaling module gives no Lambda, and then L_E is 0.
"""

from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from torch import Tensor

from ..modules.group_embedding import CONCEPT_GROUP

CONCEPT_LABEL_CHOICES = ("target", "always")
CONCEPT_LABELS = ChoiceEnum(list(CONCEPT_LABEL_CHOICES))


@dataclass
class EKILossConfig(FairseqDataclass):
    """The options of L_E, shared by this criterion and ``eki_force_copy``."""

    eki_lambda: float = field(
        default=0.5, metadata={"help": "weight lambda of L_E (Eq. 6, 10; default 0.5, the authors' released setting)"}
    )
    eki_concept_label: CONCEPT_LABELS = field(
        default="target",
        metadata={
            "help": "L_E label of concept tokens: 'target' (default, the paper's Eq. 6: 1 only when the token occurs "
            "in the target, as for prototype tokens) or 'always' (1 for every concept token, the authors' code)"
        },
    )


@dataclass
class EKICriterionConfig(LabelSmoothedCrossEntropyCriterionConfig, EKILossConfig):
    pass


def l_e_labels(src_label: Tensor, src_group: Tensor, concept_label: str = "target") -> Tensor:
    """The labels of Eq. 6 under ``--eki-concept-label``; -1 (unlabelled: ``<sep>``, ``</s>``,
    padding) stays -1."""
    if concept_label == "target":
        return src_label
    if concept_label != "always":
        raise ValueError(f"--eki-concept-label must be 'target' or 'always', got {concept_label!r}")
    return src_label.masked_fill(src_group.eq(CONCEPT_GROUP) & src_label.ge(0), 1.0)


def token_classification_loss(lambda_mean, labels):
    """Summed BCE of Mean(Lambda) against labels (-1 = left out); and #correct, #tokens.

    Eq. 6 written out, -[y log p + (1 - y) log(1 - p)], in float32 with p clamped to
    [1e-6, 1 - 1e-6]. Not ``F.binary_cross_entropy``, which CUDA autocast refuses ("unsafe to
    autocast", and fairseq runs criterions inside autocast with ``--amp``); nor the logits form,
    since Mean(Lambda) is a mean of sigmoids, not the sigmoid of one logit."""
    mask = labels.ge(0)
    p = lambda_mean.float().clamp(1e-6, 1 - 1e-6)[mask]
    y = labels[mask].float()
    loss = -(y * p.log() + (1 - y) * torch.log1p(-p)).sum()
    correct = ((p > 0.5).float() == y).sum()
    return loss, correct, mask.sum()


def eki_token_loss(net_output, sample, concept_label: str = "target") -> Optional[Tuple[Tensor, Tensor, Tensor]]:
    """L_E of Eq. 6 for a model output and its sample: (summed BCE, #correct, #labelled
    tokens), or None when there is none (no scaling module, or no ``src_label`` in the sample)."""
    extra = net_output[1]
    lam = extra.get("eki_lambda_mean") if isinstance(extra, dict) else None
    if lam is None or "src_label" not in sample:
        return None
    labels = l_e_labels(sample["src_label"], sample["net_input"]["src_group"], concept_label)
    return token_classification_loss(lam, labels)


def check_concept_label(concept_label) -> str:
    concept_label = str(concept_label)
    if concept_label not in CONCEPT_LABEL_CHOICES:
        raise ValueError(f"--eki-concept-label must be 'target' or 'always', got {concept_label!r}")
    return concept_label


def log_eki_metrics(logging_outputs) -> None:
    """``loss_e`` (bits per labelled source token) and ``acc_e`` from the ``loss_e``,
    ``correct_e`` and ``n_e`` entries of the logging outputs."""
    n = sum(log.get("n_e", 0) for log in logging_outputs)
    if n > 0:
        loss_e = sum(log.get("loss_e", 0) for log in logging_outputs)
        metrics.log_scalar("loss_e", loss_e / n / torch.log(torch.tensor(2.0)).item(), n, round=3)
        metrics.log_scalar("acc_e", sum(log.get("correct_e", 0) for log in logging_outputs) / n, n, round=3)


@register_criterion("eki_label_smoothed_cross_entropy", dataclass=EKICriterionConfig)
class EKILabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        eki_lambda=0.5,
        eki_concept_label="target",
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.eki_lambda = eki_lambda
        self.eki_concept_label = check_concept_label(eki_concept_label)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        l_e = eki_token_loss(net_output, sample, self.eki_concept_label)
        if l_e is not None:
            loss_e, correct, n = l_e
            loss = loss + self.eki_lambda * loss_e
            logging_output.update(loss=loss.data, loss_e=loss_e.data, correct_e=correct.data, n_e=n.data)
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = n_correct.data
            logging_output["total"] = total.data
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        log_eki_metrics(logging_outputs)
