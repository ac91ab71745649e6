"""EKI prototype position indicator (``shared/seeds/eki_bart.txt``, Eq. 7-9).

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

implemented as the usual logits plus q . E_D(D) per head, so that the cached keys and
values of incremental decoding stay fairseq's. E_D starts at zero (the pretrained
attention unchanged).
"""

from typing import List, Optional, Sequence, Tuple

import torch
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
    """

    def __init__(self, embed_dim, num_heads, max_distance: int = 64, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        self.max_distance = max_distance
        self.distance_embed = nn.Embedding(max_distance + 1, embed_dim)
        nn.init.zeros_(self.distance_embed.weight)
        # set by EKIDecoder.extract_features for the duration of one decoder call (fairseq's
        # decoder layer passes no extra arguments to its attention)
        self.distances: Optional[Tensor] = None

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
        distances = self.distances if distances is None else distances
        if distances is None:
            raise ValueError("the position indicator needs the prototype distances of the source")
        tgt_len, bsz, _ = query.size()
        logits, v = self.masked_logits_and_values(query, key, value, key_padding_mask, incremental_state)
        # q . E_D(D) per head: q as the parent scales it, distances per (sentence x beam)
        q = (self.q_proj(query) * self.scaling).view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        e = self.distance_embed(distances.clamp(0, self.max_distance))  # B x S x C
        e = (
            e.view(bsz, -1, self.num_heads, self.head_dim)
            .transpose(1, 2)
            .reshape(bsz * self.num_heads, -1, self.head_dim)
        )
        logits = logits + torch.bmm(q, e.transpose(1, 2))
        probs = F.softmax(logits.float(), dim=-1).type_as(logits)
        return self.attend(probs, v, bsz, tgt_len, need_weights, need_head_weights)
