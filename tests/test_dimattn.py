"""Diminishing attention: equations, properties, incremental == full decoding, models."""

import logging
import math

import pytest
import torch
from conftest import TINY_MODEL
from fairseq.modules import MultiheadAttention
from helpers import build_task_and_model
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_knowgen.models.dimattn import parse_layers
from fairseq_knowgen.modules.cross_attention import replace_cross_attention
from fairseq_knowgen.modules.diminishing_attention import (
    DiminishingMultiheadAttention,
    check_slower_diminishing,
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


def test_identity_weights_are_the_probabilities_exactly():
    """g = x: the increment is a itself, not (c^{t-1} + a) - c^{t-1} (which rounds in float32)."""
    probs = random_probs(3, 9, 6, 3).float()
    w, _, _ = diminishing_weights(probs, parse_concave("identity"))
    assert torch.equal(w, probs)


def float64_increment(spec, before, a):
    """g(before + a) - g(before) as a plain float64 difference (accurate to ~1e-8 relative here)."""
    g = {
        "log": math.log1p,
        "sqrt": lambda x: math.sqrt(x + 1.0),
        "pow:0.5": lambda x: (x + 1.0) ** 0.5,
        "pow:0.25": lambda x: (x + 1.0) ** 0.25,
    }[spec]
    return g(before + a) - g(before)


@pytest.mark.parametrize("dim_type", ["dim", "dydim"])
@pytest.mark.parametrize("g_spec", G_SPECS)
def test_float32_precision_at_large_coverage(g_spec, dim_type):
    """A source position covered 60 times over that then gets an attention of 1e-5.

    The weight is about 1e-5 / 61 (log); float32's g(c^t) - g(c^{t-1}) of two numbers near
    log(61) ~ 4.1 (ulp 4.8e-7) is 0 or a multiple of the ulp, i.e. all noise; the increment
    log1p(a / (1 + c^{t-1})) keeps float32's relative precision. Training (all steps at
    once) and incremental decoding (one step at a time) must both match the float64 values.
    """
    big, small, n_big, n_small = 0.75, 1e-5, 80, 6  # 80 x 0.75 = 60 exactly in float32
    probs = torch.tensor([big] * n_big + [small] * n_small, dtype=torch.float32).view(1, -1, 1)
    a = [float(x) for x in probs.view(-1)]  # the float32 values, exactly, in float64
    g, g2 = parse_concave(g_spec), parse_concave("identity") if dim_type == "dydim" else None
    expected, before = [], 0.0
    for t, a_t in enumerate(a):
        inc = float64_increment(g_spec, before, a_t)
        if g2 is not None:  # P^t = max of the earlier attentions (Eq. 5); g2 = x: increment a
            p = max(a[:t], default=0.0)
            inc = p * inc + (1 - p) * a_t
        expected.append(inc)
        before += a_t
    expected = torch.tensor(expected, dtype=torch.float64)

    full, _, _ = diminishing_weights(probs, g, g2)
    cov = mx = None
    steps = []
    for t in range(probs.size(1)):
        w, cov, mx = diminishing_weights(probs[:, t : t + 1], g, g2, cov, mx)
        steps.append(w)
    stepwise = torch.cat(steps, 1)
    for got in (full, stepwise):
        torch.testing.assert_close(got.view(-1).double(), expected, rtol=1e-4, atol=0)

    # the float32 difference the module used to compute fails this tolerance on the small steps
    c = probs.view(-1).cumsum(0)
    old = g(c) - g(c - probs.view(-1))
    if g2 is None:
        rel_err = ((old.double() - expected) / expected).abs()[n_big:]
        assert rel_err.max() > 0.1


@pytest.mark.parametrize(
    "g1, g2",
    [
        ("log", "identity"),
        ("sqrt", "identity"),
        ("pow:0.25", "identity"),
        ("identity", "identity"),
        ("log", "log"),
        ("pow:0.25", "pow:0.5"),
        ("pow:0.25", "sqrt"),
        ("sqrt", "pow:0.5"),  # the same function written two ways
        ("pow:0.1", "log"),  # 0.1 (1+c)^0.1 <= 1 up to c = 1e10 - 1, beyond any decoder length
    ],
)
def test_slower_diminishing_g2_accepted(g1, g2):
    check_slower_diminishing(parse_concave(g1), parse_concave(g2), 1024)


@pytest.mark.parametrize(
    "g1, g2, where",
    [
        ("identity", "log", "c > 0: 1/(1+c) < 1"),
        ("identity", "sqrt", "everywhere: 0.5/sqrt(1+c) < 1"),
        ("log", "sqrt", "c < 3: 0.5/sqrt(1+c) < 1/(1+c)"),
        ("sqrt", "log", "c > 3"),
        ("pow:0.5", "pow:0.25", "everywhere: 0.25 (1+c)^-0.75 < 0.5 (1+c)^-0.5"),
        ("log", "pow:0.9", "c < 0.124: 0.9 (1+c)^-0.1 < 1/(1+c)"),
        ("pow:0.9", "log", "c > 0.124"),
    ],
)
def test_faster_diminishing_g2_refused(g1, g2, where):
    with pytest.raises(ValueError, match=rf"G2 {g2} must diminish more slowly than G1 {g1}"):
        check_slower_diminishing(parse_concave(g1), parse_concave(g2), 1024, names=("G1", "G2"))


def test_slower_diminishing_checked_up_to_max_coverage():
    """sqrt vs log: 0.5/sqrt(1+c) >= 1/(1+c) iff c >= 3, so g1 = sqrt, g2 = log holds below 3 only."""
    sqrt, log = parse_concave("sqrt"), parse_concave("log")
    check_slower_diminishing(sqrt, log, 2.9)
    with pytest.raises(ValueError, match=r"at c = 3\.\d+"):
        check_slower_diminishing(sqrt, log, 3.1)


def test_model_refuses_faster_diminishing_g2(tiny_bin):
    with pytest.raises(ValueError, match="--dimattn-g2 log must diminish more slowly than --dimattn-g identity"):
        build_task_and_model(
            tiny_bin,
            "transformer_dimattn",
            *TINY_MODEL,
            "--dimattn-type",
            "dydim",
            "--dimattn-g",
            "identity",
            "--dimattn-g2",
            "log",
        )


@pytest.mark.parametrize(
    "flags, warns",
    [
        (["--dimattn-g2", "sqrt"], True),
        (["--dimattn-type", "dim", "--dimattn-g2", "identity"], True),
        ([], False),
        (["--dimattn-type", "dydim", "--dimattn-g", "pow:0.25", "--dimattn-g2", "sqrt"], False),
    ],
)
def test_warns_about_unused_g2(tiny_bin, caplog, flags, warns):
    with caplog.at_level(logging.WARNING, logger="fairseq_knowgen.models.dimattn"):
        build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL, *flags)
    warned = [r for r in caplog.records if "--dimattn-g2" in r.getMessage() and r.levelno == logging.WARNING]
    assert bool(warned) == warns


