"""The CoCon block (Chan et al., "CoCon: A Self-Supervised Approach for Controlled Text
Generation", ICLR 2021; ``shared/seeds/cocon.zh.txt``, Section 3 "Model Architecture").

An LM is split at a layer into ``enc`` (lower layers) and ``dec`` (upper layers); the text's
hidden states ``h = enc(x)`` (Eq. 4: ``o_t = dec(h_{:t-1})``) are conditioned on the content
states ``h^(c) = enc(c)`` by one transformer layer (Eq. 5-7)::

    Q = LN(h) W_q,  K = LN(h) W_k,  V = LN(h) W_v                    (t-1) x d
    K^(c) = LN(h^(c)) W_k,  V^(c) = LN(h^(c)) W_v                    l_c x d
    W = Q [K^(c); K]^T / sqrt(d_head) + [tau_content ; causal mask]  (Eq. 6)
    A = softmax(W) [V^(c); V]
    h~ = h + A W_o                       (residual)
    h' = h~ + FF(LN2(h~))                (Eq. 7, residual)

and ``dec(h')`` gives the next-token logits (Eq. 8). Per head as usual (``num_heads``). The
content keys/values use the same projections W_k, W_v and the same LayerNorm as the text (both
are states of the same lower layers). Several contents (Section 3, "Multiple Content Inputs")
are concatenated along l_c; ``content_bias`` adds tau (one value per content position, so one
tau per content) to the logits of the content columns only (Section 3, "Strength of Content
Conditioning"; tau = 0 is no bias). A content padding mask and, in training, a per-query
content mask (self-reconstruction: the step predicting x^b_j does not see content position j)
block content columns. Null content (``content=None`` or every column masked) leaves attention
over the causal self part only.

With ``zero_init`` the output projections W_o and the FFN's last layer start at zero, so that
h' = h and CoCon starts as the plain LM (a choice of this implementation, flag
``--cocon-zero-init``).

Incremental decoding (fairseq's ``incremental_state``): the content keys/values and the
content bias are computed on the first call and cached; each later call adds the new step's
key/value to the cached self part, so a step costs O(1) projections plus attention over
``l_c + t`` keys. ``reorder_incremental_state`` reorders every cached tensor with
``index_select(0, new_order)`` (beam search).
"""

import math
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor


