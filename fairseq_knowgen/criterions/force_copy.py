"""``force_copy``: losses of the pointer-generator with supervised copy switch.

"May the Force Be with Your Copy Mechanism: Enhanced Supervised-Copy Method for Natural
Language Generation". For target word w*_t, copy attention alpha_t, switch p_gen and the
mixture P (Eq. 6), ``--copy-supervision`` selects:

- ``none`` (See et al.): loss = -log P(w*_t)                                    (Eq. 7)
- ``force``: loss = loss_vocab + loss_attn + loss_pgen                          (Eq. 8)
    loss_vocab = -log P_vocab(w*_t)                                             (Eq. 9)
    loss_attn  = -log sum_{i: x_i = w*_t} alpha_{t,i}   (only when w*_t is in X) (Eq. 10)
    loss_pgen  = -log(1 - p_gen) if w*_t in X, else -log p_gen                   (Eq. 11)
- ``force-unk``: as ``force`` but loss_pgen copies only when w*_t is in X and *not* in the
  target vocabulary V (an ``<unk-N>`` placeholder)                              (Eq. 12)

"w*_t in X" means the target id occurs among the copyable source ids: not pad/EOS/BOS and
not ``<unk>`` (two ``<unk>`` stand for unknown words that need not be the same, so a target
``<unk>`` is never a copy candidate), whatever alpha the model copies with (``--copy-alpha``:
with raw alpha, Eq. 6 and so the mixture NLL also give P(EOS) the attention on the source's
EOS, but EOS is no word of X to force a copy of). Eq. 10 is undefined when w*_t is not in the
source (log 0); the term is taken over the steps where it is defined, which is what "use
attention as a guide for copying" means.

The ``<unk-N>`` placeholders are outside the fixed vocabulary, so P_vocab(<unk-N>) = 0 and
Eq. 9 cannot be their own log-probability. ``--oov-vocab-target`` says what loss_vocab does
at such a step: ``unk`` (default) uses -log P_vocab(<unk>), as the paper says after Eq. 9
("P_vocab(w*_t) indicates the probability of generating the unknown token if w*_t is
OOV"); ``skip`` leaves the step out of loss_vocab. A placeholder target missing from its
source (a source truncated after the placeholders were made) has P(w*_t) = 0: such steps
are left out of the mixture NLL (``none`` and the logged ``nll_loss``), which would be
infinite there.

All terms are computed in log space from the decoder's log P, log P_vocab and the switch
logit z (log p_gen = logsigmoid(z), log(1 - p_gen) = logsigmoid(-z)); the copy mass of
Eq. 10 is floored at float32's smallest normal number (~1e-38). Each term is weighted by a
flag and logged on its own, with the share of copy steps (copy label 1) and the mean p_gen.
``nll_loss`` is always -log P(w*_t) of the mixture, so the modes can be compared on the
distribution used for decoding.

``eki_force_copy`` (:class:`EKIForceCopyCriterion`) is this loss plus EKI's lambda * L_E
(EKI Eq. 6 and 10, ``--eki-lambda``, ``--eki-concept-label``), for ``--arch eki_* --copy``.
Which source positions count as copyable ("w*_t in X") is the model's own mask when its
output gives one (``copyable``: EKI's also leaves out ``<sep>``), and the positions of Eq. 6's
sum are the model's ``copy_support`` (all non-pad ones with raw alpha), so model and loss agree.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from ..models.copy_transformer import placeholder_mask, uncopyable_mask
from ..modules.copy_generator import mixture_lprobs_at
from .eki_label_smoothed_cross_entropy import EKILossConfig, check_concept_label, eki_token_loss, log_eki_metrics

COPY_SUPERVISION = ChoiceEnum(["none", "force", "force-unk"])
OOV_VOCAB_TARGET = ChoiceEnum(["unk", "skip"])


@dataclass
class ForceCopyConfig(FairseqDataclass):
    copy_supervision: COPY_SUPERVISION = field(
        default="force", metadata={"help": "none: mixture NLL (Eq. 7); force: Eq. 8-11; force-unk: Eq. 12"}
    )
    vocab_loss_weight: float = field(default=1.0, metadata={"help": "weight of loss_vocab (Eq. 9)"})
    attn_loss_weight: float = field(default=1.0, metadata={"help": "weight of loss_attn (Eq. 10)"})
    pgen_loss_weight: float = field(default=1.0, metadata={"help": "weight of loss_pgen (Eq. 11/12)"})
    oov_vocab_target: OOV_VOCAB_TARGET = field(
        default="unk",
        metadata={
            "help": "loss_vocab (Eq. 9) when the target is an <unk-N> placeholder (outside the fixed vocabulary): "
            "unk: -log P_vocab(<unk>), as the paper says after Eq. 9; skip: no loss_vocab at that step"
        },
    )
    sentence_avg: bool = II("optimization.sentence_avg")


def force_copy_terms(
    lprobs,
    vocab_lprobs,
    p_gen_logit,
    copy_attn,
    src_tokens,
    target,
    copyable,
    placeholders,
    unk,
    oov_vocab_target="unk",
    support=None,
):
    """Per-step terms, each ``B x T``.

    Args:
        lprobs, vocab_lprobs: log P (Eq. 6) and log P_vocab (Eq. 4), ``B x T x V``; ``lprobs``
            None (a copy decoder in training mode): log P(w*) from the other terms
            (:func:`~fairseq_knowgen.modules.copy_generator.mixture_lprobs_at`)
        p_gen_logit: z of Eq. 5, ``B x T x 1``; copy_attn: alpha, ``B x T x S``
        src_tokens: ``B x S``; target: ``B x T``; copyable: ``B x S`` bool
        placeholders: ``V`` bool, the ``<unk-N>`` ids; unk: the ``<unk>`` id
        oov_vocab_target: ``unk`` or ``skip`` (see ``--oov-vocab-target``)
        support: ``B x S`` bool, the positions of Eq. 6's sum (the model's ``copy_support``), for
            log P(w*) when ``lprobs`` is None; None: ``copyable``
    Returns:
        dict of ``nll`` (-log P(w*), 0 where not ``reachable``), ``vocab`` (Eq. 9), ``attn``
        (Eq. 10, 0 where w* is not in the source), ``in_src``, the copy labels
        ``copy_force`` (Eq. 11) and ``copy_force_unk`` (Eq. 12), and ``p_gen_logit``.
    """
    match = (src_tokens.unsqueeze(1) == target.unsqueeze(2)) & copyable.unsqueeze(1)  # B x T x S
    in_src = match.any(-1)
    is_placeholder = placeholders[target]
    reachable = in_src | ~is_placeholder  # P(w*) > 0: placeholders only by copying
    if lprobs is None:
        support = copyable if support is None else support
        gathered = mixture_lprobs_at(target, vocab_lprobs, p_gen_logit, copy_attn, src_tokens, support)
    else:
        gathered = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    nll = torch.where(reachable, -gathered, torch.zeros_like(gathered))
    vocab_target = torch.where(is_placeholder, torch.full_like(target, unk), target)
    vocab = -vocab_lprobs.gather(-1, vocab_target.unsqueeze(-1)).squeeze(-1)
    if oov_vocab_target == "skip":
        vocab = torch.where(is_placeholder, torch.zeros_like(vocab), vocab)
    attn_on_target = (copy_attn * match).sum(-1).clamp_min(torch.finfo(copy_attn.dtype).tiny)
    attn = torch.where(in_src, -attn_on_target.log(), torch.zeros_like(attn_on_target))
    return {
        "nll": nll,
        "reachable": reachable,
        "vocab": vocab,
        "attn": attn,
        "in_src": in_src,
        "copy_force": in_src,
        "copy_force_unk": in_src & (is_placeholder | target.eq(unk)),
        "p_gen_logit": p_gen_logit.squeeze(-1),
    }


def switch_loss(p_gen_logit, copy_label):
    """-log(1 - p_gen) = -logsigmoid(-z) where the label says copy, -log p_gen =
    -logsigmoid(z) elsewhere (Eq. 11/12), z the switch logit of Eq. 5."""
    return -F.logsigmoid(torch.where(copy_label, -p_gen_logit, p_gen_logit))


@register_criterion("force_copy", dataclass=ForceCopyConfig)
class ForceCopyCriterion(FairseqCriterion):
    def __init__(
        self,
        task,
        copy_supervision,
        vocab_loss_weight,
        attn_loss_weight,
        pgen_loss_weight,
        sentence_avg,
        oov_vocab_target="unk",
    ):
        super().__init__(task)
        self.mode = str(copy_supervision)
        self.weights = (vocab_loss_weight, attn_loss_weight, pgen_loss_weight)
        self.sentence_avg = sentence_avg
        self.oov_vocab_target = str(oov_vocab_target)
        self.unk = task.target_dictionary.unk()
        self.register_buffer("uncopyable", uncopyable_mask(task.target_dictionary), persistent=False)
        self.register_buffer("placeholders", placeholder_mask(task.target_dictionary), persistent=False)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, sample_size, logging_output = self.copy_loss(model, net_output, sample)
        return loss, sample_size, logging_output

    def copy_loss(self, model, net_output, sample):
        """The loss of ``--copy-supervision`` summed over the target steps, the sample size
        and the logging output (each term summed on its own)."""
        extra = net_output[1]
        for key in ("p_gen", "p_gen_logit", "copy_attn", "vocab_lprobs"):
            if key not in extra:
                raise ValueError(
                    f"{self.__class__.__name__} needs a copy model (--arch copy_transformer*, or eki_* with --copy): "
                    f"no '{key}' in output"
                )
        target = model.get_targets(sample, net_output)
        src_tokens = extra.get("src_tokens", sample["net_input"]["src_tokens"])  # the ids copy_attn points at
        # the model's own mask when it gives one (EKI's also keeps <sep> out), else pad/EOS/BOS/<unk>
        copyable = extra["copyable"] if "copyable" in extra else ~self.uncopyable[src_tokens]
        # log P(w*) at the targets from the extras (the first output is the mixture's logits, or None)
        t = force_copy_terms(
            None,
            extra["vocab_lprobs"],
            extra["p_gen_logit"],
            extra["copy_attn"],
            src_tokens,
            target,
            copyable,
            self.placeholders,
            self.unk,
            self.oov_vocab_target,
            support=extra.get("copy_support", copyable),
        )
        mask = target.ne(self.padding_idx)
        if self.mode == "none":
            per_step = t["nll"]
            pgen_loss = torch.zeros_like(t["nll"])
            copy_label = t["in_src"]
        else:
            copy_label = t["copy_force"] if self.mode == "force" else t["copy_force_unk"]
            pgen_loss = switch_loss(t["p_gen_logit"], copy_label)
            wv, wa, wp = self.weights
            per_step = wv * t["vocab"] + wa * t["attn"] + wp * pgen_loss

        def total(x):  # over non-pad steps (masked_fill, not a product: no NaN from a pad step)
            return x.masked_fill(~mask, 0).sum()

        loss = total(per_step)
        ntokens = sample["ntokens"]
        sample_size = sample["target"].size(0) if self.sentence_avg else ntokens
        logging_output = {
            "loss": loss.data,
            "nll_loss": total(t["nll"]).data,
            "loss_vocab": total(t["vocab"]).data,
            "loss_attn": total(t["attn"]).data,
            "loss_pgen": total(pgen_loss).data,
            "copy_steps": total(copy_label.float()).data,
            "p_gen_sum": total(extra["p_gen"].squeeze(-1)).data,
            "ntokens": ntokens,
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def s(k):
            return sum(log.get(k, 0) for log in logging_outputs)

        ntokens, sample_size = s("ntokens"), s("sample_size")
        metrics.log_scalar("loss", s("loss") / sample_size / torch.log(torch.tensor(2.0)).item(), sample_size, round=3)
        for k in ("nll_loss", "loss_vocab", "loss_attn", "loss_pgen"):
            metrics.log_scalar(k, s(k) / ntokens / torch.log(torch.tensor(2.0)).item(), ntokens, round=3)
        metrics.log_scalar("copy_share", s("copy_steps") / ntokens, ntokens, round=3)
        metrics.log_scalar("p_gen", s("p_gen_sum") / ntokens, ntokens, round=3)
        metrics.log_derived("ppl", lambda m: 2 ** m["nll_loss"].avg)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


@dataclass
class EKIForceCopyConfig(ForceCopyConfig, EKILossConfig):
    pass


@register_criterion("eki_force_copy", dataclass=EKIForceCopyConfig)
class EKIForceCopyCriterion(ForceCopyCriterion):
    """EKI with the copy head (``--arch eki_* --copy``): the ``force_copy`` loss of
    ``--copy-supervision`` (Eq. 7, or Eq. 8-12) in place of EKI's L_D, plus lambda * L_E of
    the scaling module (EKI Eq. 6 and 10)::

        loss = loss_copy + eki_lambda * L_E

    Both parts come from the code of their own criterion (:meth:`ForceCopyCriterion.copy_loss`,
    :func:`~fairseq_knowgen.criterions.eki_label_smoothed_cross_entropy.eki_token_loss`);
    each term is logged on its own (``nll_loss``, ``loss_vocab``, ``loss_attn``, ``loss_pgen``,
    ``copy_share``, ``p_gen``; ``loss_e``, ``acc_e``). ``loss`` is the sum, per target token
    (or sentence with ``--sentence-avg``) as in both parents. Without a scaling module
    (``--eki-scaling 0``) L_E is 0, and the criterion is ``force_copy``.
    """

    def __init__(
        self,
        task,
        copy_supervision,
        vocab_loss_weight,
        attn_loss_weight,
        pgen_loss_weight,
        sentence_avg,
        oov_vocab_target="unk",
        eki_lambda=1.0,
        eki_concept_label="target",
    ):
        super().__init__(
            task,
            copy_supervision,
            vocab_loss_weight,
            attn_loss_weight,
            pgen_loss_weight,
            sentence_avg,
            oov_vocab_target,
        )
        self.eki_lambda = eki_lambda
        self.eki_concept_label = check_concept_label(eki_concept_label)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, sample_size, logging_output = self.copy_loss(model, net_output, sample)
        l_e = eki_token_loss(net_output, sample, self.eki_concept_label)
        if l_e is not None:
            loss_e, correct, n = l_e
            loss = loss + self.eki_lambda * loss_e
            logging_output.update(loss=loss.data, loss_e=loss_e.data, correct_e=correct.data, n_e=n.data)
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        ForceCopyCriterion.reduce_metrics(logging_outputs)
        log_eki_metrics(logging_outputs)