def test_quant_noise_in_replaced_attention(tiny_bin):
    """--quant-noise-pq reaches the diminishing attention's projections as in fairseq's own
    encoder attention: after the same seed, a training forward drops the same weight blocks."""
    noise = ["--quant-noise-pq", "0.25", "--quant-noise-pq-block-size", "8"]
    _, ours, _ = build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL, *noise)
    _, ref, _ = build_task_and_model(tiny_bin, "transformer", *TINY_MODEL, *noise)
    att, ref_att = ours.decoder.layers[-1].encoder_attn, ref.decoder.layers[-1].encoder_attn
    assert isinstance(att, DiminishingMultiheadAttention)
    att.load_state_dict(ref_att.state_dict())
    att.train(), ref_att.train()
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        proj, ref_proj = getattr(att, name), getattr(ref_att, name)
        before = proj.weight.detach().clone()
        x = torch.randn(3, proj.in_features)
        for m in (proj, ref_proj):
            torch.manual_seed(7)
            m(x)
        torch.testing.assert_close(proj.weight, ref_proj.weight, atol=0, rtol=0)
        # fairseq's noise: whole blocks of 8 input weights zeroed, the rest scaled by 1 / (1 - p)
        kept = proj.weight.detach().view(-1, 8).ne(0).any(-1, keepdim=True).expand(-1, 8).reshape(before.shape)
        assert 0 < kept.sum() < kept.numel()
        torch.testing.assert_close(proj.weight[kept], before[kept] / 0.75)


