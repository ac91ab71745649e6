"""K-BERT's mask-Transformer: self-attention under a per-example boolean visible matrix.

K-BERT (Liu et al., 2020, "K-BERT: Enabling Language Representation with Knowledge Graph", section 02,
"編碼器"): the mask
self-attention adds the visible matrix M (0 where visible, -inf elsewhere) to the attention logits
of every layer and head::

    S = softmax((Q K^T + M) / sqrt(d_k)) V

fairseq's ``MultiheadAttention`` takes one 2-D ``attn_mask`` for the whole batch, so this layer
computes the attention itself with ``F.scaled_dot_product_attention`` and a boolean
B x 1 x T x T mask (broadcast over heads; True = visible), which is the same softmax with -inf
where M is -inf. No float mask per head is ever made.

The layer's parameters have the names of fairseq's ``TransformerEncoderLayer`` (``self_attn.
{q,k,v,out}_proj``, ``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``), so a
fairseq RoBERTa / masked-LM checkpoint loads into it unchanged; post-LN (BERT, RoBERTa) by
default, pre-LN with ``normalize_before``.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from fairseq import utils
from torch import Tensor, nn


class VisibleSelfAttention(nn.Module):
    """Multi-head self-attention whose mask differs per example (and is shared by the heads).

    Args:
        embed_dim: model width C
        num_heads: H (C must be divisible by H)
        dropout: attention-probability dropout
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        assert embed_dim % num_heads == 0, "embed_dim must be divisible by num_heads"
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """
        Args:
            x: B x T x C
            mask: bool, B x T x T (visible matrix) or B x 1 x T (key padding only); True = attend

        Returns:
            B x T x C
        """
        bsz, tgt_len, _ = x.shape
        assert mask.dtype == torch.bool and mask.dim() == 3 and mask.size(0) == bsz, "mask: bool B x T x T"

        def heads(t: Tensor) -> Tensor:  # B x T x C -> B x H x T x C/H
            return t.view(bsz, tgt_len, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask.unsqueeze(1), dropout_p=self.dropout if self.training else 0.0
        )  # B x H x T x C/H
        return self.out_proj(out.transpose(1, 2).reshape(bsz, tgt_len, self.embed_dim))


class VisibleEncoderLayer(nn.Module):
    """A transformer encoder layer (fairseq's layout) over :class:`VisibleSelfAttention`.

    Args:
        embed_dim, ffn_dim, num_heads: sizes
        dropout, attention_dropout, activation_dropout: dropout rates
        activation_fn: name for ``fairseq.utils.get_activation_fn`` (gelu for BERT)
        normalize_before: pre-LN instead of BERT's post-LN
        layer_norm_eps: the LayerNorms' epsilon (fairseq's 1e-5; Google's BERT 1e-12)
    """

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        num_heads: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
        activation_fn: str = "gelu",
        normalize_before: bool = False,
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        self.self_attn = VisibleSelfAttention(embed_dim, num_heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.dropout, self.activation_dropout = dropout, activation_dropout
        self.normalize_before = normalize_before

    def forward(self, x: Tensor, mask: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        """x: B x T x C; mask: bool B x T x T (or B x 1 x T); returns B x T x C."""
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x = F.dropout(self.self_attn(x, mask), p=self.dropout, training=self.training)
        x = residual + x
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = F.dropout(self.activation_fn(self.fc1(x)), p=self.activation_dropout, training=self.training)
        x = F.dropout(self.fc2(x), p=self.dropout, training=self.training)
        x = residual + x
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x
