"""Shared machinery of encoder-decoder attentions that change the attention weights.

Diminishing attention (which changes the weights after the softmax) and EKI's position
indicator (which changes the logits before it) both keep fairseq's projections, cached keys
and values, padding masks and beam handling. :class:`ReweightedCrossAttention` provides
those two ends: the parent's masked logits and values, and the mixing of values with
whatever weights a subclass computed. :func:`replace_cross_attention` swaps the
cross-attention of chosen decoder layers for one of these modules with the same shapes.
"""

from typing import Callable, Iterable, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor


class ReweightedCrossAttention(MultiheadAttention):
    """fairseq's encoder-decoder ``MultiheadAttention`` with overridable weights."""

    def __init__(self, embed_dim, num_heads, **kwargs):
        kwargs["encoder_decoder_attention"] = True
        super().__init__(embed_dim, num_heads, **kwargs)

    def masked_logits_and_values(self, query, key, value, key_padding_mask, incremental_state) -> Tuple[Tensor, Tensor]:
        """The parent's scaled, padding-masked logits ``(B*H) x T x S`` and values
        ``(kv_bsz*H) x S x d``; it also reads and writes the cached keys and values."""
        return MultiheadAttention.forward(
            self,
            query,
            key,
            value,
            key_padding_mask=key_padding_mask,
            incremental_state=incremental_state,
            static_kv=True,
            before_softmax=True,
        )

    def attend(
        self, weights: Tensor, v: Tensor, bsz: int, tgt_len: int, need_weights: bool, need_head_weights: bool
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Output ``T x B x C`` of mixing the values with ``weights`` (``(B*H) x T x S``,
        dropout applied here), and the weights to return as fairseq does."""
        w = self.dropout_module(weights)
        kv_bsz = v.size(0) // self.num_heads
        if kv_bsz == bsz:
            mixed = torch.bmm(w, v)
        else:  # fairseq stores the values once per sentence for all its beams
            mixed = torch.einsum(
                "bxhts,bhsd->bxhtd",
                w.view(kv_bsz, -1, self.num_heads, tgt_len, w.size(-1)),
                v.view(kv_bsz, self.num_heads, -1, self.head_dim),
            ).reshape(-1, tgt_len, self.head_dim)
        out = self.out_proj(mixed.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim))
        out_weights: Optional[Tensor] = None
        if need_weights:
            out_weights = weights.view(bsz, self.num_heads, tgt_len, -1).transpose(1, 0)
            if not need_head_weights:
                out_weights = out_weights.mean(dim=0)
        return out, out_weights


def replace_cross_attention(decoder, layers: Iterable[int], build: Callable[..., MultiheadAttention]):
    """Replace ``decoder.layers[i].encoder_attn`` for ``i`` in ``layers`` by ``build(embed_dim,
    num_heads, kdim=, vdim=, dropout=, bias=, q_noise=, qn_block_size=, xformers_att_config=)``
    with the old module's shapes (so pretrained weights load into the new one) and the
    settings fairseq's ``TransformerDecoderLayerBase.build_encoder_attention`` gives it:
    quant-noise (``--quant-noise-pq``, ``--quant-noise-pq-block-size``, kept by the layer)
    and the encoder's xFormers config (``decoder.cfg.encoder.xformers_att_config``)."""
    cfg_encoder = getattr(getattr(decoder, "cfg", None), "encoder", None)
    xformers_att_config = getattr(cfg_encoder, "xformers_att_config", None)
    for i in layers:
        layer = decoder.layers[i]
        old = layer.encoder_attn
        if old is None:
            raise ValueError("this attention needs decoder cross-attention")
        layer.encoder_attn = build(
            old.embed_dim,
            old.num_heads,
            kdim=old.kdim,
            vdim=old.vdim,
            dropout=old.dropout_module.p,
            bias=old.k_proj.bias is not None,
            q_noise=getattr(layer, "quant_noise", 0.0),
            qn_block_size=getattr(layer, "quant_noise_block_size", 8),
            xformers_att_config=xformers_att_config,
        )
    return decoder
