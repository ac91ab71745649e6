"""Cross-attention and coverage maps of a trained encoder-decoder, for any of its layers.

Works for fairseq's ``MultiheadAttention`` (raw weights = used weights) and for
:class:`~fairseq_knowgen.modules.diminishing_attention.DiminishingMultiheadAttention`
(raw softmax probabilities vs. the diminishing weights the context really used). The
decoder is run once with teacher forcing on a given output; a forward pre-hook records the
chosen layer's cross-attention inputs, and the maps are recomputed from them.

The *effective coverage* of source position i is the sum over output steps of the weights
used (for DimAttn it telescopes to g(c_i^T) - g(0)); its normalized entropy is the paper's
coverage-evenness measure (Section 5: higher = attention spread more evenly).
"""

from typing import Dict, List

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention

from ..modules.diminishing_attention import DiminishingMultiheadAttention, diminishing_weights


def cross_attention_maps(attn: MultiheadAttention, query, key, key_padding_mask=None) -> Dict[str, torch.Tensor]:
    """``raw`` and ``used`` weights, ``B x H x T x S``, for a whole output sequence."""
    logits, _ = MultiheadAttention.forward(
        attn, query, key, key, key_padding_mask=key_padding_mask, static_kv=True, before_softmax=True
    )
    probs = F.softmax(logits.float(), dim=-1).nan_to_num(0.0)
    used = probs
    if isinstance(attn, DiminishingMultiheadAttention):
        used, _, _ = diminishing_weights(probs, attn.g, attn.g2, normalize=attn.normalize)
    tgt_len, bsz = query.size(0), query.size(1)

    def shape(x):
        return x.view(bsz, attn.num_heads, tgt_len, -1)

    return {"raw": shape(probs), "used": shape(used)}


@torch.no_grad()
def teacher_forced_maps(model, src_tokens, src_lengths, prev_output_tokens, layer: int = -1):
    """Run ``model`` on a batch and return the maps of decoder layer ``layer``."""
    attn = model.decoder.layers[layer].encoder_attn
    seen: List[dict] = []

    def hook(_module, _args, kwargs):
        seen.append(kwargs)

    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model(src_tokens, src_lengths, prev_output_tokens)
    finally:
        handle.remove()
    kw = seen[-1]
    return cross_attention_maps(attn, kw["query"], kw["key"], kw.get("key_padding_mask"))


def coverage_entropy(used: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
    """Entropy of the normalized effective coverage per sentence (heads averaged).

    used: ``B x H x T x S``; src_mask / tgt_mask: ``B x S`` / ``B x T``, True on real tokens.
    """
    w = used.mean(1) * tgt_mask.unsqueeze(-1)  # B x T x S, padded output steps dropped
    cov = w.sum(1) * src_mask  # B x S
    p = cov / cov.sum(-1, keepdim=True).clamp_min(1e-12)
    return -(p * p.clamp_min(1e-12).log()).sum(-1)
