"""``--optimizer kbert_adam``: fairseq's Adam with the settings of K-BERT's fine-tuning optimizer.

K-BERT's authors (autoliuweijie/K-BERT, ``run_kbert_cls.py`` / ``run_kbert_ner.py``, through UER's
``BertAdam``) fine-tune with betas (0.9, 0.999), epsilon 1e-6 and decoupled weight decay 0.01 on
every parameter except biases and LayerNorm weights (their ``no_decay = ['bias', 'gamma',
'beta']`` parameter groups). fairseq's ``adam`` (AdamW-style decay) decays every parameter. This
optimizer is fairseq's ``adam`` with those defaults and two parameter groups: tensors of one
dimension (every bias and every LayerNorm weight and bias of a BERT encoder and its heads) get no
weight decay, the others ``--weight-decay``::

    theta <- theta - lr * (m_hat / (sqrt(v_hat) + eps) + wd * theta)    wd = 0 for 1-D tensors

Two differences from BertAdam stay, as fairseq's Adam has them: Adam's bias correction (BertAdam
has none) and one global ``--clip-norm`` (BertAdam clips each tensor to norm 1). The learning-rate
schedule is fairseq's (``--lr-scheduler polynomial_decay`` with ``--warmup-updates`` 10% of
``--total-num-update`` is BertAdam's ``warmup_linear`` without its drop at the end of warm-up).

fairseq's ``--fp16`` flattens all parameters into one tensor, which has no groups: use
``--fp16-no-flatten-grads``, ``--memory-efficient-fp16`` or ``--amp`` (fairseq says so when asked).
"""

from dataclasses import dataclass, field
from typing import Any

from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig


@dataclass
class KBertAdamConfig(FairseqAdamConfig):
    adam_betas: Any = field(default="(0.9, 0.999)", metadata={"help": "betas for Adam (BertAdam's)"})
    adam_eps: float = field(default=1e-6, metadata={"help": "epsilon for Adam (BertAdam's)"})
    weight_decay: float = field(
        default=0.01, metadata={"help": "decoupled weight decay of tensors with 2+ dimensions (BertAdam's 0.01)"}
    )


def no_decay_groups(params, weight_decay: float):
    """torch parameter groups: tensors of 2+ dimensions with ``weight_decay``, 1-D tensors (biases,
    LayerNorm weights) without; empty groups left out."""
    params = list(params)
    decay = [p for p in params if p.dim() > 1]
    flat = [p for p in params if p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": flat, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


@register_optimizer("kbert_adam", dataclass=KBertAdamConfig)
class KBertAdam(FairseqAdam):
    """fairseq's Adam (decoupled weight decay), no weight decay on 1-D tensors (see the module docstring)."""

    def __init__(self, cfg: KBertAdamConfig, params):
        super().__init__(cfg, no_decay_groups(params, cfg.weight_decay))

    @property
    def supports_flat_params(self):
        return False  # one flat tensor cannot be split into biases and matrices

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        """fairseq's, whose overrides (the current flags, on resume) would give every group
        ``--weight-decay``: the 1-D group keeps 0."""
        overrides = dict(optimizer_overrides or {})
        weight_decay = overrides.pop("weight_decay", None)
        super().load_state_dict(state_dict, overrides)
        if weight_decay is not None:
            for group in self.param_groups:
                group["weight_decay"] = weight_decay if any(p.dim() > 1 for p in group["params"]) else 0.0
