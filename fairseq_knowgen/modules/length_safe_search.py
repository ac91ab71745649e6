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


def limit_reached(lprobs: Tensor, eos: int) -> Tensor:
    """A 0-dim bool tensor on ``lprobs``' device, true at the length limit: every token but EOS has
    probability 0 in every hypothesis. lprobs: B x beam x V."""
    return torch.isinf(lprobs[..., :eos]).all() & torch.isinf(lprobs[..., eos + 1 :]).all()


class LengthSafeConstrainedBeamSearch(LexicallyConstrainedBeamSearch):
    """fairseq's constrained beam search, except that at the length limit hypotheses may end
    without their constraints (module docstring). ``unmet_at_limit`` counts them (``beam`` per
    stuck input: an upper bound when the input had already finalized some hypotheses), as a tensor
    on the model's device; :meth:`log_unmet_at_limit` reports it after a batch.

    An input is stuck when none of its ``beam`` best candidates at the limit is an EOS with a
    finite score: no hypothesis met its constraints, or the ones that did took a constraint token a
    decoding rule had blocked (``--at-most-once``, ``--no-repeat-ngram-size``: fairseq's banks
    still add such tokens, with score -inf, and a -inf EOS is never finalized).

    What this class adds to each step stays on the model's device (no ``.item()``, ``.tolist()``,
    ``bool(tensor)``): the limit is a tensor condition and stuck inputs are swapped in with
    ``torch.where``; the -inf candidates are moved back by a device-side permutation, which
    :meth:`update_constraints` applies to the constraint states (fairseq's own host-side lists)
    when the generator picks the surviving candidates."""

    def __init__(self, tgt_dict, representation):
        super().__init__(tgt_dict, representation)
        self.unmet_at_limit = 0  # becomes a tensor on the model's device at the first step
        self.stuck_inputs = 0
        self._logged = 0
        self._order: Optional[Tensor] = None  # B x cands: our candidate position -> fairseq's

    def init_constraints(self, batch_constraints: Optional[Tensor], beam_size: int):
        self._order = None
        super().init_constraints(batch_constraints, beam_size)

    def prune_sentences(self, batch_idxs: Tensor):
        if self._order is not None:
            self._order = self._order.index_select(0, batch_idxs)
        super().prune_sentences(batch_idxs)

    def update_constraints(self, active_hypos: Tensor):
        """active_hypos: B x beam, positions among this search's (reordered) candidates."""
        if self._order is not None:
            active_hypos = self._order.gather(1, active_hypos)  # the same candidates in fairseq's order
        super().update_constraints(active_hypos)

    def step(
        self,
        step: int,
        lprobs: Tensor,
        scores: Optional[Tensor],
        prev_output_tokens: Optional[Tensor] = None,
        original_batch_idxs: Optional[Tensor] = None,
    ):
        """lprobs: B x beam x V; scores: B x beam x step. Returns fairseq's candidates (scores,
        tokens, beams: B x 2*beam each), -inf ones last, and at the limit the explicit EOS
        endings for stuck inputs."""
        if not self.constraint_states:
            self._order = None
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs)
        # fairseq's step sets EOS to -inf in place for unfinished hypotheses: keep the EOS scores
        eos_lprobs = lprobs[:, :, self.eos].clone()  # B x beam
        at_limit = limit_reached(lprobs, self.eos)  # 0-dim bool
        cands = self._finite_first(super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs))
        if step == 0:  # a first step is never the limit (fairseq's min_len >= 1)
            return cands
        beam_size = lprobs.size(1)
        cand_scores, cand_indices = cands[0][:, :beam_size], cands[1][:, :beam_size]
        met = (cand_indices.eq(self.eos) & torch.isfinite(cand_scores)).any(dim=1)  # B
        stuck = at_limit & ~met  # B
        self.stuck_inputs = self.stuck_inputs + stuck.sum()
        self.unmet_at_limit = self.unmet_at_limit + stuck.sum() * beam_size
        ended = self._end_every_hypothesis(eos_lprobs, scores, step, cands[0].size(1))
        return tuple(torch.where(stuck.unsqueeze(1), e, c) for e, c in zip(ended, cands))

    def log_unmet_at_limit(self):
        """Log the inputs stuck at the limit since the last call (reads the device counters: call
        it after a batch, not inside a step)."""
        stuck, unmet = int(self.stuck_inputs), int(self.unmet_at_limit)
        if unmet > self._logged:
            logger.warning(
                f"{stuck} inputs had no hypothesis meeting its constraints at the length limit: their best "
                f"hypotheses end there ({unmet} such hypotheses so far)"
            )
            self._logged = unmet

    def _finite_first(self, cands):
        """Reorder each input's candidates so that those with score -inf come last (order otherwise
        kept); remembers the permutation for :meth:`update_constraints`."""
        cand_scores = cands[0]  # B x width
        width = cand_scores.size(1)
        positions = torch.arange(width, device=cand_scores.device).expand_as(cand_scores)
        # distinct keys: finite candidates in their order, then the -inf ones in theirs
        self._order = (positions + torch.isinf(cand_scores).long() * width).argsort(dim=1)
        return tuple(t.gather(1, self._order) for t in cands)

    def _end_every_hypothesis(self, eos_lprobs: Tensor, scores: Tensor, step: int, width: int):
        """Candidates ending each hypothesis with EOS, best first, at ``UNMET_PENALTY`` + its score;
        the other ``width - beam`` positions repeat them with score -inf (the generator finalizes
        only the first ``beam``). eos_lprobs: B x beam; scores: B x beam x step."""
        beam_size = eos_lprobs.size(1)
        model_scores = eos_lprobs + scores[:, :, step - 1]
        eos_scores = UNMET_PENALTY + model_scores.nan_to_num(nan=NO_SCORE, neginf=NO_SCORE)
        eos_scores, beams = eos_scores.sort(dim=1, descending=True)
        pad = width - beam_size
        beams = torch.cat([beams, beams[:, :pad]], dim=1)
        eos_scores = torch.cat([eos_scores, torch.full_like(eos_scores[:, :pad], float("-inf"))], dim=1)
        return eos_scores, torch.full_like(beams, self.eos), beams
