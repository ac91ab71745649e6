"""LengthSafeConstrainedBeamSearch, one search step at a time on hand-made scores, against fairseq's
own LexicallyConstrainedBeamSearch run on the same inputs.

The decoding-level test (an impossible constraint under ``--at-most-once`` ends at the limit) is in
test_constraints.py; these pin the two cases that still stopped fairseq's generator on WebNLG dev:
a beam made only of -inf hypotheses at the limit, and blocked constraint tokens ranked into the beam.
"""

import math

import torch
from fairseq.data import Dictionary
from fairseq.search import LexicallyConstrainedBeamSearch
from fairseq.token_generation_constraints import pack_constraints

from fairseq_knowgen.modules.length_safe_search import NO_SCORE, UNMET_PENALTY, LengthSafeConstrainedBeamSearch

NEG = -math.inf
WORDS = "a b c d e f".split()


def _dictionary():
    d = Dictionary()
    for w in WORDS:
        d.add_symbol(w)
    return d


def _init(search, d, constraint_words, beam, met=()):
    """Constraints per input; inputs listed in ``met`` have already generated theirs."""
    packed = pack_constraints([[torch.tensor([d.index(w)]) for w in words] for words in constraint_words])
    search.init_constraints(packed, beam)
    for i in met:
        search.constraint_states[i] = [s.advance(d.index(constraint_words[i][0])) for s in search.constraint_states[i]]
    return search


def _state(s):
    return s.bank, s.finished, sorted(s.next_tokens())


def test_at_the_limit_stuck_inputs_end_each_hypothesis_with_eos_and_the_others_keep_fairseqs_choice():
    """Input 0 never met its constraint and every hypothesis already carries -inf (it took a blocked
    token): at the limit EOS is -inf everywhere, and fairseq's top-k over those ties returned
    arbitrary tokens, so nothing was finalized and the generator failed ``200 < 200``. Input 1 is
    stuck with finite scores, input 2 met its constraint: it must get exactly fairseq's candidates."""
    beam, step = 3, 4
    d = _dictionary()
    words, met = [["a"], ["b"], ["c"]], [2]
    search = _init(LengthSafeConstrainedBeamSearch(d, "unordered"), d, words, beam, met)
    lprobs = torch.full((3, beam, len(d)), NEG)
    lprobs[:, :, d.eos()] = torch.tensor([[-0.1, -0.2, -0.3], [-0.5, -0.4, -0.6], [-0.7, -0.1, -0.2]])
    scores = torch.full((3, beam, step), -1.0)
    scores[0] = NEG  # input 0: every hypothesis -inf
    scores[1, :, step - 1] = torch.tensor([-3.0, -1.0, -2.0])  # input 1: finite, constraint unmet
    scores[2, :, step - 1] = torch.tensor([-2.0, -4.0, -1.0])  # input 2: constraint met
    reference = _init(LexicallyConstrainedBeamSearch(d, "unordered"), d, [words[2]], beam, [0])
    expected = reference.step(step, lprobs[2:].clone(), scores[2:].clone())

    cand_scores, cand_indices, cand_beams = search.step(step, lprobs, scores)
    top = slice(0, beam)
    assert cand_indices[:2, top].eq(d.eos()).all()
    assert cand_scores[0, top].eq(UNMET_PENALTY + NO_SCORE).all()
    assert sorted(cand_beams[0, top].tolist()) == list(range(beam))
    # input 1 ends best first: hypothesis 1 (-1 - 0.4), 2 (-2 - 0.6), 0 (-3 - 0.5), each below any met one
    assert cand_beams[1, top].tolist() == [1, 2, 0]
    assert torch.allclose(cand_scores[1, top], UNMET_PENALTY + torch.tensor([-1.4, -2.6, -3.5]), rtol=0, atol=1e-2)
    for ours, theirs in zip((cand_scores, cand_indices, cand_beams), expected):
        assert torch.equal(ours[2], theirs[0])
    assert search.unmet_at_limit == 2 * beam


def test_blocked_constraint_tokens_go_behind_finite_candidates_with_their_states():
    """fairseq ranks a candidate that advances a constraint (a higher bank) before any other, even
    when a decoding rule gave that token -inf: the beam filled with -inf hypotheses that break the
    rule. Input 1's constraint 'a' is blocked in every hypothesis, input 0's 'b' is not: each input's
    candidates must be fairseq's with the -inf ones moved last (order otherwise kept), and each
    constraint state must move with its candidate."""
    beam, step = 2, 2
    d = _dictionary()
    words = [["b"], ["a"]]
    torch.manual_seed(0)
    lprobs = torch.log_softmax(torch.randn(2, beam, len(d)), dim=-1)
    lprobs[1, :, d.index("a")] = NEG
    lprobs[:, :, d.pad()] = NEG
    scores = torch.randn(2, beam, step)
    reference = _init(LexicallyConstrainedBeamSearch(d, "unordered"), d, words, beam)
    expected = reference.step(step, lprobs.clone(), scores.clone())
    search = _init(LengthSafeConstrainedBeamSearch(d, "unordered"), d, words, beam)
    got = search.step(step, lprobs.clone(), scores.clone())

    assert torch.isinf(expected[0][1, :beam]).any(), "fairseq put no -inf candidate in the beam: no test"
    for i in range(2):
        inf = torch.isinf(expected[0][i]).tolist()
        order = [p for p, x in enumerate(inf) if not x] + [p for p, x in enumerate(inf) if x]
        for ours, theirs in zip(got, expected):
            assert ours[i].tolist() == theirs[i][order].tolist()
        ours_states, their_states = search.constraint_states[i], reference.constraint_states[i]
        assert [_state(s) for s in ours_states] == [_state(their_states[p]) for p in order] + [
            _state(s) for s in their_states[len(order) :]
        ]
    assert torch.isfinite(got[0][1, :beam]).all()