def test_xformers_config_passed_to_replacement(tiny_bin):
    """The encoder's xFormers config reaches the replacement as fairseq's build_encoder_attention
    passes it (xformers is not installed here, so the build is recorded, not run)."""
    _, model, _ = build_task_and_model(tiny_bin, "transformer", *TINY_MODEL, "--quant-noise-pq", "0.25")
    cfg_str = '{"name": "scaled_dot_product"}'
    model.decoder.cfg.encoder.xformers_att_config = cfg_str
    seen = {}

    def build(*args, **kwargs):
        seen.update(kwargs)
        return torch.nn.Identity()

    replace_cross_attention(model.decoder, [0], build)
    assert seen["xformers_att_config"] == cfg_str
    assert (seen["q_noise"], seen["qn_block_size"]) == (0.25, 8)


def test_parse_layers_names_the_flag():
    with pytest.raises(ValueError, match="^--eki-position-layers: layer 3 out of range for 2 layers"):
        parse_layers("3", 2, flag="--eki-position-layers")
    with pytest.raises(ValueError, match="^--eki-position-layers: expected 'all' or integers, got 'x'"):
        parse_layers("x", 2, flag="--eki-position-layers")
    with pytest.raises(ValueError, match="^--dimattn-layers: layer -3 out of range"):
        parse_layers("-3", 2)
    assert parse_layers("-1,0", 3) == [0, 2]


@pytest.mark.parametrize("dim_type", ["dim", "dydim"])
def test_training_keeps_one_float32_weights_tensor_with_the_same_gradients(dim_type):
    """Memory (issue 30): a training forward keeps one float32 (B*H) x T x S tensor for backward,
    the weights after dropout (the chain before them is recomputed in backward), and its output,
    returned weights and gradients equal the chain written out here with every tensor kept
    (the same dropout mask: the recomputation restores the RNG state)."""
    tgt_len, bsz, src_len, heads, dim = 5, 3, 7, 4, 16
    torch.manual_seed(0)
    attn = DiminishingMultiheadAttention(dim, heads, dim_type=dim_type, dropout=0.3).train()
    query, kv = torch.randn(tgt_len, bsz, dim), torch.randn(src_len, bsz, dim)
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    pad[1, :2] = True
    big = []

    def pack(t):
        if t.dtype == torch.float32 and t.numel() == bsz * heads * tgt_len * src_len:
            big.append(t.shape)
        return t

    def run(by_hand):
        attn.zero_grad()
        q, k = query.clone().requires_grad_(), kv.clone().requires_grad_()
        torch.manual_seed(1)
        if by_hand:
            logits, v = attn.masked_logits_and_values(q, k, k, pad, None)
            w = diminishing_weights(torch.softmax(logits.float(), -1), attn.g, attn.g2)[0]
            mixed = torch.bmm(torch.nn.functional.dropout(w, 0.3, training=True), v)
            out = attn.out_proj(mixed.transpose(0, 1).reshape(tgt_len, bsz, dim))
            w = w.view(bsz, heads, tgt_len, src_len).mean(1)
        else:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out, w = attn(q, k, k, key_padding_mask=pad)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach(), w.detach(), [q.grad, k.grad] + [p.grad.clone() for p in attn.parameters()]

    out, w, grads = run(False)
    assert len(big) == 1
    ref_out, ref_w, ref_grads = run(True)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-6)
    # the same operations in the same order (the recomputation replays the chain): on CPU the gradients agree to
    # the last bit; each sums over at most 21 positions (5 x 3 queries, 7 x 3 keys) of terms up to ~3, so float32
    # kernels that sum in another order would differ by ~sqrt(21) x 6e-8 x 3 = 8e-7: atol 1e-6
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
