"""Decoding rule: tokens that may appear at most once in a hypothesis.

A WebNLG entity placeholder ``<ent-K>`` stands for one whole entity; a sentence that names it twice
repeats the entity ("Alan Bean ... Alan Bean was ..."), which the references rarely do. fairseq's
``--no-repeat-ngram-size`` cannot say this (it blocks every repeated n-gram); this rule blocks only the
listed tokens, and only after they were generated once: at step t, for every hypothesis whose
tokens y_1..y_t contain a listed token w, log P(y_{t+1} = w) = -inf.

:class:`AtMostOnceBlock` has the call signature of fairseq's ``NGramRepeatBlock``
(``SequenceGenerator.repeat_ngram_blocker``), so it runs at the same point of every search step, and
it wraps an n-gram blocker when ``--no-repeat-ngram-size`` is also given.
"""

import re
from typing import Optional

import torch
from torch import Tensor, nn


def token_ids_matching(dictionary, pattern: str) -> Tensor:
    """Ids of the dictionary's symbols that match ``pattern`` as a whole (``re.fullmatch``)."""
    regex = re.compile(pattern)
    return torch.tensor([i for i, sym in enumerate(dictionary.symbols) if regex.fullmatch(sym)], dtype=torch.long)


class AtMostOnceBlock(nn.Module):
    """Forbid each of ``token_ids`` in a hypothesis that already holds it.

    Args:
        token_ids: 1-D ids of the tokens that may appear at most once
        inner: the generator's previous ``repeat_ngram_blocker`` (or None), applied first
    """

    def __init__(self, token_ids: Tensor, inner: Optional[nn.Module] = None):
        super().__init__()
        self.register_buffer("token_ids", token_ids.long(), persistent=False)
        self.inner = inner

    def forward(self, tokens: Tensor, lprobs: Tensor, bsz: int, beam_size: int, step: int) -> Tensor:
        """tokens: (bsz*beam) x (max_len+2), with position 0 the start symbol and 1..step the
        generated tokens; lprobs: (bsz*beam) x V, the scores of token step+1."""
        if self.inner is not None:
            lprobs = self.inner(tokens, lprobs, bsz, beam_size, step)
        if step == 0 or self.token_ids.numel() == 0:
            return lprobs
        if self.token_ids.device != lprobs.device:  # once: fairseq moves the models, not the generator
            self.token_ids = self.token_ids.to(lprobs.device)
        generated = tokens[:, 1 : step + 1]  # (bsz*beam) x step
        seen = (generated.unsqueeze(-1) == self.token_ids).any(dim=1)  # (bsz*beam) x K
        ids = self.token_ids.expand(lprobs.size(0), -1)  # (bsz*beam) x K
        # gather/scatter on the device: no host sync in the search step
        return lprobs.scatter_(1, ids, lprobs.gather(1, ids).masked_fill(seen, float("-inf")))
