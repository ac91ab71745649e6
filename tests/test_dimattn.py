"""Diminishing attention: equations, properties, incremental == full decoding, models."""

import math

import pytest
import torch
from fairseq.modules import MultiheadAttention
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_knowgen.modules.diminishing_attention import (
    DiminishingMultiheadAttention,
    diminishing_weights,
    parse_concave,
)

G_SPECS = ["log", "sqrt", "pow:0.5", "pow:0.25"]


def random_probs(n, t, s, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, t, s, generator=gen, dtype=torch.float64) * 2, dim=-1)


def test_hand_computed_dimattn():
    # one source position with a = 0.5 then 0.5, g = log(x+1):
    # step 0: log(1.5) - log(1);  step 1: log(2) - log(1.5)
    probs = torch.tensor([[[0.5], [0.5]]], dtype=torch.float64)
    w, cov, _ = diminishing_weights(probs, parse_concave("log"))
    assert w[0, :, 0].tolist() == pytest.approx([math.log(1.5), math.log(2) - math.log(1.5)])
    assert cov.item() == pytest.approx(1.0)


def test_hand_computed_dydimattn():
    # a = (0.6, 0.3); P^0 = 0, P^1 = 0.6; g1 = log, g2 = identity
    probs = torch.tensor([[[0.6], [0.3]]], dtype=torch.float64)
    w, _, run_max = diminishing_weights(probs, parse_concave("log"), parse_concave("identity"))
    step0 = 0.6  # (1 - 0) * (0.6 - 0)
    step1 = 0.6 * (math.log(1.9) - math.log(1.6)) + 0.4 * 0.3
    assert w[0, :, 0].tolist() == pytest.approx([step0, step1])
    assert run_max.item() == pytest.approx(0.6)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 7), st.sampled_from(G_SPECS), st.integers(0, 10_000))
def test_effective_coverage_telescopes(n, t, s, g_spec, seed):
    """Sum of DimAttn over all steps = g(c^T) - g(0) for every source position (Eq. 4)."""
    probs = random_probs(n, t, s, seed)
    g = parse_concave(g_spec)
    w, cov, _ = diminishing_weights(probs, g)
    expected = g(probs.sum(1)) - g(torch.zeros(n, s, dtype=probs.dtype))
    torch.testing.assert_close(w.sum(1), expected)
    torch.testing.assert_close(cov.squeeze(1), probs.sum(1))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(G_SPECS), st.floats(0.01, 1.0), st.floats(0.0, 5.0), st.floats(0.01, 5.0))
def test_diminishing_returns(g_spec, a, cov_small, extra):
    """The same raw attention buys less weight when the coverage before it is larger."""
    g = parse_concave(g_spec)
    probs = torch.tensor([[[a]]], dtype=torch.float64)
    low, _, _ = diminishing_weights(probs, g, prev_coverage=torch.tensor([[[cov_small]]], dtype=torch.float64))
    high, _, _ = diminishing_weights(probs, g, prev_coverage=torch.tensor([[[cov_small + extra]]], dtype=torch.float64))
    assert high.item() < low.item()


def test_identity_g_is_standard_attention():
    probs = random_probs(3, 5, 6, 0)
    w, _, _ = diminishing_weights(probs, parse_concave("identity"))
    torch.testing.assert_close(w, probs)


def test_normalize_flag_sums_to_one():
    w, _, _ = diminishing_weights(random_probs(2, 4, 5, 1), parse_concave("sqrt"), normalize=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, dtype=torch.float64))


@pytest.mark.parametrize("dim_type", ["dim", "dydim"])
def test_chunked_equals_full(dim_type):
    """Carrying (coverage, max) across calls gives the full-sequence weights."""
    probs = random_probs(2, 7, 5, 2)
    g, g2 = parse_concave("log"), parse_concave("identity") if dim_type == "dydim" else None
    full, _, _ = diminishing_weights(probs, g, g2)
    cov = mx = None
    steps = []
    for t in range(7):
        w, cov, mx = diminishing_weights(probs[:, t : t + 1], g, g2, cov, mx)
        steps.append(w)
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_identity_module_matches_fairseq_attention():
    """With g(x) = x the module computes fairseq's MultiheadAttention exactly."""
    torch.manual_seed(0)
    ref = MultiheadAttention(16, 4, encoder_decoder_attention=True)
    dim = DiminishingMultiheadAttention(16, 4, g="identity")
    dim.load_state_dict(ref.state_dict())
    q, kv = torch.randn(5, 3, 16), torch.randn(7, 3, 16)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, -2:] = True
    out_ref, w_ref = ref(q, kv, kv, key_padding_mask=pad, static_kv=True)
    out_dim, w_dim = dim(q, kv, kv, key_padding_mask=pad, static_kv=True)
    torch.testing.assert_close(out_dim, out_ref)
    torch.testing.assert_close(w_dim, w_ref)


@pytest.mark.parametrize("dim_type", ["dim", "dydim"])
def test_module_incremental_with_beam_reorder(dim_type):
    """Step-by-step decoding with a reorder equals full decoding of the reordered prefix."""
    torch.manual_seed(1)
    att = DiminishingMultiheadAttention(8, 2, dim_type=dim_type, g="sqrt", g2="identity").eval()
    bsz, T, S = 4, 6, 5
    # four beams of one sentence: same encoder states, different decoder queries
    q, kv = torch.randn(T, bsz, 8), torch.randn(S, 1, 8).expand(S, bsz, 8)
    # hypotheses 0..3 follow a path through reorders: after step 2 rows become [1, 1, 3, 0]
    order = torch.tensor([1, 1, 3, 0])
    state = {}
    outs = []
    for t in range(T):
        if t == 3:
            att.reorder_incremental_state(state, order)
        o, _ = att(q[t : t + 1], kv, kv, incremental_state=state, static_kv=True)
        outs.append(o)
    # reference: full decoding of the query sequence each final hypothesis actually saw
    qq = torch.cat([q[:3, order], q[3:]], 0)
    full_early, _ = att(q[:3], kv, kv, static_kv=True)
    full, _ = att(qq, kv, kv, static_kv=True)
    torch.testing.assert_close(torch.cat(outs[:3], 0), full_early, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(outs[3:], 0), full[3:], atol=1e-5, rtol=1e-5)


def test_bad_g_spec():
    with pytest.raises(ValueError, match="0 < p < 1"):
        parse_concave("pow:1.5")
    with pytest.raises(ValueError, match="unknown concave"):
        parse_concave("exp")
