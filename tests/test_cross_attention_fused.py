"""EKI's cross-attention on ``F.scaled_dot_product_attention``: the fused path equals the materialised
one (logits, softmax, weights times values), in values and gradients, for the module alone (padding,
and beam search's one copy of the keys per sentence) and for a whole ``eki_transformer`` training step
with and without the scaling module. Each test seeds torch itself, so it draws the same weights
whatever ran before it in the process."""

import pytest
import torch
from conftest import TINY_MODEL
from helpers import build_task_and_model, first_batch

from fairseq_knowgen.modules.position_indicator import PositionIndicatorAttention


def materialised(self, q, k, v, pad, bsz):
    """softmax(q k^T + padding) v by hand, as :meth:`fused_attention` returns it (``T x B x C``)."""
    heads, d = self.num_heads, self.head_dim
    kv_bsz = k.size(0) // heads
    beams = bsz // kv_bsz
    tgt_len = q.size(1)
    # every hypothesis with its sentence's keys, values and padding
    k = k.view(kv_bsz, 1, heads, -1, d).expand(kv_bsz, beams, heads, -1, d).reshape(bsz * heads, -1, d)
    v = v.view(kv_bsz, 1, heads, -1, d).expand(kv_bsz, beams, heads, -1, d).reshape(bsz * heads, -1, d)
    logits = q @ k.transpose(1, 2)
    if pad is not None:
        pad = pad.view(kv_bsz, 1, 1, 1, -1).expand(kv_bsz, beams, heads, 1, -1).reshape(bsz * heads, 1, -1)
        logits = logits.masked_fill(pad, float("-inf"))
    mixed = torch.softmax(logits, -1) @ v  # (B*H) x T x d
    return self.out_proj(mixed.transpose(0, 1).reshape(tgt_len, bsz, self.embed_dim))


def assert_close_gradients(got, expected, positions):
    """Gradients of two float32 computations that differ only in rounding: each gradient entry sums products over at
    most ``positions`` positions, each at most G (the largest gradient entry) in size, and the two paths differ by
    about float32's unit roundoff u = 6e-8 in each term, so an entry differs by about sqrt(positions) u G and at
    most positions u G; the tolerance is 2e-6 G (relative 1e-4 beside it), for at most 100 positions. An entry
    that is 0 in exact arithmetic (the keys' biases under a softmax) is that rounding alone, hence a tolerance
    relative to G, not to the entry."""
    assert got.keys() == expected.keys() and len(got) > 0
    big = max(g.abs().max().item() for g in expected.values())
    assert positions <= 100, positions  # sqrt(100) u = 6e-7, a third of the tolerance: chosen for these sizes
    for n in got:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-4, atol=2e-6 * big, msg=lambda m: f"{n}: {m}")


def attention(seed=0):
    torch.manual_seed(seed)
    attn = PositionIndicatorAttention(16, 4, max_distance=5)
    with torch.no_grad():
        attn.distance_embed.weight.normal_()
    return attn


def test_fused_equals_materialised_with_padding_values_and_gradients():
    tgt_len, bsz, src_len = 5, 3, 7
    results = []
    for fused in (True, False):
        attn = attention()
        if not fused:
            attn.fused_attention = materialised.__get__(attn)
        torch.manual_seed(1)
        q = torch.randn(tgt_len, bsz, 16, requires_grad=True)
        kv = torch.randn(src_len, bsz, 16, requires_grad=True)
        dist = torch.randint(0, 6, (bsz, src_len))
        pad = torch.zeros(bsz, src_len, dtype=torch.bool)
        pad[0, :3] = pad[2, -1] = True
        out, w = attn(q, kv, kv, key_padding_mask=pad, need_weights=False, distances=dist)
        assert w is None
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads = {"query": q.grad, "key_value": kv.grad, **{n: p.grad for n, p in attn.named_parameters()}}
        results.append((out.detach(), grads))
    (out_f, g_f), (out_m, g_m) = results
    torch.testing.assert_close(out_f, out_m, rtol=1e-5, atol=1e-6)
    # a weight's gradient sums over the 15 query or the 21 key positions
    assert_close_gradients(g_f, g_m, positions=tgt_len * bsz + src_len * bsz)
    assert g_f["distance_embed.weight"].abs().sum() > 0


def test_fused_equals_weights_path_in_beam_search():
    """Incremental decoding with beam 2 (one copy of the keys per sentence): the fused step equals
    fairseq's weights path (need_weights=True) of the same module."""
    tgt_len, sentences, beam, src_len = 1, 2, 2, 6
    attn = attention().eval()
    attn.set_beam_size(beam)
    torch.manual_seed(2)
    kv = torch.randn(src_len, sentences, 16).repeat_interleave(beam, dim=1)
    dist = torch.randint(0, 6, (sentences, src_len)).repeat_interleave(beam, dim=0)
    pad = torch.zeros(sentences * beam, src_len, dtype=torch.bool)
    pad[:beam, 0] = True
    outs = {}
    with torch.no_grad():
        for need in (False, True):
            state, steps = {}, []
            for step in range(3):
                q = torch.randn(tgt_len, sentences * beam, 16, generator=torch.Generator().manual_seed(step))
                steps.append(attn(q, kv, kv, pad, incremental_state=state, need_weights=need, distances=dist)[0])
            outs[need] = torch.cat(steps)
    torch.testing.assert_close(outs[False], outs[True], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scaling", ["0", "1"])
def test_eki_training_step_fused_equals_materialised(eki_bin, scaling, monkeypatch):
    """A whole training step of eki_transformer (position indicator in both decoder layers: the
    first takes the fused path, the alignment layer fairseq's weights): loss and every gradient
    equal those with every layer materialised. Seeded: the model's random start is the same whatever
    ran before (unseeded, 2 of 400 starts differed by more than a fixed atol of 1e-6 at an entry near 0;
    the largest difference over those 400 was 3.2e-7 of the largest gradient)."""
    torch.manual_seed(0)
    task, model, args = build_task_and_model(
        eki_bin,
        "eki_transformer",
        *TINY_MODEL,
        "--eki-scaling",
        scaling,
        "--eki-scaling-dim",
        "8",
        "--dropout",
        "0",
        "--criterion",
        "eki_label_smoothed_cross_entropy",
        task="eki_generation",
    )
    assert all(isinstance(layer.encoder_attn, PositionIndicatorAttention) for layer in model.decoder.layers)
    assert (model.encoder.scaling is not None) == (scaling == "1")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "distance_embed" in n:
                p.normal_()
    crit = task.build_criterion(args)
    sample = first_batch(task)
    model.train()
    calls = []
    fused = PositionIndicatorAttention.fused_attention

    def counted(self, *a):
        calls.append(1)
        return fused(self, *a)

    results = []
    for path in (counted, materialised):
        monkeypatch.setattr(PositionIndicatorAttention, "fused_attention", path)
        model.zero_grad()
        loss, _, _ = crit(model, sample)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert len(calls) == 1  # the first decoder layer; the last is the alignment layer (weights returned)
    (loss_f, g_f), (loss_m, g_m) = results
    assert loss_f == pytest.approx(loss_m, rel=1e-6)
    # a weight's gradient sums over the batch's target (decoder) or source (encoder) positions
    target = sample["target"].ne(task.target_dictionary.pad()).sum().item()
    source = sample["net_input"]["src_tokens"].ne(task.source_dictionary.pad()).sum().item()
    assert_close_gradients(g_f, g_m, positions=max(target, source))
