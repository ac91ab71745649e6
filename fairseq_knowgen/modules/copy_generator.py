"""Pointer-generator copy head (See et al., 2017), as used by "May the Force Be with Your Copy
Mechanism: Enhanced Supervised-Copy Method for Natural Language Generation".

At each target step t, with copy attention alpha_t over source positions, encoder states h_i,
decoder state s_t and decoder input embedding y_t:

- context vector (Eq. 3): c_t = sum_i alpha_{t,i} h_i
- vocabulary distribution (Eq. 4): P_vocab = softmax(W'_v (W_v [s_t; c_t] + b) + b'), over the *fixed*
  vocabulary, with ``p_vocab="eq4"``; by default (``p_vocab="output"``) P_vocab = softmax(logits) of
  the logits the caller gives, fairseq's output projection of s_t alone (see below)
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

- alpha comes from one decoder cross-attention layer, ``--copy-layer`` (default: the last),
  and one of its heads: the first (``--copy-heads 1``, the default, as fairseq's
  pointer-generator's ``--alignment-heads 1``), or the average of its first H heads or of all;
- the positions of Eq. 6's sum (``support``, the ``copyable`` argument here) are every non-pad
  source position by default (``--copy-alpha raw``): EOS and ``<unk>`` in the source add to
  P(EOS) and P(<unk>), as Eq. 6 and fairseq's pointer-generator do. With ``--copy-alpha
  renormalized`` they are the *copyable* positions only: special symbols (EOS, BOS, pad) and
  ``<unk>`` are never copied (an ``<unk>`` in the source stands for some unknown word, not for
  the target's), and alpha is renormalized over the rest, so the copy part is a distribution
  over source words. alpha is divided by its sum over the support: a softmax attention
  already sums to 1 over the non-pad positions, so raw alpha is unchanged; when the layer uses
  diminishing attention, whose weights sum to less than 1, alpha is those weights divided by
  their sum;
- the context vector c_t of Eq. 5 is Eq. 3 with that alpha (the paper's c_t comes from the same
  attention distribution as Eq. 6's alpha);
- P_vocab (Eq. 4): by default the decoder's own output projection of s_t (``--copy-p-vocab output``),
  which fairseq ties with the decoder's input embeddings under ``--share-decoder-input-output-embed``
  or ``--share-all-embeddings``, as fairseq's ``transformer_pointer_generator`` computes it: a
  transformer's s_t has attended to the source already. ``--copy-p-vocab eq4`` is Eq. 4 as written,
  two linear layers on [s_t; c_t]: W_v, b (``vocab_hidden``, to the size of s_t) and W'_v, b' (the
  decoder's output projection, whose matrix is its own unless those flags tie it, and ``vocab_bias``);
- words outside the vocabulary are copied through placeholder symbols ``<unk-N>`` (the
  source word at position N), as in fairseq's ``examples/pointer_generator``; see
  :mod:`fairseq_knowgen.prep.placeholders`. The placeholders are not in the fixed
  vocabulary: ``not_generated`` sets their logits to -inf, so P_vocab gives them exactly 0
  ("if w is an OOV word, then P_vocab(w) is zero", after Eq. 6) and they reach the output
  only by copying. With subword (BPE) input every piece is in the vocabulary, and the head
  copies pieces.

Cost: training only needs log P at the target (:func:`mixture_lprobs_at`, ``B x T``), so
``CopyGenerator(..., full=False)`` skips the full mixture. Decoding needs it over the whole
vocabulary, and computes it where it differs from generation only: Eq. 6 divided by p_gen is

    P(w) / p_gen = P_vocab(w) + e^{-z} sum_{i: x_i = w} alpha_{t,i}

so its log (:func:`mixture_logits`) is log P_vocab everywhere except at the source words,
where one value per distinct word is written. Those are *logits* of the mixture: their
log-softmax is log P(w) exactly (they sum to 1 / p_gen), so the decoder returns them as its
first output like any fairseq decoder returns logits, and ``get_normalized_probs``'s one
log-softmax (the one every decoder pays) gives log P(w), or P(w)^(1/T) / Z after fairseq's
``--temperature`` T has divided them. No second normalisation, no ``B x T x V`` operation
beyond log P_vocab's ``log_softmax``. What depends on the source alone (which positions may
be copied, which position stands for each distinct word: :func:`source_index`) is computed
once per input and kept in the incremental state, reordered with the beam.
Measured on CommonGen (EKI input, 8,000 BPE types): the full mixture written densely (a dozen
``B x T x V`` operations and their gradients) made a training step ~2.7x slower than EKI
without the copy head.
"""

