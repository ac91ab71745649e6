"""Pointer-generator copy head (See et al., 2017), as used by the force-copy paper.

Paper text: ``shared/seeds/force_copy.txt``. At each target step t, with copy attention
alpha_t over source positions, encoder states h_i, decoder state s_t and decoder input
embedding y_t:

- context vector: c_t = sum_i alpha_{t,i} h_i
- soft switch (Eq. 5): p_gen = sigmoid(w_h^T c_t + w_s^T s_t + w_y^T y_t + b_ptr)
- mixture (Eq. 6):     P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} alpha_{t,i}

Choices the text leaves open (documented here, flags of ``copy_transformer``):

- alpha comes from one decoder cross-attention layer, averaged over its first
  ``--copy-heads`` heads (default: all) of layer ``--copy-layer`` (default: last);
- alpha is renormalized over *copyable* source positions: special symbols (EOS, BOS, pad)
  are never copied, so the copy part is a proper distribution over source words. When that
  layer uses diminishing attention, alpha is its diminishing weights, renormalized;
- words outside the vocabulary are copied through placeholder symbols ``<unk-N>`` (the
  source word at position N), as in fairseq's ``examples/pointer_generator``; see
  :mod:`fairseq_knowgen.prep.placeholders`. With subword (BPE) input every piece is in the
  vocabulary, and the head copies pieces.
"""

from typing import Dict, Optional

import torch
import torch.nn as nn
from torch import Tensor


class CopyGenerator(nn.Module):
    """Soft switch and mixture distribution of the pointer-generator.

    Args:
        state_dim: decoder output state size (s_t).
        context_dim: encoder output size (h_i, c_t).
        input_dim: decoder input embedding size (y_t).
    """

    def __init__(self, state_dim: int, context_dim: int, input_dim: int):
        super().__init__()
        # one linear map over [c_t; s_t; y_t] is w_h^T c_t + w_s^T s_t + w_y^T y_t + b_ptr
        self.switch = nn.Linear(context_dim + state_dim + input_dim, 1)

    def forward(
        self,
        vocab_logits: Tensor,
        state: Tensor,
        input_embed: Tensor,
        attn: Tensor,
        encoder_states: Tensor,
        src_tokens: Tensor,
        copyable: Tensor,
    ) -> Dict[str, Tensor]:
        """
        Args:
            vocab_logits: ``B x T x V``; state: ``B x T x C_s``; input_embed: ``B x T x C_y``
            attn: raw copy attention ``B x T x S``; encoder_states: ``B x S x C_h``
            src_tokens: ``B x S`` vocabulary ids; copyable: ``B x S`` bool
        Returns:
            dict with ``probs`` (Eq. 6, ``B x T x V``), ``vocab_probs``, ``p_gen``
            (``B x T x 1``) and ``copy_attn`` (alpha renormalized, ``B x T x S``).
        """
        bsz, tgt_len, _ = vocab_logits.shape
        assert attn.shape == (bsz, tgt_len, src_tokens.size(1)), (attn.shape, src_tokens.shape)
        alpha = attn.float() * copyable.unsqueeze(1)
        alpha = alpha / alpha.sum(-1, keepdim=True).clamp_min(1e-9)
        context = torch.bmm(alpha.type_as(encoder_states), encoder_states)  # B x T x C_h
        p_gen = torch.sigmoid(self.switch(torch.cat([context, state, input_embed], dim=-1)).float())
        vocab_probs = torch.softmax(vocab_logits.float(), dim=-1)
        copy_probs = torch.zeros_like(vocab_probs).scatter_add_(
            2, src_tokens.unsqueeze(1).expand(bsz, tgt_len, -1), alpha
        )
        probs = p_gen * vocab_probs + (1.0 - p_gen) * copy_probs
        return {"probs": probs, "vocab_probs": vocab_probs, "p_gen": p_gen, "copy_attn": alpha}


def copyable_mask(src_tokens: Tensor, special: Optional[Tensor]) -> Tensor:
    """True at source positions whose token may be copied (not pad/EOS/BOS)."""
    if special is None:
        return torch.ones_like(src_tokens, dtype=torch.bool)
    return ~special.to(src_tokens.device)[src_tokens]
