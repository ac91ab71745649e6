"""DimAttn and DyDimAttn as Han, Lin and Joty write them ("Resurrecting Submodularity for Neural Text Generation",
Eq. 3-5), computed here in plain PyTorch from the paper, against the module with random non-zero weights; the default g2
(2 sqrt(x+1)) diminishes more slowly than g1 = log(x+1) at every coverage; a checkpoint keeps the g2 it was
trained with."""

import math

import pytest
import torch
from checkpoint_helpers import save_checkpoint
from conftest import TINY_MODEL
from helpers import build_task_and_model, first_batch

from fairseq_knowgen.models.dimattn import DYDIM_G2_DEFAULT
from fairseq_knowgen.modules.diminishing_attention import (
    DiminishingMultiheadAttention,
    check_slower_diminishing,
    parse_concave,
)


def paper_dimattn(attn, query, kv, pad, g, normalize=False):
    """Multi-head cross-attention whose context uses DimAttn weights, written from the paper, one head, step and
    source position at a time (float64):

    a_i^t = softmax_i(q_t . k_i / sqrt(d)) per head (padding excluded);
    c_i^t = sum_{t' <= t} a_i^{t'} (coverage up to and including step t, footnote 1);
    F(A_i^t) = g(c_i^t) + b, b = -g(0)                                          (Eq. 3);
    DimAttn_i^t = F(A_i^t) - F(A_i^{t-1})                                       (Eq. 4; F(A_i^{-1}) = g(0) + b = 0);
    with ``normalize`` the weights divided by their sum over i (the package's ``--dimattn-normalize``);
    context_t = sum_i DimAttn_i^t v_i, heads concatenated, then the output projection.

    Returns the output ``T x B x C`` and the weights ``B x H x T x S``."""
    tgt_len, bsz, dim = query.shape
    src_len, heads = kv.size(0), attn.num_heads
    d = dim // heads
    b = -g(0.0)

    def proj(lin, x):
        return x @ lin.weight.T + lin.bias

    q = proj(attn.q_proj, query) / math.sqrt(d)
    k, v = proj(attn.k_proj, kv), proj(attn.v_proj, kv)
    out = torch.zeros(tgt_len, bsz, dim, dtype=query.dtype)
    weights = torch.zeros(bsz, heads, tgt_len, src_len, dtype=query.dtype)
    for n in range(bsz):
        for h in range(heads):
            sl = slice(h * d, (h + 1) * d)
            submodular = [0.0] * src_len  # F(A_i^{t-1})
            coverage = [0.0] * src_len  # c_i^{t-1}
            for t in range(tgt_len):
                logits = torch.stack([q[t, n, sl] @ k[i, n, sl] for i in range(src_len)])
                a = torch.softmax(logits.masked_fill(pad[n], -math.inf), -1)
                w = []
                for i in range(src_len):
                    coverage[i] += a[i].item()
                    now = g(coverage[i]) + b
                    w.append(now - submodular[i])
                    submodular[i] = now
                if normalize:
                    total = sum(w)
                    w = [x / total for x in w]
                context = torch.zeros(d, dtype=query.dtype)
                for i in range(src_len):
                    weights[n, h, t, i] = w[i]
                    context = context + w[i] * v[i, n, sl]
                out[t, n, sl] = context
    out = out @ attn.out_proj.weight.T + attn.out_proj.bias
    return out, weights


def random_module(dim_type, **kwargs):
    """A 12-wide, 3-head module with random non-zero projections and biases, and inputs over 8 steps and a padded
    source (the second sentence's last two positions), all float64, drawn from a seeded generator."""
    gen = torch.Generator().manual_seed(3)
    attn = DiminishingMultiheadAttention(12, 3, dim_type=dim_type, **kwargs).double().eval()
    with torch.no_grad():
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=torch.float64) * 0.6)
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen, dtype=torch.float64) * 0.5)
    tgt_len, bsz, src_len = 8, 2, 5
    query = torch.randn(tgt_len, bsz, 12, generator=gen, dtype=torch.float64)
    kv = torch.randn(src_len, bsz, 12, generator=gen, dtype=torch.float64)
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    pad[1, -2:] = True
    return attn, query, kv, pad


