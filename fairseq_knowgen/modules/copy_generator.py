"""Pointer-generator copy head (See et al., 2017), as used by the force-copy paper.

Paper text: ``shared/seeds/force_copy.txt``. At each target step t, with copy attention
alpha_t over source positions, encoder states h_i, decoder state s_t and decoder input
embedding y_t:

- context vector (Eq. 3): c_t = sum_i alpha_{t,i} h_i
- vocabulary distribution (Eq. 4): P_vocab = softmax(logits), over the *fixed* vocabulary
- soft switch (Eq. 5): p_gen = sigmoid(z), z = w_h^T c_t + w_s^T s_t + w_y^T y_t + b_ptr
- mixture (Eq. 6):     P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} alpha_{t,i}

Eq. 6 is computed in log space: log P(w) = logsumexp(log p_gen + log P_vocab(w),
log(1 - p_gen) + log sum_{i: x_i = w} alpha_{t,i}), with log p_gen = logsigmoid(z),
log(1 - p_gen) = logsigmoid(-z) and log P_vocab = log_softmax(logits), so a word of
probability 1e-12 gets log 1e-12, not a clamped value. The copy attention comes from an
attention layer as probabilities: its log is exact down to float32's smallest normal number
(~1e-38) and floored there for words of the source (never -inf for a word the source has);
words absent from the source get exactly log 0 = -inf from the copy part.

Choices the text leaves open (documented here, flags of ``copy_transformer``):

- alpha comes from one decoder cross-attention layer, averaged over its first
  ``--copy-heads`` heads (default: all) of layer ``--copy-layer`` (default: last);
- alpha is renormalized over *copyable* source positions: special symbols (EOS, BOS, pad)
  and ``<unk>`` are never copied (an ``<unk>`` in the source stands for some unknown word,
  not for the target's), so the copy part is a proper distribution over source words. When
  that layer uses diminishing attention, alpha is its diminishing weights, renormalized;
- words outside the vocabulary are copied through placeholder symbols ``<unk-N>`` (the
  source word at position N), as in fairseq's ``examples/pointer_generator``; see
  :mod:`fairseq_knowgen.prep.placeholders`. The placeholders are not in the fixed
  vocabulary: ``not_generated`` sets their logits to -inf, so P_vocab gives them exactly 0
  ("if w is an OOV word, then P_vocab(w) is zero", after Eq. 6) and they reach the output
  only by copying. With subword (BPE) input every piece is in the vocabulary, and the head
  copies pieces.

Cost: training only needs log P at the target (:func:`mixture_lprobs_at`, ``B x T``), so
``CopyGenerator(..., full=False)`` skips the full mixture; :func:`full_mixture` computes it
from the same parts when a caller needs it (decoding, another criterion), with one ``B x T x
V`` addition and a scatter beyond the ``log_softmax`` of P_vocab, the log-sum itself only at
the source words. Measured on CommonGen (EKI input, 8,000 BPE types): the full mixture written
densely (a dozen ``B x T x V`` operations and their gradients) made a training step ~2.7x
slower than EKI without the copy head.
"""

from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def log_add(a: Tensor, b: Tensor) -> Tensor:
    """log(exp(a) + exp(b)) elementwise for a, b < +inf; -inf where both are -inf, with zero
    gradients there (``torch.logaddexp`` gives NaN gradients where both are -inf, which the
    placeholders absent from a source are)."""
    m = torch.maximum(a, b)
    none = m == float("-inf")
    m = m.masked_fill(none, 0.0)
    s = torch.exp(a - m) + torch.exp(b - m)
    return (m + s.masked_fill(none, 1.0).log()).masked_fill(none, float("-inf"))


def copy_lprobs_at(copy_attn: Tensor, src_tokens: Tensor, copyable: Tensor, words: Tensor) -> Tensor:
    """log sum_{i: x_i = w, i copyable} alpha_{t,i} for one word w per step (``words``: ``B x T``),
    floored at the smallest normal float for words of the source, -inf for the others
    (the copy part of Eq. 6 at those words only: ``B x T``)."""
    match = (src_tokens.unsqueeze(1) == words.unsqueeze(2)) & copyable.unsqueeze(1)  # B x T x S
    mass = (copy_attn.float() * match).sum(-1)
    tiny = torch.finfo(mass.dtype).tiny
    return mass.clamp_min(tiny).log().masked_fill(~match.any(-1), float("-inf"))


def mixture_lprobs_at(
    words: Tensor, vocab_lprobs: Tensor, p_gen_logit: Tensor, copy_attn: Tensor, src_tokens: Tensor, copyable: Tensor
) -> Tensor:
    """log P(w) of Eq. 6 for one word w per step (``words``: ``B x T``), without the ``B x T x V``
    mixture: equal to ``full_mixture(...).gather(-1, words)``."""
    z = p_gen_logit.float().squeeze(-1)
    vocab = vocab_lprobs.gather(-1, words.unsqueeze(-1)).squeeze(-1)
    return log_add(F.logsigmoid(z) + vocab, F.logsigmoid(-z) + copy_lprobs_at(copy_attn, src_tokens, copyable, words))


