"""The copy head's fast path (issue 30) against a dense reference written here: Eq. 6 in
probabilities over the whole vocabulary, P = p_gen softmax(logits) + (1 - p_gen) scatter_add(alpha),
from the decoder's own logits, switch and copy attention.

- every step of fairseq's beam search (beam 3): the log-probabilities the search used;
- incremental decoding with a reorder across sentences (the source index cached on the first
  step must follow its hypotheses);
- training: the loss and every gradient, and ``get_normalized_probs`` of a training-mode output.

Word-level data with ``<unk-N>`` placeholders, so that P_vocab = 0 columns and words copied only
are covered; the default raw alpha (Eq. 6 over every non-pad source position) and ``--copy-alpha
renormalized`` (over the copyable positions)."""

import re

import pytest
import torch
from conftest import TINY_MODEL
from fairseq.dataclass.configs import GenerationConfig
from helpers import build_task_and_model, first_batch

PLACEHOLDER = re.compile(r"^<unk-\d+>$")


def reference_lprobs(logits, p_gen_logit, copy_attn, src_tokens, dictionary, alpha_mode="raw"):
    """log of Eq. 6, dense and in float64: ``B x T x V`` from raw logits ``B x T x V``; alpha over every
    non-pad position (``raw``) or renormalized over the copyable ones (``renormalized``)."""
    logits = logits.double()
    placeholders = torch.tensor([bool(PLACEHOLDER.match(s)) for s in dictionary.symbols])
    p_vocab = torch.softmax(logits.masked_fill(placeholders, float("-inf")), -1)
    if alpha_mode == "raw":
        never = torch.tensor([dictionary.pad()])
    else:
        never = torch.tensor([dictionary.pad(), dictionary.eos(), dictionary.bos(), dictionary.unk()])
    copyable = ~torch.isin(src_tokens, never)
    alpha = copy_attn.double() * copyable.unsqueeze(1)
    alpha = alpha / alpha.sum(-1, keepdim=True)
    index = src_tokens.unsqueeze(1).expand(-1, logits.size(1), -1)
    copy = torch.zeros_like(p_vocab).scatter_add(2, index, alpha)
    p_gen = torch.sigmoid(p_gen_logit.double())
    probs = p_gen * p_vocab + (1 - p_gen) * copy
    # log 0 = -inf with a zero gradient (log's own would be 0 * inf = NaN there)
    return torch.where(probs > 0, probs, torch.ones_like(probs)).log().masked_fill(probs == 0, float("-inf"))


def build(word_level_bin, *flags):
    task, model, args = build_task_and_model(
        word_level_bin / "bin", "copy_transformer", *TINY_MODEL, "--criterion", "force_copy", "--dropout", "0", *flags
    )
    return task, model, args


def record_logits(model):
    """Keep a copy of every output-layer result, in the autograd graph (the copy head overwrites
    the placeholder columns of the result in place)."""
    seen, layer = [], model.decoder.output_layer

    def output_layer(features):
        out = layer(features)
        seen.append(out.clone())
        return out

    model.decoder.output_layer = output_layer
    return seen


def assert_close_grads(got, expected):
    """Every parameter's gradient, float32 against float64 sums over the whole vocabulary: absolute noise
    ~1e-6 of the largest gradient of the model (one that is 0 in exact arithmetic, as the keys' biases
    under a softmax, is that noise)."""
    assert got.keys() == expected.keys() and len(got) > 0
    atol = 1e-5 * max(g.abs().max().item() for g in expected.values())
    for n in got:
        torch.testing.assert_close(
            got[n].double(), expected[n].double(), rtol=1e-4, atol=atol, msg=lambda m: f"{n}: {m}"
        )