@pytest.mark.parametrize(
    "g_spec, g",
    [
        (None, lambda x: math.log(1.0 + x)),  # the default, log(x+1)
        ("sqrt", lambda x: math.sqrt(1.0 + x)),
        ("pow:0.3", lambda x: (1.0 + x) ** 0.3),
        ("2*sqrt", lambda x: 2.0 * math.sqrt(1.0 + x)),
    ],
)
@pytest.mark.parametrize("normalize", [False, True])
def test_dimattn_module_equals_the_paper_with_random_weights(g_spec, g, normalize):
    """DimAttn (``dim``, Eq. 3-4) of the module against the paper's equations over 8 steps, 3 heads and a padded
    source, with random projections and biases: output and weights, for the default g and three others, and with
    the weights renormalized."""
    kwargs = {} if g_spec is None else {"g": g_spec}
    attn, query, kv, pad = random_module("dim", normalize=normalize, **kwargs)
    assert attn.g.spec == (g_spec or "log") and attn.g2 is None
    with torch.no_grad():
        got, got_w = attn(query, kv, kv, key_padding_mask=pad, static_kv=True, need_head_weights=True)
    expected, expected_w = paper_dimattn(attn, query, kv, pad, g, normalize)
    assert (expected_w[1, :, :, -2:] == 0).all()  # padding gets nothing
    if not normalize:  # the weights are not a plain softmax: they sum to less than 1 after the first step
        assert (expected_w[..., 1:, :].sum(-1) < 0.99).all()
    # (the module takes the softmax in float32)
    torch.testing.assert_close(got_w.transpose(0, 1), expected_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def paper_dydimattn(attn, query, kv, pad, g1, g2):
    """Multi-head cross-attention whose context uses DyDimAttn weights, written from the paper, one step
    and one source position at a time (float64):

    a_i^t = softmax_i(q_t . k_i / sqrt(d)) per head (padding excluded);
    c_i^t = sum_{t' <= t} a_i^{t'} (coverage up to and including step t, footnote 1);
    DimAttn_i^t[g] = F(A_i^t) - F(A_i^{t-1}) = g(c_i^t) - g(c_i^{t-1})       (Eq. 3-4; b = -g(0) cancels);
    P_i^t = max_{t' <= t-1} a_i^{t'} (0 at t = 0);
    DyDimAttn_i^t = P_i^t DimAttn_i^t[g1] + (1 - P_i^t) DimAttn_i^t[g2]      (Eq. 5);
    context_t = sum_i DyDimAttn_i^t v_i, heads concatenated, then the output projection.

    Returns the output ``T x B x C`` and the weights ``B x H x T x S``."""
    tgt_len, bsz, dim = query.shape
    src_len, heads = kv.size(0), attn.num_heads
    d = dim // heads

    def proj(lin, x):
        return x @ lin.weight.T + lin.bias

    q = proj(attn.q_proj, query) / math.sqrt(d)
    k, v = proj(attn.k_proj, kv), proj(attn.v_proj, kv)
    out = torch.zeros(tgt_len, bsz, dim, dtype=query.dtype)
    weights = torch.zeros(bsz, heads, tgt_len, src_len, dtype=query.dtype)
    for b in range(bsz):
        for h in range(heads):
            sl = slice(h * d, (h + 1) * d)
            coverage = [0.0] * src_len
            largest = [0.0] * src_len
            for t in range(tgt_len):
                logits = torch.stack([q[t, b, sl] @ k[i, b, sl] for i in range(src_len)])
                logits = logits.masked_fill(pad[b], -math.inf)
                a = torch.softmax(logits, -1)
                context = torch.zeros(d, dtype=query.dtype)
                for i in range(src_len):
                    before, after = coverage[i], coverage[i] + a[i].item()
                    p = largest[i]
                    w = p * (g1(after) - g1(before)) + (1 - p) * (g2(after) - g2(before))
                    weights[b, h, t, i] = w
                    context = context + w * v[i, b, sl]
                    coverage[i] = after
                    largest[i] = max(largest[i], a[i].item())
                out[t, b, sl] = context
    out = out @ attn.out_proj.weight.T + attn.out_proj.bias
    return out, weights


def log1(x):
    return math.log(1.0 + x)


def two_sqrt1(x):
    return 2.0 * math.sqrt(1.0 + x)


@pytest.mark.parametrize("g2_spec, g2", [(None, two_sqrt1), ("identity", lambda x: x)])
def test_dydimattn_module_equals_the_paper_with_random_weights(g2_spec, g2):
    """The module (default g1 = log(x+1), g2 = 2 sqrt(x+1); and g2 = x) against the paper's equations over
    8 steps, 3 heads and a padded source, with random projections and biases: output and weights."""
    torch.manual_seed(3)
    kwargs = {} if g2_spec is None else {"g2": g2_spec}
    attn = DiminishingMultiheadAttention(12, 3, dim_type="dydim", **kwargs).double().eval()
    assert attn.g2.spec == (g2_spec or "2*sqrt")
    for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        torch.nn.init.normal_(lin.weight, std=0.6)
        torch.nn.init.normal_(lin.bias, std=0.5)
    tgt_len, bsz, src_len = 8, 2, 5
    query = torch.randn(tgt_len, bsz, 12, dtype=torch.float64)
    kv = torch.randn(src_len, bsz, 12, dtype=torch.float64)
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    pad[1, -2:] = True
    with torch.no_grad():
        got, got_w = attn(query, kv, kv, key_padding_mask=pad, static_kv=True, need_head_weights=True)
    expected, expected_w = paper_dydimattn(attn, query, kv, pad, log1, g2)
    # the weights are not a plain softmax: P > 0 after the first step, and they no longer sum to 1
    assert (expected_w[..., 1:, :].sum(-1) < 0.999).any()
    # (the module takes the softmax in float32)
    torch.testing.assert_close(got_w.transpose(0, 1), expected_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_default_g2_diminishes_more_slowly_than_g1_everywhere():
    """g1 = log(x+1), g2 = 2 sqrt(x+1): g2'(c) = 1/sqrt(1+c) >= 1/(1+c) = g1'(c) for every c >= 0, equal at 0;
    the paper's examples as written (log, sqrt) cross at c = 3, so the check refuses them in either order."""
    g1, g2 = parse_concave("log"), parse_concave(DYDIM_G2_DEFAULT)
    assert DYDIM_G2_DEFAULT == "2*sqrt"
    check_slower_diminishing(g1, g2, 1e6)
    c = torch.tensor([0.0, 0.5, 3.0, 100.0], dtype=torch.float64)
    torch.testing.assert_close(g2.derivative(c), 1 / torch.sqrt(1 + c))
    torch.testing.assert_close(g1.derivative(c), 1 / (1 + c))
    assert g2.derivative(c)[0].item() == pytest.approx(g1.derivative(c)[0].item())
    for a, b in (("log", "sqrt"), ("sqrt", "log")):
        with pytest.raises(ValueError):
            check_slower_diminishing(parse_concave(a), parse_concave(b), 1024)


def test_scaled_concave_functions():
    """``K*G`` is K times G: values, increments (cancellation-free form) and a refused K."""
    x = torch.tensor([0.0, 0.3, 2.0, 50.0], dtype=torch.float64)
    a = torch.tensor([0.1, 0.7, 1e-6, 0.4], dtype=torch.float64)
    for spec, base in (("2*sqrt", "sqrt"), ("0.5*log", "log"), ("3*pow:0.25", "pow:0.25"), ("2*identity", "identity")):
        g, h = parse_concave(spec), parse_concave(base)
        k = float(spec.split("*")[0])
        torch.testing.assert_close(g(x), k * h(x))
        torch.testing.assert_close(g.increment(x, a), k * (h(x + a) - h(x)), rtol=1e-6, atol=1e-12)
    for bad in ("0*log", "-1*sqrt", "x*log", "2*exp"):
        with pytest.raises(ValueError):
            parse_concave(bad)


def test_models_default_to_the_new_g2(tiny_bin):
    _, model, args = build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL, "--dimattn-type", "dydim")
    assert args.dimattn_g2 == "2*sqrt"
    assert model.decoder.layers[-1].encoder_attn.g2.spec == "2*sqrt"


def test_a_checkpoint_keeps_the_g2_it_was_trained_with(tiny_bin, tmp_path):
    """A DyDimAttn checkpoint saved when g2 defaulted to x records ``dimattn_g2 = identity`` (the defaults were
    written into its args): it loads with g2 = x and gives the outputs of a model built with
    ``--dimattn-g2 identity``; one saved today loads with 2 sqrt(x+1)."""
    from fairseq import checkpoint_utils

    task, model, args = build_task_and_model(tiny_bin, "transformer_dimattn", *TINY_MODEL, "--dimattn-type", "dydim")
    save_checkpoint(model, args, tmp_path / "old.pt", dimattn_g2="identity")
    save_checkpoint(model, args, tmp_path / "new.pt")
    (old,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "old.pt")], task=task)
    (new,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "new.pt")], task=task)
    assert old.decoder.layers[-1].encoder_attn.g2.spec == "identity" and old.args.dimattn_g2 == "identity"
    assert new.decoder.layers[-1].encoder_attn.g2.spec == "2*sqrt"
    _, ref, _ = build_task_and_model(
        tiny_bin, "transformer_dimattn", *TINY_MODEL, "--dimattn-type", "dydim", "--dimattn-g2", "identity"
    )
    ref.load_state_dict(model.state_dict())
    net = first_batch(task)["net_input"]
    for m in (old, new, ref):
        m.eval()
    with torch.no_grad():
        out_old, out_new, out_ref = (m(**net)[0] for m in (old, new, ref))
    torch.testing.assert_close(out_old, out_ref, rtol=0, atol=0)
    assert not torch.allclose(out_new, out_ref, atol=1e-4)