from typing import Callable, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
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


def source_index(src_tokens: Tensor, copyable: Tensor) -> Dict[str, Tensor]:
    """What the mixture needs of the source alone (each ``B x S``), computed once per input:

    - ``tokens``: x_i, the vocabulary column position i writes; ``copyable``;
    - ``slot``: the position standing for x_i's word: its first copyable position, else its
      first position; ``primary``: ``slot == i`` (one position per distinct word);
    - ``has_copy``: the word has a copyable position (it gets a copy part in Eq. 6).

    A stable sort by (word, not copyable) groups the positions of a word, copyable ones first:
    ``O(S log S)``, not an ``S x S`` comparison."""
    bsz, src_len = src_tokens.shape
    key = src_tokens * 2 + (~copyable).long()
    sorted_key, perm = torch.sort(key, dim=1, stable=True)
    word = sorted_key // 2
    starts = torch.ones_like(copyable)
    starts[:, 1:] = word[:, 1:] != word[:, :-1]
    pos = torch.arange(src_len, device=src_tokens.device).expand(bsz, src_len)
    group_first = torch.where(starts, pos, torch.zeros_like(pos)).cummax(dim=1).values  # in sorted order
    slot = torch.empty_like(perm).scatter_(1, perm, perm.gather(1, group_first))
    return {
        "tokens": src_tokens,
        "copyable": copyable,
        "slot": slot,
        "primary": slot == pos,
        "has_copy": copyable.gather(1, slot),
    }


def mixture_logits(
    vocab_lprobs: Tensor, p_gen_logit: Tensor, copy_attn: Tensor, index: Dict[str, Tensor], in_place: bool = False
) -> Tensor:
    """Logits of Eq. 6's mixture, ``B x T x V``: u(w) = log(P_vocab(w) + e^{-z} sum_{i: x_i = w}
    alpha_{t,i}) = log P(w) - log p_gen, so that ``log_softmax(u)`` is log P(w).

    Equal to log P_vocab except at the source words: Eq. 6's log-sum is computed at the source
    positions (``B x T x S``, the copy mass of each word collected at its ``slot``) and written
    into ``vocab_lprobs``'s columns (a copy of it, or ``vocab_lprobs`` itself with ``in_place``;
    autograd: only without gradients). Every position of a word writes the same value; only the
    word's ``primary`` position carries a gradient, so none is counted twice.

    Args:
        vocab_lprobs: log P_vocab ``B x T x V``; p_gen_logit: z, ``B x T x 1``
        copy_attn: alpha ``B x T x S``; index: :func:`source_index` of the source
    """
    bsz, tgt_len, _ = vocab_lprobs.shape
    src_len = index["tokens"].size(1)
    alpha = copy_attn.float() * index["copyable"].unsqueeze(1)
    slot = index["slot"].unsqueeze(1).expand(bsz, tgt_len, src_len)
    mass = torch.zeros_like(alpha).scatter_add_(2, slot, alpha).gather(2, slot)  # B x T x S: x_i's word's mass
    cols = index["tokens"].unsqueeze(1).expand(bsz, tgt_len, src_len)
    at_src = vocab_lprobs.gather(2, cols)  # B x T x S
    # floored at the smallest normal float (an attention weight may underflow): never -inf for a source word
    tiny = torch.finfo(mass.dtype).tiny
    copied = log_add(at_src, mass.clamp_min(tiny).log() - p_gen_logit.float())
    value = torch.where(index["has_copy"].unsqueeze(1), copied, at_src)
    value = torch.where(index["primary"].unsqueeze(1), value, value.detach())
    if in_place:
        return vocab_lprobs.scatter_(2, cols, value)
    return vocab_lprobs.scatter(2, cols, value)


