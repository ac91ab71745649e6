"""Shared machinery of encoder-decoder attentions that change the attention weights.

Diminishing attention (which changes the weights after the softmax) and EKI's position
indicator (which changes the logits before it) both keep fairseq's projections, cached keys
and values, padding masks and beam handling. :class:`ReweightedCrossAttention` provides
those two ends: fairseq's masked logits and values (computed here with fairseq's cache
layout, one query projection per call, and an optional offset added to the keys before
they are cached), and the mixing of values with whatever weights a subclass computed.
:func:`replace_cross_attention` swaps the cross-attention of chosen decoder layers for one
of these modules with the same shapes.

When the weights are the plain softmax of the logits (an offset in the keys only, as EKI's
position indicator) and nobody asks for them, :meth:`ReweightedCrossAttention.fused_attention`
hands the projected queries, keys and values to ``F.scaled_dot_product_attention``: the
``(B*H) x T x S`` logits and weights are never materialised (the fused kernel on CUDA, and
PyTorch's flash kernel on CPU).
"""

from typing import Callable, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor


class ReweightedCrossAttention(MultiheadAttention):
    """fairseq's encoder-decoder ``MultiheadAttention`` with overridable weights (same
    parameters, so pretrained weights load into it). Subclasses call
    :meth:`masked_logits_and_values`, turn the logits into weights and call :meth:`attend`."""

    def __init__(self, embed_dim, num_heads, **kwargs):
        kwargs["encoder_decoder_attention"] = True
        super().__init__(embed_dim, num_heads, **kwargs)
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError("reweighted cross-attention supports neither add_bias_kv nor add_zero_attn")

    def masked_logits_and_values(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state,
        key_offset: Optional[Callable[[int], Tensor]] = None,
    ) -> Tuple[Tensor, Tensor]:
        """Scaled, padding-masked logits ``(B*H) x T x S`` and values ``(kv_bsz*H) x S x d``.

        fairseq's encoder-decoder attention up to the softmax (one query projection per
        call), with its incremental-state cache: keys and values are projected once per
        source and kept under ``prev_key`` / ``prev_value`` / ``prev_key_padding_mask`` as
        ``kv_bsz x H x S x d`` (beam search: one copy per sentence, ``kv_bsz = B / beam``),
        so fairseq's ``reorder_incremental_state`` applies unchanged.

        Args:
            query: ``T x B x C``; key, value: ``S x B x C`` encoder states (ignored once cached).
            key_padding_mask: ``B x S``, True at padding.
            key_offset: called as ``key_offset(kv_bsz)`` when the keys are projected (not on
                cached steps); returns ``S x kv_bsz x C``, added to the projected keys before
                they are cached (EKI's E_D, Eq. 9).
        """
        q, k, v, key_padding_mask, _ = self.project(query, key, value, key_padding_mask, incremental_state, key_offset)
        return self.masked_logits(q, k, key_padding_mask, query.size(1)), v

    def project(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state,
        key_offset: Optional[Callable[[int], Tensor]] = None,
    ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor], int]:
        """The scaled queries ``(B*H) x T x d``, keys and values ``(kv_bsz*H) x S x d``, the
        padding mask ``kv_bsz x S`` (or None) and ``kv_bsz``, with the cache of
        :meth:`masked_logits_and_values` (whose arguments these are)."""
        tgt_len, bsz, _ = query.size()
        saved_state = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        q = self.q_proj(query) * self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        if saved_state is not None and "prev_key" in saved_state:
            prev_key, prev_value = saved_state["prev_key"], saved_state["prev_value"]
            assert prev_key is not None and prev_value is not None
            kv_bsz = prev_key.size(0)
            k = prev_key.view(kv_bsz * self.num_heads, -1, self.head_dim)
            v = prev_value.view(kv_bsz * self.num_heads, -1, self.head_dim)
            key_padding_mask = saved_state.get("prev_key_padding_mask")
        else:
            assert key is not None and value is not None
            if self.beam_size > 1 and bsz == key.size(1):
                # S x (B*beam) x C: the beams of a sentence share its source, keep one
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0]
                value = value.view(value.size(0), -1, self.beam_size, value.size(2))[:, :, 0]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0]
            kv_bsz = key.size(1)
            k = self.k_proj(key)  # S x kv_bsz x C
            if key_offset is not None:
                k = k + key_offset(kv_bsz)
            v = self.v_proj(value)
            k = k.contiguous().view(-1, kv_bsz * self.num_heads, self.head_dim).transpose(0, 1)
            v = v.contiguous().view(-1, kv_bsz * self.num_heads, self.head_dim).transpose(0, 1)
            if saved_state is not None:
                saved_state["prev_key"] = k.view(kv_bsz, self.num_heads, -1, self.head_dim)
                saved_state["prev_value"] = v.view(kv_bsz, self.num_heads, -1, self.head_dim)
                saved_state["prev_key_padding_mask"] = key_padding_mask
                self._set_input_buffer(incremental_state, saved_state)
        return q, k, v, key_padding_mask, kv_bsz

    def masked_logits(self, q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], bsz: int) -> Tensor:
        """Padding-masked logits ``(B*H) x T x S`` of :meth:`project`'s queries and keys."""
        tgt_len, src_len = q.size(1), k.size(1)
        kv_bsz = k.size(0) // self.num_heads
        if kv_bsz == bsz:
            logits = torch.bmm(q, k.transpose(1, 2))
        else:  # every beam of a sentence against the sentence's one copy of the keys
            logits = torch.einsum(
                "bxhtd,bhsd->bxhts",
                q.view(kv_bsz, -1, self.num_heads, tgt_len, self.head_dim),
                k.view(kv_bsz, self.num_heads, src_len, self.head_dim),
            ).reshape(-1, tgt_len, src_len)
        if key_padding_mask is not None:
            pad = key_padding_mask.to(torch.bool).view(kv_bsz, 1, 1, 1, src_len)
            logits = logits.view(kv_bsz, -1, self.num_heads, tgt_len, src_len).masked_fill(pad, float("-inf"))
            logits = logits.view(bsz * self.num_heads, tgt_len, src_len)
        return logits

    def fused_attention(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], bsz: int
    ) -> Tensor:
        """softmax(logits) mixing the values, by ``F.scaled_dot_product_attention`` (dropout on the
        weights as fairseq applies it): output ``T x B x C``, equal to :meth:`attend` of the softmax of
        :meth:`masked_logits`. The beams of a sentence (``B / kv_bsz``) become more queries of its one
        copy of the keys."""
        tgt_len, heads, d = q.size(1), self.num_heads, self.head_dim
        kv_bsz = k.size(0) // heads
        beams = bsz // kv_bsz
        # kv_bsz x H x (beams*T) x d against kv_bsz x H x S x d
        q = q.view(kv_bsz, beams, heads, tgt_len, d).transpose(1, 2).reshape(kv_bsz, heads, beams * tgt_len, d)
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask.to(torch.bool).view(kv_bsz, 1, 1, -1)  # True: attend
        dropout = self.dropout_module.p if (self.training or self.dropout_module.apply_during_inference) else 0.0
        mixed = F.scaled_dot_product_attention(
            q, k.view(kv_bsz, heads, -1, d), v.view(kv_bsz, heads, -1, d), attn_mask=mask, dropout_p=dropout, scale=1.0
        )  # q carries the scaling already
        mixed = mixed.view(kv_bsz, heads, beams, tgt_len, d).transpose(1, 2).reshape(bsz * heads, tgt_len, d)
        return self.out_proj(mixed.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim))

    def attend(
        self,
        weights: Tensor,
        v: Tensor,
        bsz: int,
        tgt_len: int,
        need_weights: bool,
        need_head_weights: bool,
        dropped: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Output ``T x B x C`` of mixing the values with ``weights`` (``(B*H) x T x S``,
        dropout applied here unless the caller gives the ``dropped`` weights), and the weights
        (before dropout) to return as fairseq does."""
        w = self.dropout_module(weights) if dropped is None else dropped
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
