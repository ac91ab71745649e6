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
end, as in fairseq). Only for an input none of whose hypotheses can end that way, each of its live
hypotheses ends with EOS there, so every input gets its hypotheses. Such an output lacks some
constraint: the count is logged (``inputs had no hypothesis meeting its constraints at the length
limit``) and readers see it in the coverage scores; nothing is hidden or dropped.

Two details make that hold with a decoding rule that blocks a constraint's token
(``--at-most-once``, ``--no-repeat-ngram-size``): fairseq's banks still offer the blocked token
(score -inf) and, ranking banks above scores, would put it in the beam ahead of finite
candidates; its hypothesis then carries -inf to the end, breaks the rule, and at the limit its EOS
is -inf too, so plain top-k picks arbitrary tokens instead of EOS and the run still failed
(``AssertionError: 200 < 200`` on WebNLG dev with ``--at-most-once '<ent-\\d+>'``). So

* at every step, candidates with score -inf go behind the finite ones of their input (order kept
  otherwise; their constraint states move with them): a blocked token enters the beam only when an
  input has fewer than ``beam`` finite candidates;
* at the limit, a stuck input ends each of its live hypotheses with an explicit EOS, best first,
  never through top-k over ties. Such an ending scores ``UNMET_PENALTY`` + its model score (a -inf
  score counts as ``NO_SCORE``), so a hypothesis of the same input that ended earlier with all
  its constraints still ranks first.
"""

import logging
from typing import Optional

import torch
from fairseq.search import LexicallyConstrainedBeamSearch
from torch import Tensor

logger = logging.getLogger(__name__)


NO_SCORE = -1e9  # the score a hypothesis with probability 0 ends with at the limit (fairseq's finalizer skips -inf)
UNMET_PENALTY = -1e4  # added to a hypothesis ended at the limit without its constraints (exact in float32 to ~1e-3)


def only_eos_allowed(lprobs: Tensor, eos: int) -> bool:
    """True at the length limit: every token but EOS has probability 0 in every hypothesis."""
    return bool(torch.isinf(lprobs[..., :eos]).all() and torch.isinf(lprobs[..., eos + 1 :]).all())


class LengthSafeConstrainedBeamSearch(LexicallyConstrainedBeamSearch):
    """fairseq's constrained beam search, except that at the length limit hypotheses may end
    without their constraints (module docstring). ``unmet_at_limit`` counts them (``beam`` per
    stuck input: an upper bound when the input had already finalized some hypotheses).

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
        if not self.constraint_states:
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs)
        at_limit = step > 0 and only_eos_allowed(lprobs, self.eos)
        # fairseq's step sets EOS to -inf in place for unfinished hypotheses: keep lprobs for the limit
        searched = lprobs.clone() if at_limit else lprobs
        cands = self._finite_first(super().step(step, searched, scores, prev_output_tokens, original_batch_idxs))
        if not at_limit:
            return cands
        beam_size = lprobs.size(1)
        cand_scores, cand_indices = cands[0][:, :beam_size], cands[1][:, :beam_size]
        stuck = ~(cand_indices.eq(self.eos) & torch.isfinite(cand_scores)).any(dim=1)
        if not stuck.any():
            return cands
        self.unmet_at_limit += int(stuck.sum()) * beam_size
        logger.warning(
            f"{int(stuck.sum())} inputs had no hypothesis meeting its constraints at the length limit: their "
            f"{beam_size} best end there ({self.unmet_at_limit} such hypotheses so far)"
        )
        ended = self._end_every_hypothesis(lprobs, scores, step, cands[0].size(1))
        return tuple(torch.where(stuck.unsqueeze(1), e, c) for e, c in zip(ended, cands))

    def _finite_first(self, cands):
        """Reorder each input's candidates so that those with score -inf come last (stable), and its
        constraint states with them (the generator picks them by candidate position)."""
        cand_scores, cand_indices, cand_beams = cands
        width = cand_scores.size(1)
        inf = torch.isinf(cand_scores)
        if not inf.any():
            return cands
        positions = torch.arange(width, device=cand_scores.device).expand_as(cand_scores)
        order = (positions + inf.long() * width).argsort(dim=1)  # finite in order, then -inf in order
        for sentno in inf.any(dim=1).nonzero().view(-1).tolist():
            states = self.constraint_states[sentno]
            self.constraint_states[sentno] = [states[i] for i in order[sentno].tolist()] + states[width:]
        return tuple(t.gather(1, order) for t in cands)

    def _end_every_hypothesis(self, lprobs: Tensor, scores: Tensor, step: int, width: int):
        """Candidates ending each hypothesis with EOS, best first, at ``UNMET_PENALTY`` + its score;
        the other ``width - beam`` positions repeat them with score -inf (the generator finalizes
        only the first ``beam``)."""
        beam_size = lprobs.size(1)
        model_scores = lprobs[:, :, self.eos] + scores[:, :, step - 1]
        eos_scores = UNMET_PENALTY + model_scores.nan_to_num(nan=NO_SCORE, neginf=NO_SCORE)
        eos_scores, beams = eos_scores.sort(dim=1, descending=True)
        pad = width - beam_size
        beams = torch.cat([beams, beams[:, :pad]], dim=1)
        eos_scores = torch.cat([eos_scores, torch.full_like(eos_scores[:, :pad], float("-inf"))], dim=1)
        return eos_scores, torch.full_like(beams, self.eos), beams
