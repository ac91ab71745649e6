"""``force_copy``: losses of the pointer-generator with supervised copy switch.

Paper text: ``shared/seeds/force_copy.txt``. For target word w*_t, copy attention alpha_t,
switch p_gen and the mixture P (Eq. 6), ``--copy-supervision`` selects:

- ``none`` (See et al.): loss = -log P(w*_t)                                    (Eq. 7)
- ``force``: loss = loss_vocab + loss_attn + loss_pgen                          (Eq. 8)
    loss_vocab = -log P_vocab(w*_t)                                             (Eq. 9)
    loss_attn  = -log sum_{i: x_i = w*_t} alpha_{t,i}   (only when w*_t is in X) (Eq. 10)
    loss_pgen  = -log(1 - p_gen) if w*_t in X, else -log p_gen                   (Eq. 11)
- ``force-unk``: as ``force`` but loss_pgen copies only when w*_t is in X and *not* in the
  target vocabulary V (an ``<unk>`` / ``<unk-N>`` placeholder)                  (Eq. 12)

"w*_t in X" means the target id occurs among the copyable source ids (not pad/EOS/BOS).
Eq. 10 is undefined when w*_t is not in the source (log 0); the term is taken over the
steps where it is defined, which is what "use attention as a guide for copying" means.
Each term is weighted by a flag and logged on its own, with the share of copy steps
(copy label 1) and the mean p_gen. ``nll_loss`` is always -log P(w*_t) of the mixture, so
the modes can be compared on the distribution used for decoding.
"""

from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from ..models.copy_transformer import placeholder_mask, special_symbols_mask

COPY_SUPERVISION = ChoiceEnum(["none", "force", "force-unk"])


@dataclass
class ForceCopyConfig(FairseqDataclass):
    copy_supervision: COPY_SUPERVISION = field(
        default="force", metadata={"help": "none: mixture NLL (Eq. 7); force: Eq. 8-11; force-unk: Eq. 12"}
    )
    vocab_loss_weight: float = field(default=1.0, metadata={"help": "weight of loss_vocab (Eq. 9)"})
    attn_loss_weight: float = field(default=1.0, metadata={"help": "weight of loss_attn (Eq. 10)"})
    pgen_loss_weight: float = field(default=1.0, metadata={"help": "weight of loss_pgen (Eq. 11/12)"})
    sentence_avg: bool = II("optimization.sentence_avg")


def force_copy_terms(probs, vocab_probs, p_gen, copy_attn, src_tokens, target, copyable, is_oov, eps=1e-10):
    """Per-step terms, each ``B x T``: mixture NLL, loss_vocab, loss_attn (0 where w* is not
    in the source), the force and force-unk copy labels, and the source-match mask."""
    match = (src_tokens.unsqueeze(1) == target.unsqueeze(2)) & copyable.unsqueeze(1)  # B x T x S
    in_src = match.any(-1)
    attn_on_target = (copy_attn * match).sum(-1)
    p_gen = p_gen.squeeze(-1)
    nll = -probs.gather(-1, target.unsqueeze(-1)).squeeze(-1).clamp_min(eps).log()
    vocab = -vocab_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1).clamp_min(eps).log()
    attn = torch.where(in_src, -attn_on_target.clamp_min(eps).log(), torch.zeros_like(attn_on_target))
    return {
        "nll": nll,
        "vocab": vocab,
        "attn": attn,
        "in_src": in_src,
        "copy_force": in_src,
        "copy_force_unk": in_src & is_oov[target],
        "p_gen": p_gen,
    }


def switch_loss(p_gen, copy_label, eps=1e-10):
    """-log(1 - p_gen) where the label says copy, -log p_gen elsewhere (Eq. 11/12)."""
    return -torch.where(copy_label, (1.0 - p_gen).clamp_min(eps).log(), p_gen.clamp_min(eps).log())


@register_criterion("force_copy", dataclass=ForceCopyConfig)
class ForceCopyCriterion(FairseqCriterion):
    def __init__(self, task, copy_supervision, vocab_loss_weight, attn_loss_weight, pgen_loss_weight, sentence_avg):
        super().__init__(task)
        self.mode = str(copy_supervision)
        self.weights = (vocab_loss_weight, attn_loss_weight, pgen_loss_weight)
        self.sentence_avg = sentence_avg
        self.register_buffer("special", special_symbols_mask(task.target_dictionary), persistent=False)
        self.register_buffer("is_oov", placeholder_mask(task.target_dictionary), persistent=False)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        probs, extra = net_output
        for key in ("p_gen", "copy_attn", "vocab_probs"):
            if key not in extra:
                raise ValueError(f"force_copy needs a copy model (--arch copy_transformer*): no '{key}' in output")
        target = model.get_targets(sample, net_output)
        src_tokens = sample["net_input"]["src_tokens"]
        copyable = ~self.special[src_tokens]
        t = force_copy_terms(
            probs, extra["vocab_probs"], extra["p_gen"], extra["copy_attn"], src_tokens, target, copyable, self.is_oov
        )
        mask = target.ne(self.padding_idx)
        if self.mode == "none":
            per_step = t["nll"]
            pgen_loss = torch.zeros_like(t["nll"])
            copy_label = t["in_src"]
        else:
            copy_label = t["copy_force"] if self.mode == "force" else t["copy_force_unk"]
            pgen_loss = switch_loss(t["p_gen"], copy_label)
            wv, wa, wp = self.weights
            per_step = wv * t["vocab"] + wa * t["attn"] + wp * pgen_loss

        def total(x):
            return (x * mask).sum()

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
            "p_gen_sum": total(t["p_gen"]).data,
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
