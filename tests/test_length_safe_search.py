"""LengthSafeConstrainedBeamSearch, one search step at a time on hand-made scores, against fairseq's
own LexicallyConstrainedBeamSearch run on the same inputs.

The decoding-level test (an impossible constraint under ``--at-most-once`` ends at the limit) is in
test_constraints.py; these pin the two cases that still stopped fairseq's generator on WebNLG dev:
a beam made only of -inf hypotheses at the limit, and blocked constraint tokens ranked into the beam.
"""

import collections
import contextlib
import math
import os
import sys

import pytest
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
    # the generator keeps candidates by their position in our order: each keeps its own constraint state
    width = got[0].size(1)
    search.update_constraints(torch.arange(width).expand(2, width))
    for i in range(2):
        inf = torch.isinf(expected[0][i]).tolist()
        order = [p for p, x in enumerate(inf) if not x] + [p for p, x in enumerate(inf) if x]
        their_states = reference.constraint_states[i]
        assert [_state(s) for s in search.constraint_states[i]] == [_state(their_states[p]) for p in order]
    assert torch.isfinite(got[0][1, :beam]).all()


# ---------------------------------------------------------------- whole decodes with fairseq's generator

ENTITIES = [f"<ent-{i}>" for i in range(4)]


def _tiny_translation_model(d):
    """A random 1+1-layer, 8-wide fairseq transformer over dictionary ``d`` (eval mode)."""
    from fairseq import options
    from fairseq.models.transformer import TransformerModel

    class Task:
        source_dictionary = target_dictionary = d

    size = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "8", "--decoder-embed-dim", "8"]
    size += ["--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16"]
    size += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
    args = options.parse_args_and_arch(options.get_training_parser(), ["unused", "--arch", "transformer", *size])
    torch.manual_seed(0)
    return TransformerModel.build_model(args, Task()).eval()


def _decode(search, d, constraint_words, beam=3, max_len=6):
    """fairseq's SequenceGenerator with ``--at-most-once '<ent-\\d+>'`` and the given search, on 3
    random sources; returns its hypotheses as words."""
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_knowgen.modules.at_most_once import AtMostOnceBlock, token_ids_matching

    model = _tiny_translation_model(d)
    gen = SequenceGenerator([model], d, beam_size=beam, max_len_a=0, max_len_b=max_len, search_strategy=search)
    gen.repeat_ngram_blocker = AtMostOnceBlock(token_ids_matching(d, r"<ent-\d+>"), gen.repeat_ngram_blocker)
    torch.manual_seed(1)
    src = torch.randint(d.nspecial, len(d), (len(constraint_words), 5))
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((src.size(0),), 5)}}
    constraints = pack_constraints(
        [[torch.tensor([d.index(w) for w in c.split()]) for c in words] for words in constraint_words]
    )
    with torch.no_grad():
        out = gen.generate([model], sample, constraints=constraints)
    return [[d.string(h["tokens"]).split() for h in hyps] for hyps in out]


# input 0 must name <ent-0> twice, input 1 holds a phrase naming <ent-1> twice: under --at-most-once neither can
# be met (fairseq's banks still force the blocked token, at -inf); input 2's constraint can
UNMEETABLE = [["<ent-0>", "<ent-0>"], ["<ent-1> <ent-1>"], ["c"]]


def _entity_dictionary():
    d = _dictionary()
    for e in ENTITIES:
        d.add_symbol(e)
    return d


def test_an_unmeetable_constraint_under_at_most_once_ends_at_the_limit():
    """The WebNLG crash, on a tiny random model: fairseq's own constrained search stops the whole
    run with ``AssertionError: 6 < 6``; the length-safe search gives every input its hypotheses,
    keeps the rule, and meets the constraint that can be met."""
    d = _entity_dictionary()
    with pytest.raises(AssertionError, match=r"^6 < 6$"):
        _decode(LexicallyConstrainedBeamSearch(d, "unordered"), d, UNMEETABLE)
    search = LengthSafeConstrainedBeamSearch(d, "unordered")
    hyps = _decode(search, d, UNMEETABLE)
    assert [len(h) for h in hyps] == [3, 3, 3]
    assert all(h.count(e) <= 1 for hs in hyps for h in hs for e in ENTITIES)
    assert all("c" in h for h in hyps[2])
    assert int(search.unmet_at_limit) == 2 * 3


SYNC_METHODS = ["item", "cpu", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__"]


@contextlib.contextmanager
def host_syncs():
    """Count calls that copy a tensor's value to the host (``.item()``, ``.cpu()``, ``.tolist()``,
    ``bool(t)``, ``torch.equal``, ``nonzero``...), by the file that made them: the CPU emulation of
    ``torch.cuda.set_sync_debug_mode``."""
    calls = collections.Counter()

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[os.path.basename(sys._getframe(1).f_code.co_filename), name] += 1
            return fn(*args, **kwargs)

        return wrapper

    own = {n for n in SYNC_METHODS if n in vars(torch.Tensor)}
    saved = {n: getattr(torch.Tensor, n) for n in SYNC_METHODS}
    saved_fns = {n: getattr(torch, n) for n in ("equal", "nonzero", "masked_select")}
    try:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, counted(n, fn))
        for n, fn in saved_fns.items():
            setattr(torch, n, counted(n, fn))
        yield calls
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn) if n in own else delattr(torch.Tensor, n)
        for n, fn in saved_fns.items():
            setattr(torch, n, fn)


def test_no_host_sync_in_the_search_or_the_rule():
    """A whole decode with --at-most-once and constraints, stuck inputs at the limit included: no
    host sync comes from at_most_once.py or length_safe_search.py (fairseq's generator and its
    constrained search, with their host-side constraint states, make plenty: the counter sees them)."""
    d = _entity_dictionary()
    with host_syncs() as calls:
        hyps = _decode(LengthSafeConstrainedBeamSearch(d, "unordered"), d, UNMEETABLE)
    assert [len(h) for h in hyps] == [3, 3, 3]
    ours = {k: v for k, v in calls.items() if k[0] in ("at_most_once.py", "length_safe_search.py")}
    assert not ours, ours
    assert calls["search.py", "__bool__"] > 0 and calls["sequence_generator.py", "item"] > 0