def full_mixture(
    vocab_lprobs: Tensor, p_gen_logit: Tensor, copy_attn: Tensor, src_tokens: Tensor, copyable: Tensor
) -> Tensor:
    """log P(w) of Eq. 6 for every word of the vocabulary: ``B x T x V``, the
    :func:`mixture_logits` plus log p_gen. Values and gradients equal :func:`mixture_lprobs_at`
    at every word."""
    z = p_gen_logit.float()
    return mixture_logits(vocab_lprobs, z, copy_attn, source_index(src_tokens, copyable)) + F.logsigmoid(z)


@with_incremental_state
class CopyGenerator(nn.Module):
    """Soft switch and mixture distribution of the pointer-generator.

    Args:
        state_dim: decoder output state size (s_t).
        context_dim: encoder output size (h_i, c_t).
        input_dim: decoder input embedding size (y_t).
        p_vocab: ``output`` (P_vocab from the logits the caller gives) or ``eq4`` (Eq. 4 on [s_t; c_t]:
            ``vocab_hidden`` is W_v and b, ``vocab_bias`` is b', and the caller gives W'_v as
            ``vocab_projection``; see the module docstring).
        vocab_size: the size of b' (``eq4`` only).
    """

    P_VOCAB = ("output", "eq4")

    def __init__(self, state_dim: int, context_dim: int, input_dim: int, p_vocab: str = "output", vocab_size: int = 0):
        super().__init__()
        # one linear map over [c_t; s_t; y_t] is w_h^T c_t + w_s^T s_t + w_y^T y_t + b_ptr
        self.switch = nn.Linear(context_dim + state_dim + input_dim, 1)
        if p_vocab not in self.P_VOCAB:
            raise ValueError(f"p_vocab must be one of {', '.join(self.P_VOCAB)}, got {p_vocab!r}")
        self.p_vocab = p_vocab
        if p_vocab == "eq4":
            # W_v, b of Eq. 4: [s_t; c_t] -> the size of s_t, the input of the decoder's output projection W'_v
            self.vocab_hidden = nn.Linear(state_dim + context_dim, state_dim)
            nn.init.xavier_uniform_(self.vocab_hidden.weight)
            nn.init.zeros_(self.vocab_hidden.bias)
            self.vocab_bias = nn.Parameter(torch.zeros(vocab_size))  # b'

    def forward(
        self,
        vocab_logits: Optional[Tensor],
        state: Tensor,
        input_embed: Tensor,
        attn: Tensor,
        encoder_states: Tensor,
        src_tokens: Tensor,
        copyable: Tensor,
        not_generated: Optional[Tensor] = None,
        full: bool = True,
        index: Optional[Dict[str, Tensor]] = None,
        in_place: bool = False,
        vocab_projection: Optional[Callable[[Tensor], Tensor]] = None,
    ) -> Dict[str, Optional[Tensor]]:
        """
        Args:
            vocab_logits: ``B x T x V`` (overwritten at ``not_generated``), or None with ``eq4``;
                state: ``B x T x C_s``; input_embed: ``B x T x C_y``
            attn: raw copy attention ``B x T x S``; encoder_states: ``B x S x C_h``
            src_tokens: ``B x S`` vocabulary ids; copyable: ``B x S`` bool, the positions of Eq. 6's
                sum (the support; alpha is divided by its sum over them)
            not_generated: 1-D ids outside the fixed vocabulary (P_vocab = 0)
            full: compute the mixture over the whole vocabulary (else ``logits`` is None: see
                :func:`mixture_lprobs_at` and :func:`mixture_logits`)
            index: :func:`source_index` of ``src_tokens`` and ``copyable`` when the caller keeps
                it (see :meth:`source_index`); computed here otherwise
            in_place: write the mixture into log P_vocab's tensor (decoding without gradients;
                ``vocab_lprobs`` is then None)
            vocab_projection: ``eq4``: W'_v, ``B x T x C_s`` -> ``B x T x V`` without bias (the
                decoder's output projection)
        Returns:
            dict with ``logits`` (the mixture's logits, :func:`mixture_logits`: their
            log-softmax is log of Eq. 6, ``B x T x V``, or None), ``vocab_lprobs`` (log
            P_vocab), ``p_gen`` and its logit ``p_gen_logit`` (z of Eq. 5, ``B x T x 1``)
            and ``copy_attn`` (alpha over the support, ``B x T x S``).
        """
        bsz, tgt_len, _ = state.shape
        assert attn.shape == (bsz, tgt_len, src_tokens.size(1)), (attn.shape, src_tokens.shape)
        assert copyable.shape == src_tokens.shape, (copyable.shape, src_tokens.shape)
        assert (vocab_logits is None) == (self.p_vocab == "eq4"), "eq4 computes the logits, output reads them"
        alpha = attn.float() * copyable.unsqueeze(1)
        alpha = alpha / alpha.sum(-1, keepdim=True).clamp_min(1e-9)
        context = torch.bmm(alpha.type_as(encoder_states), encoder_states)  # B x T x C_h
        z = self.switch(torch.cat([context, state, input_embed], dim=-1)).float()  # B x T x 1
        if self.p_vocab == "eq4":  # Eq. 4: W'_v (W_v [s_t; c_t] + b) + b'
            hidden = self.vocab_hidden(torch.cat([state, context.type_as(state)], dim=-1))  # B x T x C_s
            vocab_logits = vocab_projection(hidden) + self.vocab_bias
        logits = vocab_logits.float()
        if not_generated is not None and not_generated.numel() > 0:
            logits = logits.index_fill_(-1, not_generated.to(logits.device), float("-inf"))
        vocab_lprobs = torch.log_softmax(logits, dim=-1)
        mixed = None
        if full:
            index = source_index(src_tokens, copyable) if index is None else index
            mixed = mixture_logits(vocab_lprobs, z, alpha, index, in_place=in_place)
        return {
            "logits": mixed,
            "vocab_lprobs": None if (full and in_place) else vocab_lprobs,
            "p_gen": torch.sigmoid(z),
            "p_gen_logit": z,
            "copy_attn": alpha,
        }

    def source_index(
        self, src_tokens: Tensor, uncopyable: Optional[Tensor], incremental_state=None
    ) -> Dict[str, Tensor]:
        """:func:`source_index` of ``src_tokens`` (its ``copyable``, the support of Eq. 6: not
        ``uncopyable``, see :func:`copyable_mask`), computed on the first decoding step and kept in
        the incremental state (:meth:`reorder_incremental_state` moves it with the beam)."""
        if incremental_state is not None:
            cached = self.get_incremental_state(incremental_state, "source")
            if cached is not None:
                return cached
        index = source_index(src_tokens, copyable_mask(src_tokens, uncopyable))
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "source", index)
        return index

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Beam search: the source index follows its hypotheses (``index_select(0, new_order)``)."""
        cached = self.get_incremental_state(incremental_state, "source")
        if cached is not None:
            reordered = {k: v.index_select(0, new_order) for k, v in cached.items()}
            self.set_incremental_state(incremental_state, "source", reordered)


def copyable_mask(src_tokens: Tensor, uncopyable: Optional[Tensor]) -> Tensor:
    """True at source positions whose token may be copied (``uncopyable``: a ``V`` bool
    mask of ids that are never copied, e.g. pad/EOS/BOS/``<unk>``)."""
    if uncopyable is None:
        return torch.ones_like(src_tokens, dtype=torch.bool)
    return ~uncopyable.to(src_tokens.device)[src_tokens]
