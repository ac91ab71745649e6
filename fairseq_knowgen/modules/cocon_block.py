"""The CoCon block (Chan et al., "CoCon: A Self-Supervised Approach for Controlled Text
Generation", ICLR 2021; Section 3 "Model Architecture").

Equation numbers are those of the paper's Section 3 as its text implies them (it names
Eq. 4 and Eq. 6; its displayed formulas are missing, so each is given here as the text describes
it): Eq. 4 ``o_t = dec(h_{:t-1})``, ``p(x_t | x_{:t-1}) = softmax(o_t)``; Eq. 5
``h'_{:t-1} = CoCon(h^(c)_{:l_c}, h_{:t-1})``; Eq. 6 ``K' = [K^(c); K]``, ``V' = [V^(c); V]``,
``A = softmax(Q K'^T) V' = softmax(W) V'``; Eq. 7 ``h'_i = FF(a_i)``,
``o~_t = dec([h_{:t-2}; h'_{t-1}])`` (the block's output "concatenated to the representations
before t-1 and passed to dec").

An LM is split at a layer into ``enc`` (lower layers) and ``dec`` (upper layers); the text's
hidden states ``h = enc(x)`` are conditioned on the content states ``h^(c) = enc(c)`` by one
transformer layer (Eq. 5-7)::

    Q = LN(h) W_q,  K = LN(h) W_k,  V = LN(h) W_v                    (t-1) x d
    K^(c) = h^(c) W^(c)_k,  V^(c) = h^(c) W^(c)_v                    l_c x d   (content_kv="separate")
    K^(c)_j += h^(c)_{j-1} W'   (h^(c)_{-1} = 0; per query, where it sees j-1)   (content_prev_key)
    K^(c) = LN(h^(c)) W_k,  V^(c) = LN(h^(c)) W_v                    l_c x d   (content_kv="shared")
    W = Q [K^(c); K]^T / sqrt(d_head) + [tau_content ; causal mask]  (Eq. 6; tau: W_{:,:l_c} only)
    A = softmax(W) [V^(c); V]                                        (Eq. 6)
    h~ = h + A W_o                       (residual)
    h' = h~ + FF(LN2(h~))                (Eq. 7, residual; FF = W_2 act(W_1 x), act the LM's own)

Initialization (``init``; the paper is silent): ``xavier`` (default: Xavier-uniform weights, biases 0, the
FFN's too) or ``normal`` (the authors': every linear map N(0, 0.02^2), biases 0, GPT-2's
initializer for its 768-1024 wide layers). On the toy copy task of ``docs/methods/cocon.md`` (a
32-wide block, an untrained LM, 400 updates) ``normal`` left the self/null gap at 0.0% of L_null,
``xavier`` reached 8.0%. Choices beyond the paper's formulas, as GPT-2
blocks (and the authors' block) do: pre-LayerNorm, multi-head attention
(``num_heads``) scaled by 1/sqrt(d_head) (Eq. 6 is written without a scale; tau is added after
it), an output projection W_o and residual connections around attention and FF (Eq. 7 writes
``h'_i = FF(a_i)``).

Content keys/values (``content_kv``; the paper only says they "are also computed"):

- ``separate`` (default, as the authors' code: its ``ref_source_attn`` projects the content with
  a layer of its own and does not LayerNorm it): W^(c)_k, W^(c)_v of their own, on the raw
  lower-layer content states. With shared maps, L_null constrains the very value/output maps
  that would carry content, so any channel that copies content also injects the text's own
  tokens: in a toy probe (2-layer 32-wide LM, random words, L_self and L_null only, 400 Adam
  steps, fixed split, no content mask) the self/null gap was 0.06 nats shared, 0.83 separate
  with copied initial weights, 0.96 separate with fresh ones.
- ``shared``: the text's W_k, W_v and LayerNorm on the content too (a checkpoint without content
  projections loads as ``shared``).

``content_prev_key`` (off by default: beyond the paper and the authors' code): every content key
also reads the previous content column through a map W' of its own (no bias, starting at zero, so
a block starts as without it). Why one might want it: in self-reconstruction the step predicting
c_j has the token c_{j-1} as input, so the column to read is the one *after* the column holding
c_{j-1}; with the authors' split the prefix length varies by +-J, so position alone does not say
which column that is, and one attention layer can find it by content only if column j's key says
"my predecessor is c_{j-1}" (an induction head's previous-token step), which a small LM's lower
layers hardly supply. On the toy probe of ``docs/methods/cocon.md`` (no content mask) it raised the
self/null gap from 5.1% to 27.3% of L_null. Under a per-query content mask the W' term of key j is
added only for queries that may see column j - 1: otherwise column j - 1 would reach a query the
mask hides it from through column j's key, and the aligned mask's
guarantee (the step predicting x^b_j learns nothing from content column j) would hold only while
W' = 0. Several contents are concatenated, so the first column of a later content reads the last
of the earlier. Checkpoints saved before the flag existed load without W'.

``content_kv_init`` (separate only): ``fresh`` (default: Xavier, as the text projections start;
the better of the two in that probe) or ``copy`` (copies of W_k, W_v at construction). ``dec`` then receives h' (Eq. 7); at which positions it
receives h' rather than h is the model's business (:mod:`fairseq_knowgen.models.cocon`).
Several contents (Section 3, "Multiple Content Inputs": their K and V concatenated, no
equation in the paper) are concatenated along l_c; ``content_bias`` adds tau (one value per
content position, so one tau per content) to the logits of the content columns only (Section 3,
"Strength of Content Conditioning": a bias on ``W_{:,:l_c}`` of Eq. 6; tau = 0 is no bias). A
content padding mask and, in training, a per-query content mask (the content masking of
self-reconstruction: the step predicting x^b_j does not see content position j) block content
columns. Null content (``content=None`` or every column masked) leaves attention over the causal
self part only.

With ``zero_init`` the output projections W_o and the FFN's last layer start at zero, so that
h' = h and CoCon starts as the plain LM (a choice of this implementation, flag
``--cocon-zero-init 1``; not the default: with W_o = 0 no gradient reaches the attention until
W_o has grown, and in the toy probe above (fixed split, J = 2, one-column keys) the self/null gap
after 400 steps was 0.05 nats with the zero start against 0.38 without, 0.30 against 0.55 after
800 at torch seed 1, but 0.00 after 800 at seeds 2 and 3; with the previous-column keys 0.001
against 1.32 after 400 steps; ``docs/methods/cocon.md``).

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

CONTENT_KV = ("separate", "shared")
CONTENT_KV_INIT = ("fresh", "copy")
INITS = ("xavier", "normal")


def init_linear(layer: nn.Linear, init: str, gain: float = 1.0):
    """``normal``: weight ~ N(0, 0.02^2) (the authors' GPT-2 initializer range); ``xavier``: Xavier
    uniform with ``gain``; the bias zero."""
    if init == "normal":
        nn.init.normal_(layer.weight, mean=0.0, std=0.02)
    else:
        nn.init.xavier_uniform_(layer.weight, gain=gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


@with_incremental_state
class CoConAttention(nn.Module):
    """Multi-head attention of the text queries over [content keys/values ; causal self
    keys/values] (Eq. 6).

    Args:
        embed_dim: d, the LM's hidden size
        num_heads: heads (d must be divisible by it)
        dropout: dropout on the attention weights
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        content_kv: str = "separate",
        content_kv_init: str = "fresh",
        content_prev_key: bool = False,
        init: str = "xavier",
    ):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init {init!r}: unknown (one of {', '.join(INITS)})")
        if embed_dim % num_heads:
            raise ValueError(f"embed dim {embed_dim} is not divisible by {num_heads} heads")
        if content_kv not in CONTENT_KV or content_kv_init not in CONTENT_KV_INIT:
            raise ValueError(f"content_kv {content_kv!r} / content_kv_init {content_kv_init!r}: unknown")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        for p in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            init_linear(p, init, gain=1 / math.sqrt(2) if p is not self.out_proj else 1.0)
        self.content_kv_mode = content_kv
        if content_kv == "separate":  # W^(c)_k, W^(c)_v: created only when used
            self.content_k_proj = nn.Linear(embed_dim, embed_dim)
            self.content_v_proj = nn.Linear(embed_dim, embed_dim)
            for mine, text in ((self.content_k_proj, self.k_proj), (self.content_v_proj, self.v_proj)):
                if content_kv_init == "copy":
                    mine.load_state_dict(text.state_dict())
                else:
                    init_linear(mine, init, gain=1 / math.sqrt(2))

        if content_prev_key:  # W^(c)_k' on the left neighbour's state: created only when used
            self.content_prev_k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
            nn.init.zeros_(self.content_prev_k_proj.weight)

    def drop_content_prev_key(self):
        """Turn keys that read the previous column into one-column keys (W' dropped): how a checkpoint
        from before ``content_prev_key`` existed is read."""
        del self.content_prev_k_proj

    def share_content_kv(self):
        """Turn a ``separate`` attention into ``shared`` (its content projections dropped): how a
        checkpoint from before ``content_kv`` existed is read."""
        self.content_kv_mode = "shared"
        del self.content_k_proj, self.content_v_proj

    def _heads(self, x: Tensor) -> Tensor:
        # L x B x C -> B x H x L x D
        L, B, _ = x.shape
        return x.view(L, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def content_kv(self, content: Tensor, content_padding_mask: Optional[Tensor], content_bias: Optional[Tensor]):
        """Keys, values (B x H x S x D), the additive column bias (B x S: tau, -inf on padding) and,
        with ``content_prev_key``, the previous-column part of the keys (``h^(c)_{j-1} W'``, B x H x S
        x D; None without it), which :meth:`forward` adds per query."""
        S, B, _ = content.shape
        k_proj, v_proj = (
            (self.content_k_proj, self.content_v_proj) if self.content_kv_mode == "separate" else (self.k_proj, self.v_proj)
        )
        k, v = self._heads(k_proj(content)), self._heads(v_proj(content))
        prev = getattr(self, "content_prev_k_proj", None)
        k_prev = None
        if prev is not None:  # h_{j-1} W'  (h_{-1} = 0)
            k_prev = self._heads(prev(F.pad(content[:-1], (0, 0, 0, 0, 1, 0))))
        col = content.new_zeros(B, S) if content_bias is None else content_bias.to(content.dtype)
        if content_padding_mask is not None:
            col = col.masked_fill(content_padding_mask, float("-inf"))
        return k, v, col, k_prev

    def forward(
        self,
        x: Tensor,
        content: Optional[Tensor] = None,
        content_padding_mask: Optional[Tensor] = None,
        content_bias: Optional[Tensor] = None,
        content_attn_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = False,
        content_rows: Optional[Tensor] = None,
    ):
        """
        Args:
            x: ``T x B x C`` normalized text states (the new steps when incremental)
            content: ``S x N x C`` content states (normalized with the text's LayerNorm for
                ``shared``, raw for ``separate``), or None (null content); N = B, or the number
                of distinct inputs when ``content_rows`` is given
            content_padding_mask: ``N x S``, True on padding
            content_bias: ``N x S`` float, tau per content position
            content_attn_mask: ``B x T x S``, True where query t must not see content s
            incremental_state: fairseq's cache (content K/V on the first call, self K/V grow)
            content_rows: ``B``, the content (0..N-1) of each row (beam search: N inputs x beam rows)
        Returns:
            ``T x B x C`` output, and the attention weights ``B x H x T x (S + T_total)`` when
            ``need_weights`` (content columns first)
        """
        T, B, C = x.shape
        assert C == self.embed_dim, f"expected {self.embed_dim} channels, got {C}"
        cache = self.get_incremental_state(incremental_state, "cocon") if incremental_state is not None else None
        if cache is not None and T == 1 and not need_weights:
            return self._step(x, cache, incremental_state), None
        q = self._heads(self.q_proj(x)) * self.scaling  # B x H x T x D
        k_self, v_self = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        prev_len, k_prev = 0, None
        if cache is not None:  # several new steps at once after a cached prefix
            k_c, v_c, col, g = cache["content_k"], cache["content_v"], cache["content_col"], cache["group"]
            prev_len = cache["self_k"].size(2)
            k_self = torch.cat([cache["self_k"], k_self], dim=2)
            v_self = torch.cat([cache["self_v"], v_self], dim=2)
            rows = torch.arange(k_c.size(0), device=x.device).repeat_interleave(g)
        else:
            if content is not None and content.size(0) > 0:
                k_c, v_c, col, k_prev = self.content_kv(content, content_padding_mask, content_bias)
            else:
                k_c = v_c = x.new_zeros(B, self.num_heads, 0, self.head_dim)
                col = x.new_zeros(B, 0)
            if k_prev is not None and content_attn_mask is None:  # every column seen: K_j += h_{j-1} W'
                k_c, k_prev = k_c + k_prev, None
            if k_prev is not None:  # a per-query mask: the content is per row (training)
                k_prev = k_prev if content_rows is None else k_prev.index_select(0, content_rows)
            rows = content_rows if content_rows is not None else torch.arange(B, device=x.device)
            g = B // k_c.size(0) if k_c.size(0) and B % k_c.size(0) == 0 else None
            if g is None or g == 1 and content_rows is not None:  # content per row: exact for any rows
                k_c, v_c, col, g = k_c.index_select(0, rows), v_c.index_select(0, rows), col.index_select(0, rows), 1
                rows = torch.arange(B, device=x.device)
            # else: N inputs and B = N x g rows in fairseq's beam layout (the encoder output expanded by the beam)
        if incremental_state is not None:
            self._store(incremental_state, k_c, v_c, col, k_self, v_self, g)
        if k_c.size(0) != B:
            k_c, v_c, col = k_c.index_select(0, rows), v_c.index_select(0, rows), col.index_select(0, rows)
        S, L = k_c.size(2), k_self.size(2)
        logits_c = q @ k_c.transpose(-1, -2)  # B x H x T x S
        if k_prev is not None:
            # the previous-column part of key j only where query t may see column j - 1: a column the mask
            # hides from t reaches t through no key (the mask's guarantee holds whatever W' is)
            prev_hidden = F.pad(content_attn_mask[:, :, :-1], (1, 0), value=False)  # B x T x S
            logits_c = logits_c + (q @ k_prev.transpose(-1, -2)).masked_fill(prev_hidden[:, None], 0.0)
        logits = torch.cat([logits_c, q @ k_self.transpose(-1, -2)], dim=-1)  # B x H x T x (S+L)
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

    def _store(self, incremental_state, k_c, v_c, col, k_self, v_self, group: int):
        # the content's keys/values once per group of ``group`` rows (N = B / group), the self part per row
        cache = {"content_k": k_c, "content_v": v_c, "content_col": col, "self_k": k_self, "self_v": v_self}
        cache["group"] = group
        self.set_incremental_state(incremental_state, "cocon", cache)

    def _step(self, x: Tensor, cache: Dict[str, Tensor], incremental_state) -> Tensor:
        """One decoding step (``1 x B x C``): one fused q/k/v projection, the new key/value appended
        to the self part; the content logits of the g rows of each group in one batched product
        with that group's cached content keys (the content is not copied per row), tau added."""
        _, B, C = x.shape
        w = self.get_incremental_state(incremental_state, "qkv_weight")
        if w is None:  # the weights are fixed while decoding: concatenate them once per search
            w = {
                "weight": torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]),
                "bias": torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]),
            }
            self.set_incremental_state(incremental_state, "qkv_weight", w)
        q, k, v = F.linear(x, w["weight"], w["bias"]).split(C, dim=-1)
        k_c, v_c, col = cache["content_k"], cache["content_v"], cache["content_col"]
        k_self = torch.cat([cache["self_k"], self._heads(k)], dim=2)
        v_self = torch.cat([cache["self_v"], self._heads(v)], dim=2)
        self._store(incremental_state, k_c, v_c, col, k_self, v_self, cache["group"])
        q = self._heads(q) * self.scaling  # B x H x 1 x D
        S, N, H = col.size(1), k_c.size(0), self.num_heads
        logits = q @ k_self.transpose(-1, -2)  # B x H x 1 x L
        if S:
            g = B // N
            qg = q.view(N, g, H, self.head_dim).transpose(1, 2)  # N x H x g x D
            lc = (qg @ k_c.transpose(-1, -2) + col[:, None, None, :]).transpose(1, 2).reshape(B, H, 1, S)
            logits = torch.cat([lc, logits], dim=-1)
        weights = F.softmax(logits, dim=-1)
        if self.training and self.dropout:
            weights = F.dropout(weights, p=self.dropout)
        out = weights[..., S:] @ v_self  # B x H x 1 x D
        if S:
            wc = weights[..., :S].reshape(N, g, H, S).transpose(1, 2)  # N x H x g x S
            out = out + (wc @ v_c).transpose(1, 2).reshape(B, H, 1, self.head_dim)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(1, B, C))

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        """Reorder the per-row self part, and the per-group content with it: group i of the new
        rows takes the content of the group its first row came from (``new_order[i g] // g``); when
        the new rows are no multiple of g, each row takes its own (``new_order // g``, g = 1 from
        then on). With g = 1 that is exact for any order; with g > 1 it assumes fairseq's beam
        search, whose reorders move rows only among the g rows of one input and drop finished
        inputs whole. Decided from shapes alone: no host-device sync. (The fused weights of
        "qkv_weight" are not per row.)"""
        cache = self.get_incremental_state(incremental_state, "cocon")
        if cache is not None:
            cache = dict(cache)
            for k in ("self_k", "self_v"):
                cache[k] = cache[k].index_select(0, new_order)
            g = cache["group"]
            if g == 1:
                keep = new_order
            elif new_order.numel() % g:  # rows no longer in groups of g: one content per row from now on
                keep, cache["group"] = new_order // g, 1
            else:
                keep = new_order.view(-1, g)[:, 0] // g
            for k in ("content_k", "content_v", "content_col"):
                cache[k] = cache[k].index_select(0, keep)
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
        activation: the FFN's activation (fairseq's names; the model passes the LM's own)
        content_kv: ``separate`` (the content's own K/V projections, no LayerNorm) or ``shared``
        content_kv_init: ``fresh`` or ``copy`` (separate only; see the module docstring)
        content_prev_key: content keys also read the previous content column (W'; module docstring)
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        zero_init: bool = False,
        activation: str = "gelu",
        content_kv: str = "separate",
        content_kv_init: str = "fresh",
        content_prev_key: bool = False,
        init: str = "xavier",
    ):
        super().__init__()
        from fairseq import utils

        self.activation_fn = utils.get_activation_fn(activation)
        self.attn_layer_norm = nn.LayerNorm(embed_dim)
        self.attn = CoConAttention(
            embed_dim, num_heads, attention_dropout, content_kv, content_kv_init, content_prev_key, init
        )
        self.ffn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        for p in (self.fc1, self.fc2):
            init_linear(p, init)
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
        content_rows: Optional[Tensor] = None,
    ):
        """h: ``T x B x C`` lower-layer text states; content: ``S x N x C`` lower-layer content
        states (not normalized: with ``shared`` K/V this block applies the text's LayerNorm to
        them), N = B unless ``content_rows`` maps rows to inputs. Returns h' and the attention
        weights (see :class:`CoConAttention`)."""
        if incremental_state is not None and not self.training and h.size(0) == 1 and not need_weights:
            cache = self.attn.get_incremental_state(incremental_state, "cocon")
            if cache is not None:  # a decoding step: the same computation without module-call overhead
                ln = self.attn_layer_norm
                h = h + self.attn._step(
                    F.layer_norm(h, ln.normalized_shape, ln.weight, ln.bias, ln.eps), cache, incremental_state
                )
                ln = self.ffn_layer_norm
                f = F.linear(
                    F.layer_norm(h, ln.normalized_shape, ln.weight, ln.bias, ln.eps), self.fc1.weight, self.fc1.bias
                )
                return h + F.linear(self.activation_fn(f), self.fc2.weight, self.fc2.bias), None
        c = content
        if content is not None and self.attn.content_kv_mode == "shared":
            c = self.attn_layer_norm(content)
        a, w = self.attn(
            self.attn_layer_norm(h),
            c,
            content_padding_mask,
            content_bias,
            content_attn_mask,
            incremental_state,
            need_weights,
            content_rows,
        )
        h = h + F.dropout(a, p=self.dropout, training=self.training)
        # dropout after the FFN's output projection only, as GPT-2's MLP (the authors' block)
        f = self.fc2(self.activation_fn(self.fc1(self.ffn_layer_norm(h))))
        return h + F.dropout(f, p=self.dropout, training=self.training), w