def assert_equal_lprobs(got, expected):
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(got), finite)
    torch.testing.assert_close(got[finite].double(), expected[finite], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("alpha_mode", ["raw", "renormalized"])
def test_every_beam_search_step_equals_the_dense_mixture(word_level_bin, alpha_mode):
    task, model, _ = build(word_level_bin, "--copy-alpha", alpha_mode)
    model.eval()
    logits = record_logits(model)
    steps, normalize = [], model.get_normalized_probs

    def get_normalized_probs(net_output, log_probs, sample=None):
        out = normalize(net_output, log_probs, sample)
        steps.append((out.clone(), {k: net_output[1][k] for k in ("p_gen_logit", "copy_attn", "src_tokens")}))
        return out

    model.get_normalized_probs = get_normalized_probs
    generator = task.build_generator([model], GenerationConfig(beam=3, max_len_a=0, max_len_b=6, min_len=6))
    sample = first_batch(task)
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
    assert len(hypos) == sample["nsentences"] and len(steps) == len(logits) >= 6
    assert steps[0][0].size(0) == 3 * sample["nsentences"]
    for lprobs, (out, extra) in zip(logits, steps):
        parts = (extra[k] for k in ("p_gen_logit", "copy_attn", "src_tokens"))
        expected = reference_lprobs(lprobs, *parts, task.tgt_dict, alpha_mode)
        assert_equal_lprobs(out, expected)


def test_incremental_decoding_with_a_reorder_across_sentences(word_level_bin):
    """A reorder that moves hypotheses to other sentences (and drops one, as fairseq does when a
    sentence is finished): every step equals the dense mixture of the source it now has."""
    task, model, _ = build(word_level_bin)
    model.eval()
    logits = record_logits(model)
    net = first_batch(task)["net_input"]
    bsz = net["src_tokens"].size(0)
    assert bsz >= 3 and not torch.equal(net["src_tokens"][0], net["src_tokens"][1])
    prev = net["prev_output_tokens"][:, :6]
    order = torch.arange(bsz - 1).flip(0)  # reversed, the last sentence dropped
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        state, outputs, rows = {}, [], torch.arange(bsz)
        for t in range(prev.size(1)):
            if t == 3:
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                rows = rows[order]
            outputs.append(model.decoder(prev[rows, : t + 1], encoder_out=enc, incremental_state=state))
    for t, (raw, out) in enumerate(zip(logits, outputs)):
        extra = out[1]
        assert torch.equal(extra["src_tokens"], net["src_tokens"][order if t >= 3 else torch.arange(bsz)])
        expected = reference_lprobs(raw, extra["p_gen_logit"], extra["copy_attn"], extra["src_tokens"], task.tgt_dict)
        assert_equal_lprobs(model.get_normalized_probs(out, log_probs=True), expected)


@pytest.mark.parametrize("mode, alpha_mode", [("none", "raw"), ("force", "raw"), ("none", "renormalized")])
def test_training_loss_and_gradients_equal_the_dense_mixture(word_level_bin, mode, alpha_mode):
    """The criterion's loss (-log P(w*) with ``none``, the force terms' nll) and every gradient
    against the dense reference built from the same forward pass; ``get_normalized_probs`` of the
    training-mode output (None first output) with the gradients of a random weighting."""
    task, model, args = build(word_level_bin, "--copy-supervision", mode, "--copy-alpha", alpha_mode)
    crit = task.build_criterion(args)
    logits = record_logits(model)
    sample = first_batch(task)
    model.train()
    target = sample["target"]
    real = target.ne(task.tgt_dict.pad())

    def dense(out):
        extra = out[1]
        parts = (extra[k] for k in ("p_gen_logit", "copy_attn", "src_tokens"))
        return reference_lprobs(logits[-1], *parts, task.tgt_dict, alpha_mode)

    def grads():
        g = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return g

    # the criterion (its own forward), then the reference on a second forward of the same model
    loss, _, log = crit(model, sample)
    loss.backward()
    got = grads()
    out = model(**sample["net_input"])
    assert out[0] is None
    nll = -dense(out).gather(-1, target.unsqueeze(-1)).squeeze(-1).masked_fill(~real, 0).sum()
    assert float(log["nll_loss"]) == pytest.approx(nll.item(), rel=1e-5)
    nll.backward()
    expected = grads()
    if mode == "none":  # the loss is the mixture's NLL
        assert_close_grads(got, expected)

    weights = torch.rand(*target.shape, len(task.tgt_dict), generator=torch.Generator().manual_seed(0))
    results = []
    for fast in (True, False):
        out = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(out, log_probs=True) if fast else dense(out)
        finite = torch.isfinite(lprobs)
        (lprobs.masked_fill(~finite, 0) * weights.to(lprobs.dtype)).sum().backward()
        results.append((lprobs.detach().double(), finite, grads()))
    (fast_lp, f1, g1), (ref_lp, f2, g2) = results
    assert torch.equal(f1, f2) and not f1.all()  # placeholders absent from a source: -inf
    torch.testing.assert_close(fast_lp[f1], ref_lp[f1], atol=2e-5, rtol=1e-5)
    assert_close_grads(g1, g2)


OWN = ("copy_generator.py", "copy_transformer.py", "force_copy.py", "cross_attention.py", "diminishing_attention.py")
SYNCS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__")


def test_no_host_device_sync_in_a_training_or_decoding_step(word_level_bin, monkeypatch):
    """Item 4 of issue 30: the copy head, its criterion and the (diminishing) cross-attention ask
    the device for no value during a training step or a beam search: every call that would wait
    for the device (``.item()``, ``.tolist()``, ``.cpu()``, ``nonzero``, a tensor's truth value or
    number) made from their code is counted, and there are none."""
    import sys

    calls = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, **kw):
            caller = sys._getframe(1).f_code.co_filename
            if caller.endswith(OWN):
                calls.append((name, caller, sys._getframe(1).f_lineno))
            return original(self, *a, **kw)

        return wrapper

    task, model, args = build(word_level_bin, "--dimattn-type", "dydim", "--dimattn-layers", "all")
    crit = task.build_criterion(args)
    sample = first_batch(task)
    generator = task.build_generator([model], GenerationConfig(beam=3, max_len_a=0, max_len_b=4, min_len=4))
    for name in SYNCS:
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    model.train()
    loss, _, _ = crit(model, sample)
    loss.backward()
    model.eval()
    with torch.no_grad():
        task.inference_step(generator, [model], sample)
    monkeypatch.undo()
    assert calls == []
