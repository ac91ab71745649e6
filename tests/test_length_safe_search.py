"""LengthSafeConstrainedBeamSearch, one search step at a time on hand-made scores.

The decoding-level tests (an impossible constraint under ``--at-most-once`` ends at the limit) are in
test_constraints.py; these pin the two cases that still stopped fairseq's generator on WebNLG dev:
a beam made only of -inf hypotheses at the limit, and blocked constraint tokens ranked into the beam.
"""

import math

import torch
from fairseq.data import Dictionary
from fairseq.token_generation_constraints import pack_constraints

from fairseq_knowgen.modules.length_safe_search import NO_SCORE, LengthSafeConstrainedBeamSearch

NEG = -math.inf


def _search(constraint_words, beam):
    d = Dictionary()
    for w in "a b c d e f".split():
        d.add_symbol(w)
    search = LengthSafeConstrainedBeamSearch(d, "unordered")
    packed = pack_constraints([[torch.tensor([d.index(w)]) for w in words] for words in constraint_words])
    search.init_constraints(packed, beam)
    return d, search


def test_at_the_limit_an_input_whose_hypotheses_all_score_minus_inf_ends_each_with_eos():
    """Input 0 never met its constraint and every hypothesis already carries -inf (it took a blocked
    token): at the limit EOS is -inf everywhere, and fairseq's top-k over those ties returned
    arbitrary tokens, so nothing was finalized and the generator failed ``200 < 200``."""
    beam, step = 3, 4
    d, search = _search([["a"], ["b"]], beam)
    vocab = len(d)
    lprobs = torch.full((2, beam, vocab), NEG)
    lprobs[:, :, d.eos()] = torch.tensor([[-0.1, -0.2, -0.3], [-0.5, -0.4, -0.6]])
    scores = torch.full((2, beam, step), -1.0)
    scores[0] = NEG  # input 0: every hypothesis -inf
    scores[1, :, step - 1] = torch.tensor([-3.0, -1.0, -2.0])  # input 1: finite, constraint also unmet
    cand_scores, cand_indices, cand_beams = search.step(step, lprobs, scores)
    top = slice(0, beam)
    assert cand_indices[:, top].eq(d.eos()).all()
    assert torch.isfinite(cand_scores[:, top]).all() and cand_scores[0, top].eq(NO_SCORE).all()
    assert sorted(cand_beams[0, top].tolist()) == list(range(beam))
    # input 1 ends best first: hypothesis 1 (-1 - 0.4), 2 (-2 - 0.6), 0 (-3 - 0.5)
    assert cand_beams[1, top].tolist() == [1, 2, 0]
    assert torch.allclose(cand_scores[1, top], torch.tensor([-1.4, -2.6, -3.5]))
    assert search.unmet_at_limit == 2 * beam


def test_blocked_constraint_tokens_do_not_push_finite_candidates_out_of_the_beam():
    """fairseq ranks a hypothesis that advances a constraint (a higher bank) before any other, even
    when a decoding rule gave that token -inf: the beam filled with -inf hypotheses that break the
    rule. Here 'a' is the constraint and blocked in every hypothesis: no -inf candidate may come
    before a finite one, and each candidate's constraint state must still be its own."""
    beam, step = 2, 2
    d, search = _search([["a"]], beam)
    vocab = len(d)
    lprobs = torch.log_softmax(torch.arange(vocab, dtype=torch.float).repeat(1, beam, 1), dim=-1)
    lprobs[:, :, d.index("a")] = NEG
    lprobs[:, :, d.pad()] = NEG
    scores = torch.zeros(1, beam, step)
    cand_scores, cand_indices, cand_beams = search.step(step, lprobs, scores)
    finite = torch.isfinite(cand_scores[0])
    assert finite[:beam].all(), (cand_scores, cand_indices)
    assert not finite.sort(descending=True).values.ne(finite).any()  # finite ones first, -inf after
    assert cand_indices[0, ~finite].eq(d.index("a")).any()  # the blocked token is still offered, last
    for pos in range(cand_scores.size(1)):  # each position's state: its own token's constraint progress
        assert search.constraint_states[0][pos].finished == (cand_indices[0, pos].item() == d.index("a"))
