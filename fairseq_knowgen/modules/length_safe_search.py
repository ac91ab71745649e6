"""Lexically constrained beam search that ends every hypothesis at the length limit.

fairseq's :class:`~fairseq.search.LexicallyConstrainedBeamSearch` forbids EOS to any hypothesis
whose constraints are not all met. At the length limit ``SequenceGenerator`` allows *only* EOS, so
a hypothesis that has not met its constraints by then has no token left: no hypothesis of its
input ends, and the generator stops the whole run with ``AssertionError: N < N``. That happens
whenever the model cannot place a constraint in time: a model looping on subword pieces
(CommonGen EKI, "risrisris..."), a decoding rule that blocks a constraint's token
(``--at-most-once`` with an entity that must appear twice), ``--no-repeat-ngram-size``.

:class:`LengthSafeConstrainedBeamSearch` keeps fairseq's search at every other step, and at the step
where only EOS is allowed for each input that has a hypothesis meeting all its constraints (those
end, as in fairseq). Only for an input none of whose hypotheses can end that way it takes
plain beam search's choice there (each live hypothesis ends with EOS), so every input gets its
hypotheses. Such an output lacks some constraint: the count is logged (``hypotheses ended at the length limit before meeting their constraints``) and readers
see it in the coverage scores; nothing is hidden or dropped.
"""

import logging
from typing import Optional

import torch
from fairseq.search import BeamSearch, LexicallyConstrainedBeamSearch
from torch import Tensor

logger = logging.getLogger(__name__)


NO_SCORE = -1e9  # the score a hypothesis with probability 0 ends with at the limit (fairseq's finalizer skips -inf)


def only_eos_allowed(lprobs: Tensor, eos: int) -> bool:
    """True at the length limit: every token but EOS has probability 0 in every hypothesis."""
    return bool(torch.isinf(lprobs[..., :eos]).all() and torch.isinf(lprobs[..., eos + 1 :]).all())


class LengthSafeConstrainedBeamSearch(LexicallyConstrainedBeamSearch):
    """fairseq's constrained beam search, except that at the length limit hypotheses may end
    without their constraints (module docstring). ``unmet_at_limit`` counts them.

    An input is stuck when none of its ``beam`` best candidates at the limit is an EOS with a
    finite score: no hypothesis met its constraints, or the ones that did took a constraint token a
    decoding rule had blocked (``--at-most-once``, ``--no-repeat-ngram-size``: fairseq's banks
    still add such tokens, with score -inf, and a -inf EOS is never finalized)."""

    def __init__(self, tgt_dict, representation):
        super().__init__(tgt_dict, representation)
        self.unmet_at_limit = 0

    def step(
        self,
        step: int,
        lprobs: Tensor,
        scores: Optional[Tensor],
        prev_output_tokens: Optional[Tensor] = None,
        original_batch_idxs: Optional[Tensor] = None,
    ):
        if not (step > 0 and self.constraint_states and only_eos_allowed(lprobs, self.eos)):
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs)
        beam_size = lprobs.size(1)
        cands = super().step(step, lprobs.clone(), scores, prev_output_tokens, original_batch_idxs)
        cand_scores, cand_indices = cands[0][:, :beam_size], cands[1][:, :beam_size]
        stuck = ~(cand_indices.eq(self.eos) & torch.isfinite(cand_scores)).any(dim=1)
        if not stuck.any():
            return cands
        self.unmet_at_limit += int(stuck.sum()) * beam_size
        logger.warning(
            f"{int(stuck.sum())} inputs had no hypothesis meeting its constraints at the length limit: their "
            f"{beam_size} best end there ({self.unmet_at_limit} such hypotheses so far)"
        )
        plain = list(BeamSearch.step(self, step, lprobs, scores))
        # hypotheses that took a blocked constraint token have score -inf; they end too (at the bottom)
        plain[0] = plain[0].nan_to_num(neginf=NO_SCORE)
        return tuple(torch.where(stuck.unsqueeze(1), p, c) for p, c in zip(plain, cands))