def full_mixture(
    vocab_lprobs: Tensor, p_gen_logit: Tensor, copy_attn: Tensor, src_tokens: Tensor, copyable: Tensor
) -> Tensor:
    """log P(w) of Eq. 6 for every word of the vocabulary: ``B x T x V``.

    Only the words of the source have a copy part, so the mixture is computed where it
    differs from the generation part: log p_gen + log P_vocab over the vocabulary (one
    ``B x T x V`` addition), then Eq. 6's log-sum at the source positions (``B x T x S``),
    written back once per distinct copyable word (its first copyable position; the others
    write into a spare column that is cut off, so that no gradient is counted twice).
    Values and gradients equal :func:`mixture_lprobs_at` at every word."""
    bsz, tgt_len, vocab_size = vocab_lprobs.shape
    src_len = src_tokens.size(1)
    z = p_gen_logit.float()
    generated = F.logsigmoid(z) + vocab_lprobs  # B x T x V
    # same[b, i, j]: position j is copyable and holds the word of position i
    same = (src_tokens.unsqueeze(2) == src_tokens.unsqueeze(1)) & copyable.unsqueeze(1)  # B x S x S
    mass = torch.bmm(copy_attn.float(), same.transpose(1, 2).float())  # B x T x S: the copy mass of x_i's word
    # floored at the smallest normal float (an attention weight may underflow): never -inf for a source word
    tiny = torch.finfo(mass.dtype).tiny
    index = src_tokens.unsqueeze(1).expand(bsz, tgt_len, src_len)
    mixed = log_add(generated.gather(2, index), F.logsigmoid(-z) + mass.clamp_min(tiny).log())  # B x T x S
    earlier = torch.ones(src_len, src_len, dtype=torch.bool, device=same.device).tril(-1)  # j < i
    writer = copyable & ~(same & earlier).any(2)  # B x S: the first copyable position of each word
    write_to = torch.where(writer.unsqueeze(1), index, torch.full_like(index, vocab_size))
    spare = generated.new_zeros(bsz, tgt_len, 1)
    return torch.cat([generated, spare], dim=2).scatter(2, write_to, mixed)[..., :vocab_size].contiguous()


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
        not_generated: Optional[Tensor] = None,
        full: bool = True,
    ) -> Dict[str, Optional[Tensor]]:
        """
        Args:
            vocab_logits: ``B x T x V``; state: ``B x T x C_s``; input_embed: ``B x T x C_y``
            attn: raw copy attention ``B x T x S``; encoder_states: ``B x S x C_h``
            src_tokens: ``B x S`` vocabulary ids; copyable: ``B x S`` bool
            not_generated: ``V`` bool, ids outside the fixed vocabulary (P_vocab = 0)
            full: compute the mixture over the whole vocabulary (else ``lprobs`` is None: see
                :func:`mixture_lprobs_at` and :func:`full_mixture`)
        Returns:
            dict with ``lprobs`` (log of Eq. 6, ``B x T x V``, or None), ``vocab_lprobs`` (log
            P_vocab), ``p_gen`` and its logit ``p_gen_logit`` (z of Eq. 5, ``B x T x 1``)
            and ``copy_attn`` (alpha renormalized, ``B x T x S``).
        """
        bsz, tgt_len, _ = vocab_logits.shape
        assert attn.shape == (bsz, tgt_len, src_tokens.size(1)), (attn.shape, src_tokens.shape)
        assert copyable.shape == src_tokens.shape, (copyable.shape, src_tokens.shape)
        alpha = attn.float() * copyable.unsqueeze(1)
        alpha = alpha / alpha.sum(-1, keepdim=True).clamp_min(1e-9)
        context = torch.bmm(alpha.type_as(encoder_states), encoder_states)  # B x T x C_h
        z = self.switch(torch.cat([context, state, input_embed], dim=-1)).float()  # B x T x 1
        logits = vocab_logits.float()
        if not_generated is not None:
            logits = logits.masked_fill(not_generated.to(logits.device), float("-inf"))
        vocab_lprobs = torch.log_softmax(logits, dim=-1)
        lprobs = full_mixture(vocab_lprobs, z, alpha, src_tokens, copyable) if full else None
        return {
            "lprobs": lprobs,
            "vocab_lprobs": vocab_lprobs,
            "p_gen": torch.sigmoid(z),
            "p_gen_logit": z,
            "copy_attn": alpha,
        }


def copyable_mask(src_tokens: Tensor, uncopyable: Optional[Tensor]) -> Tensor:
    """True at source positions whose token may be copied (``uncopyable``: a ``V`` bool
    mask of ids that are never copied, e.g. pad/EOS/BOS/``<unk>``)."""
    if uncopyable is None:
        return torch.ones_like(src_tokens, dtype=torch.bool)
    return ~uncopyable.to(src_tokens.device)[src_tokens]