@with_incremental_state
class CoConAttention(nn.Module):
    """Multi-head attention of the text queries over [content keys/values ; causal self
    keys/values] (Eq. 6).

    Args:
        embed_dim: d, the LM's hidden size
        num_heads: heads (d must be divisible by it)
        dropout: dropout on the attention weights
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed dim {embed_dim} is not divisible by {num_heads} heads")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        for p in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(p.weight, gain=1 / math.sqrt(2) if p is not self.out_proj else 1.0)
            nn.init.zeros_(p.bias)

    def _heads(self, x: Tensor) -> Tensor:
        # L x B x C -> B x H x L x D
        L, B, _ = x.shape
        return x.view(L, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def content_kv(self, content: Tensor, content_padding_mask: Optional[Tensor], content_bias: Optional[Tensor]):
        """Keys, values (B x H x S x D) and the additive column bias (B x S: tau, -inf on padding)."""
        S, B, _ = content.shape
        k, v = self._heads(self.k_proj(content)), self._heads(self.v_proj(content))
        col = content.new_zeros(B, S) if content_bias is None else content_bias.to(content.dtype)
        if content_padding_mask is not None:
            col = col.masked_fill(content_padding_mask, float("-inf"))
        return k, v, col

    def forward(
        self,
        x: Tensor,
        content: Optional[Tensor] = None,
        content_padding_mask: Optional[Tensor] = None,
        content_bias: Optional[Tensor] = None,
        content_attn_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = False,
    ):
        """
        Args:
            x: ``T x B x C`` normalized text states (the new steps when incremental)
            content: ``S x B x C`` normalized content states, or None (null content)
            content_padding_mask: ``B x S``, True on padding
            content_bias: ``B x S`` float, tau per content position
            content_attn_mask: ``B x T x S``, True where query t must not see content s
            incremental_state: fairseq's cache (content K/V on the first call, self K/V grow)
        Returns:
            ``T x B x C`` output, and the attention weights ``B x H x T x (S + T_total)`` when
            ``need_weights`` (content columns first)
        """
        T, B, C = x.shape
        assert C == self.embed_dim, f"expected {self.embed_dim} channels, got {C}"
        q = self._heads(self.q_proj(x)) * self.scaling  # B x H x T x D
        k_self, v_self = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        cache = self.get_incremental_state(incremental_state, "cocon") if incremental_state is not None else None
        prev_len = 0
        if cache is not None:
            k_c, v_c, col = cache["content_k"], cache["content_v"], cache["content_col"]
            prev_len = cache["self_k"].size(2)
            k_self = torch.cat([cache["self_k"], k_self], dim=2)
            v_self = torch.cat([cache["self_v"], v_self], dim=2)
        elif content is not None and content.size(0) > 0:
            k_c, v_c, col = self.content_kv(content, content_padding_mask, content_bias)
        else:
            k_c = v_c = x.new_zeros(B, self.num_heads, 0, self.head_dim)
            col = x.new_zeros(B, 0)
        if incremental_state is not None:
            self.set_incremental_state(
                incremental_state,
                "cocon",
                {"content_k": k_c, "content_v": v_c, "content_col": col, "self_k": k_self, "self_v": v_self},
            )
        S, L = k_c.size(2), k_self.size(2)
        logits = torch.cat([q @ k_c.transpose(-1, -2), q @ k_self.transpose(-1, -2)], dim=-1)  # B x H x T x (S+L)
        mask = x.new_zeros(B, 1, T, S + L)
        mask[:, :, :, :S] += col[:, None, None, :]
        if content_attn_mask is not None:
            assert cache is None, "a per-query content mask is for full-sequence (training) calls"
            mask[:, :, :, :S] = mask[:, :, :, :S].masked_fill(content_attn_mask[:, None], float("-inf"))
        # causal self part: query i (absolute position prev_len + i) sees self keys 0..prev_len + i
        future = torch.ones(T, L, dtype=torch.bool, device=x.device).triu(prev_len + 1)
        mask[:, :, :, S:] = mask[:, :, :, S:].masked_fill(future, float("-inf"))
        weights = F.softmax((logits + mask).float(), dim=-1).to(x.dtype)
        out = F.dropout(weights, p=self.dropout, training=self.training) @ torch.cat([v_c, v_self], dim=2)
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(T, B, C))
        return out, (weights if need_weights else None)

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        cache = self.get_incremental_state(incremental_state, "cocon")
        if cache is not None:
            cache = {k: v.index_select(0, new_order) for k, v in cache.items()}
            self.set_incremental_state(incremental_state, "cocon", cache)
        return incremental_state


class CoConBlock(nn.Module):
    """One pre-LayerNorm transformer layer over [content ; causal self] (Eq. 5-7).

    Args:
        embed_dim: the LM's hidden size d
        num_heads: attention heads
        ffn_dim: inner size of the feed-forward layer
        dropout: dropout after attention and FFN (residual branches)
        attention_dropout: dropout on the attention weights
        zero_init: start W_o and the FFN output at zero (h' = h: CoCon starts as the LM)
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        zero_init: bool = True,
    ):
        super().__init__()
        self.attn_layer_norm = nn.LayerNorm(embed_dim)
        self.attn = CoConAttention(embed_dim, num_heads, attention_dropout)
        self.ffn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.dropout = dropout
        if zero_init:
            for p in (self.attn.out_proj, self.fc2):
                nn.init.zeros_(p.weight)
                nn.init.zeros_(p.bias)

    def forward(
        self,
        h: Tensor,
        content: Optional[Tensor] = None,
        content_padding_mask: Optional[Tensor] = None,
        content_bias: Optional[Tensor] = None,
        content_attn_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = False,
    ):
        """h: ``T x B x C`` lower-layer text states; content: ``S x B x C`` lower-layer content
        states (not normalized; this block applies its LayerNorm to both). Returns h' and the
        attention weights (see :class:`CoConAttention`)."""
        c = self.attn_layer_norm(content) if content is not None else None
        a, w = self.attn(
            self.attn_layer_norm(h),
            c,
            content_padding_mask,
            content_bias,
            content_attn_mask,
            incremental_state,
            need_weights,
        )
        h = h + F.dropout(a, p=self.dropout, training=self.training)
        f = self.fc2(F.dropout(F.gelu(self.fc1(self.ffn_layer_norm(h))), p=self.dropout, training=self.training))
        return h + F.dropout(f, p=self.dropout, training=self.training), w
