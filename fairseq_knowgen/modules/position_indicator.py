"""EKI prototype position indicator ("An Enhanced Knowledge Injection Model for Commonsense Generation", Eq. 7-9).

Distances (Eq. 7-8): prototype tokens get virtual positions 1..n_o; tokens of the prototype
that match a concept are position centers; each prototype token's value is its smallest
distance to a center plus one (a center itself: 1); concept tokens get 0::

    D(s_v) = min{|v - p| : s_p in O matches a concept} + 1   for s_v in O            (Eq. 7-8)
    D(s_v) = 0                                                for s_v in C

A prototype without any concept token has no center: its tokens get ``max_distance``.
Distances are clipped to ``max_distance``.

Attention (Eq. 9): a learned embedding E_D of D is added to the keys of the
encoder-decoder attention::

    S(h_u^d, h_v^e) = (W_q h_u^d)^T (W_k h_v^e + E_D(D(s_v))) / sqrt(d_k)

implemented exactly so: E_D(D) is added to the projected keys once per source (before
fairseq's incremental-state cache stores them), so a decoding step costs what fairseq's
attention costs and the cache keeps fairseq's layout and beam reordering. With the keys so
modified the weights are a plain softmax: when the caller does not ask for them (fairseq's
decoder asks in its alignment layer only, in training) the layer runs
``F.scaled_dot_product_attention`` on the modified keys
(:meth:`~fairseq_knowgen.modules.cross_attention.ReweightedCrossAttention.fused_attention`). Each decoder layer
with the indicator has its own E_D (``distance_embed``, ``max_distance + 1`` rows). The paper does
not say how E_D starts; the authors' code draws its distance table from N(0, 0.005^2)
(``--position-embedding-init-scale 5e-3``), the default ``init_std`` (their released model never
fed it distances, see ``docs/methods/eki.md``); ``init_std=0`` starts it at zero (the pretrained
attention unchanged). It is redrawn after fairseq's own initialization (BART's ``init_bert_params``),
see :meth:`PositionIndicatorAttention.reset_eki_parameters`.
"""

import functools
from typing import List, Optional, Sequence, Tuple

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .cross_attention import ReweightedCrossAttention


def prototype_distances(is_center: Sequence[bool], max_distance: int) -> List[int]:
    """Eq. 7-8 for one prototype: ``is_center[v]`` marks prototype tokens matching a concept."""
    centers = [v for v, c in enumerate(is_center) if c]
    if not centers:
        return [max_distance] * len(is_center)
    return [min(min(abs(v - p) for p in centers) + 1, max_distance) for v in range(len(is_center))]


class PositionIndicatorAttention(ReweightedCrossAttention):
    """Encoder-decoder attention with the position indicator added to its keys (Eq. 9).

    Same parameters as fairseq's ``MultiheadAttention`` plus ``distance_embed``
    (``max_distance + 1`` x embed_dim); takes ``distances`` (``B x S``) in ``forward``.

    Args (besides MultiheadAttention's):
        max_distance: distances are clipped to this (>= 1: concept tokens 0, prototype tokens 1+).
        distance_init_std: E_D ~ N(0, std^2) at the start (>= 0; 0: zero).
    """

    def __init__(self, embed_dim, num_heads, max_distance: int = 64, distance_init_std: float = 5e-3, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        if max_distance < 1:
            raise ValueError(f"max_distance must be >= 1 (concepts 0, prototype tokens 1+), got {max_distance}")
        if not distance_init_std >= 0:
            raise ValueError(f"distance_init_std must be >= 0, got {distance_init_std}")
        self.max_distance = max_distance
        self.distance_init_std = distance_init_std
        self.distance_embed = nn.Embedding(max_distance + 1, embed_dim)
        self.reset_eki_parameters()
        # set by EKIDecoder.extract_features for the duration of one decoder call (fairseq's
        # decoder layer passes no extra arguments to its attention)
        self.distances: Optional[Tensor] = None

    def reset_eki_parameters(self):
        """E_D ~ N(0, ``distance_init_std``^2), or 0 (the attention starts as the pretrained one).
        (Not named ``reset_parameters``, which MultiheadAttention's constructor calls for its projections.)"""
        if self.distance_init_std > 0:
            nn.init.normal_(self.distance_embed.weight, std=self.distance_init_std)
        else:
            nn.init.zeros_(self.distance_embed.weight)

    def distance_keys(self, distances: Tensor, kv_bsz: int) -> Tensor:
        """E_D(D): ``S x kv_bsz x C`` from distances ``B x S``. In beam search fairseq keeps
        one copy of each sentence's keys for its ``B / kv_bsz`` beams: take the first beam's
        row, as it does for the keys."""
        if distances.size(0) != kv_bsz:
            distances = distances.view(kv_bsz, -1, distances.size(1))[:, 0]
        return self.distance_embed(distances.clamp(0, self.max_distance)).transpose(0, 1)

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=True,
        static_kv=True,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
        distances: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """query ``T x B x C``, key/value ``S x B x C``, distances ``B x S`` ->
        (``T x B x C``, weights as fairseq returns them)."""
        distances = self.distances if distances is None else distances
        if distances is None:
            raise ValueError("the position indicator needs the prototype distances of the source")
        tgt_len, bsz, _ = query.size()
        offset = functools.partial(self.distance_keys, distances)
        q, k, v, pad, _ = self.project(query, key, value, key_padding_mask, incremental_state, key_offset=offset)
        if not (need_weights or need_head_weights or before_softmax):
            return self.fused_attention(q, k, v, pad, bsz), None
        logits = self.masked_logits(q, k, pad, bsz)
        probs = F.softmax(logits.float(), dim=-1).type_as(logits)
        return self.attend(probs, v, bsz, tgt_len, need_weights, need_head_weights)
