"""The copy head as "May the Force Be with Your Copy Mechanism" writes it, computed here in plain PyTorch from
the paper and the transformer's attention, against ``copy_transformer`` with random non-zero weights:

- Eq. 4: P_vocab = softmax(W'_v (W_v [s_t; c_t] + b) + b') with ``--copy-p-vocab eq4``; the default
  (``output``) is not Eq. 4 but fairseq's output projection of s_t alone, P_vocab = softmax(W_o s_t), and the
  reference computes that for the other variants;
- Eq. 5: p_gen = sigmoid(w_h^T c_t + w_s^T s_t + w_y^T y_t + b_ptr), c_t = sum_i alpha_{t,i} h_i (Eq. 3);
- Eq. 6: P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} alpha_{t,i}, P_vocab(w) = 0 for a word outside
  the vocabulary (an ``<unk-N>`` placeholder);

with alpha_t the attention of ONE head of the last decoder layer over every source position (the default),
and the flags: ``--copy-alpha renormalized`` (alpha over the copyable positions, renormalized) and
``--copy-heads all`` (the heads' average). A checkpoint saved before ``--copy-alpha`` existed loads with the
renormalized alpha and all heads it was trained with."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from checkpoint_helpers import save_checkpoint
from conftest import TINY_MODEL
from helpers import build_task_and_model, first_batch

PLACEHOLDER = re.compile(r"^<unk-\d+>$")
VARIANTS = {
    "default": [],
    "renormalized": ["--copy-alpha", "renormalized"],
    "all-heads": ["--copy-heads", "all"],
    "eq4": ["--copy-p-vocab", "eq4"],
}


def build(data, *flags):
    return build_task_and_model(
        data, "copy_transformer", *TINY_MODEL, "--criterion", "force_copy", "--dropout", "0", *flags
    )


def randomize_switch(model, seed=0):
    """w_h, w_s, w_y and b_ptr of Eq. 5 drawn at random (non-zero), large enough that each part moves p_gen; with
    ``--copy-p-vocab eq4`` also W_v, b and b' of Eq. 4 (W'_v, the output projection, is random already)."""
    gen = torch.Generator().manual_seed(seed)
    head = model.decoder.copy_generator
    with torch.no_grad():
        head.switch.weight.copy_(torch.randn(head.switch.weight.shape, generator=gen) * 0.2)
        head.switch.bias.copy_(torch.randn(head.switch.bias.shape, generator=gen) * 0.5)
        if head.p_vocab == "eq4":
            head.vocab_hidden.weight.copy_(torch.randn(head.vocab_hidden.weight.shape, generator=gen) * 0.3)
            head.vocab_hidden.bias.copy_(torch.randn(head.vocab_hidden.bias.shape, generator=gen) * 0.3)
            head.vocab_bias.copy_(torch.randn(head.vocab_bias.shape, generator=gen))


def cross_attention_inputs(model, net):
    """The query, encoder states and padding mask that the copy layer's cross-attention receives."""
    seen = {}

    def hook(module, args, kwargs):
        seen.update(kwargs)

    layer = model.decoder.layers[model.decoder.copy_layer]
    handle = layer.encoder_attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**net)
    finally:
        handle.remove()
    return seen["query"], seen["key"], seen["key_padding_mask"]


def paper_copy_head(model, task, net, alpha_mode, heads, p_vocab="output"):
    """Eq. 2-6 from the paper, float64, for the model's own weights. ``heads``: how many heads alpha averages
    (1: one attention distribution). ``p_vocab``: ``eq4``, P_vocab of Eq. 4 from [s_t; c_t]; ``output``, the
    package's default in its place (the output projection of s_t, not Eq. 4). Returns alpha ``B x T x S``, p_gen
    ``B x T``, P ``B x T x V``, the three terms of Eq. 5's logit and log P_vocab ``B x T x V``."""
    d = task.target_dictionary
    dec = model.decoder
    src, prev = net["src_tokens"], net["prev_output_tokens"]
    # alpha_t (Eq. 2): softmax over the source of the scaled dot products of the copy layer's heads
    query, keys, pad = (x.double() if x.is_floating_point() else x for x in cross_attention_inputs(model, net))
    attn = dec.layers[dec.copy_layer].encoder_attn
    n_heads, dim = attn.num_heads, query.size(-1)
    hd = dim // n_heads
    q = (query @ attn.q_proj.weight.double().T + attn.q_proj.bias.double()) / math.sqrt(hd)
    k = keys @ attn.k_proj.weight.double().T + attn.k_proj.bias.double()
    scores = torch.einsum("tbhd,sbhd->bhts", q.view(*q.shape[:2], n_heads, hd), k.view(*k.shape[:2], n_heads, hd))
    if pad is not None:
        scores = scores.masked_fill(pad[:, None, None, :], -math.inf)
    alpha = torch.softmax(scores, -1)[:, :heads].mean(1)  # B x T x S
    if alpha_mode == "renormalized":  # EOS, BOS, pad and <unk> never copied; the rest sums to 1
        never = torch.tensor([d.pad(), d.eos(), d.bos(), d.unk()])
        alpha = alpha * ~torch.isin(src, never).unsqueeze(1)
        alpha = alpha / alpha.sum(-1, keepdim=True)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=net["src_lengths"])
        s_t = dec.extract_features(prev, encoder_out=enc)[0].double()  # decoder states, B x T x C
    h = enc["encoder_out"][0].transpose(0, 1).double()  # encoder states h_i, B x S x C
    c_t = torch.einsum("bts,bsc->btc", alpha, h)  # Eq. 3
    placeholders = torch.tensor([bool(PLACEHOLDER.match(w)) for w in d.symbols])
    emb = dec.embed_tokens.weight.double()
    y_t = emb[prev.masked_fill(placeholders[prev], d.unk())]  # a placeholder reads <unk>'s embedding
    w = dec.copy_generator.switch.weight.double()[0]
    w_h, w_s, w_y = w[: c_t.size(-1)], w[c_t.size(-1) : c_t.size(-1) + s_t.size(-1)], w[-y_t.size(-1) :]
    b_ptr = dec.copy_generator.switch.bias.double()[0]
    p_gen = torch.sigmoid(c_t @ w_h + s_t @ w_s + y_t @ w_y + b_ptr)  # Eq. 5
    w_out = dec.output_projection.weight.double()  # W'_v of Eq. 4 / W_o of the default
    if p_vocab == "eq4":  # Eq. 4: W'_v (W_v [s_t; c_t] + b) + b'
        w_v, b = dec.copy_generator.vocab_hidden.weight.double(), dec.copy_generator.vocab_hidden.bias.double()
        logits = (torch.cat([s_t, c_t], -1) @ w_v.T + b) @ w_out.T + dec.copy_generator.vocab_bias.double()
    else:  # the package's default, not Eq. 4: fairseq's output projection of s_t alone
        logits = s_t @ w_out.T
    logits = logits.masked_fill(placeholders, -math.inf)
    p_vocab = torch.softmax(logits, -1)  # 0 for the placeholders (outside the vocabulary)
    copy = torch.einsum("bts,bsv->btv", alpha, F.one_hot(src, len(d)).double())  # sum_{i: x_i = w} alpha_{t,i}
    probs = p_gen.unsqueeze(-1) * p_vocab + (1 - p_gen.unsqueeze(-1)) * copy  # Eq. 6
    return alpha, p_gen, probs, (c_t @ w_h, s_t @ w_s, y_t @ w_y), torch.log_softmax(logits, -1)


def heads_of(name, model):
    return model.decoder.layers[-1].encoder_attn.num_heads if name == "all-heads" else 1


def alpha_of(name):
    return "renormalized" if name == "renormalized" else "raw"


def p_vocab_of(name):
    return "eq4" if name == "eq4" else "output"


@pytest.mark.parametrize("name", VARIANTS)
def test_p_gen_is_eq5_with_random_switch_weights(word_level_bin, name):
    """p_gen of the model against Eq. 5 computed here, with random non-zero w_h, w_s, w_y, b_ptr, each of
    whose terms moves p_gen; and alpha against one head's (or the heads') attention."""
    task, model, _ = build(word_level_bin / "bin", *VARIANTS[name])
    randomize_switch(model)
    model.eval()
    net = first_batch(task)["net_input"]
    with torch.no_grad():
        extra = model(**net)[1]
    alpha, p_gen, _, terms, _ = paper_copy_head(
        model, task, net, alpha_of(name), heads_of(name, model), p_vocab_of(name)
    )
    real = net["prev_output_tokens"].ne(task.target_dictionary.pad())
    for term in terms:  # every part of Eq. 5 contributes
        assert term[real].abs().mean() > 0.02
    assert 0.01 < p_gen[real].min() and p_gen[real].max() < 0.99 and p_gen[real].std() > 0.03
    torch.testing.assert_close(extra["copy_attn"].double()[real], alpha[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(extra["p_gen"][..., 0].double()[real], p_gen[real], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", VARIANTS)
def test_mixture_is_eq6_in_decoding_training_and_the_loss(word_level_bin, name):
    """P(w) of Eq. 6 computed here over the whole vocabulary against the model's decoding distribution (eval),
    the training-mode output's ``get_normalized_probs`` and the ``none`` criterion's nll (-log P(w*)); with raw
    alpha the source's EOS feeds P(EOS), renormalized it does not."""
    task, model, args = build(word_level_bin / "bin", *VARIANTS[name], "--copy-supervision", "none")
    randomize_switch(model, seed=1)
    sample = first_batch(task)
    net = sample["net_input"]
    model.eval()
    alpha, _, probs, _, _ = paper_copy_head(model, task, net, alpha_of(name), heads_of(name, model), p_vocab_of(name))
    d = task.target_dictionary
    real = net["prev_output_tokens"].ne(d.pad())
    expected = probs.log()
    with torch.no_grad():
        decoded = model.get_normalized_probs(model(**net), log_probs=True).double()
        model.train()
        trained = model.get_normalized_probs(model(**net), log_probs=True).double()
        _, _, log = task.build_criterion(args)(model, sample)
    finite = torch.isfinite(expected[real])
    for got in (decoded, trained):
        assert torch.equal(torch.isfinite(got[real]), finite)
        torch.testing.assert_close(got[real][finite], expected[real][finite], atol=1e-5, rtol=1e-4)
    # the source's EOS: copied as itself with raw alpha (Eq. 6's sum over i: x_i = w), never when renormalized
    eos_share = (alpha * net["src_tokens"].eq(d.eos()).unsqueeze(1)).sum(-1)
    if alpha_of(name) == "raw":
        assert eos_share[real].min() > 0
    else:
        assert (eos_share == 0).all()
    target = sample["target"]
    at_target = expected.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    keep = target.ne(d.pad()) & torch.isfinite(at_target)
    assert float(log["nll_loss"]) == pytest.approx(-at_target[keep].sum().item(), rel=1e-4)


def test_p_vocab_is_eq4_with_random_weights(word_level_bin):
    """``--copy-p-vocab eq4``: log P_vocab of the model (training and decoding) against Eq. 4 computed here,
    softmax(W'_v (W_v [s_t; c_t] + b) + b'), with random non-zero W_v, b, b' and the model's W'_v (its output
    projection, untied here); c_t moves it, and it is not the default's softmax(W_o s_t)."""
    task, model, _ = build(word_level_bin / "bin", *VARIANTS["eq4"])
    randomize_switch(model, seed=2)
    net = first_batch(task)["net_input"]
    model.eval()
    _, _, _, _, expected = paper_copy_head(model, task, net, "raw", 1, "eq4")
    _, _, _, _, default = paper_copy_head(model, task, net, "raw", 1, "output")
    real = net["prev_output_tokens"].ne(task.target_dictionary.pad())
    head = model.decoder.copy_generator
    c_columns = head.vocab_hidden.weight[:, model.decoder.output_embed_dim :]
    with torch.no_grad():
        model.train()  # dropout 0: training mode only keeps log P_vocab in the extras
        got = model(**net)[1]["vocab_lprobs"].double()
        without_c = c_columns.clone()
        c_columns.zero_()
        no_context = model(**net)[1]["vocab_lprobs"].double()
        c_columns.copy_(without_c)
    finite = torch.isfinite(expected[real])
    assert torch.equal(torch.isfinite(got[real]), finite)
    torch.testing.assert_close(got[real][finite], expected[real][finite], atol=1e-5, rtol=1e-4)
    # c_t's part of W_v [s_t; c_t] moves P_vocab, and Eq. 4 is another distribution than the default's
    assert (no_context[real][finite] - got[real][finite]).abs().max() > 0.1
    assert (default[real][finite] - expected[real][finite]).abs().max() > 0.1


def test_eq4_adds_w_v_b_and_b_prime_and_trains_them(word_level_bin):
    """Eq. 4 adds W_v, b (``vocab_hidden``) and b' (``vocab_bias``) to the default's parameters, W'_v being the
    output projection (no second V x C matrix); one training step moves each of them; decoding step by step gives
    the whole-prefix output."""
    from helpers import decode_full_and_stepwise

    _, default, _ = build(word_level_bin / "bin")
    task, model, args = build(word_level_bin / "bin", *VARIANTS["eq4"])
    new = set(dict(model.named_parameters())) - set(dict(default.named_parameters()))
    prefix = "decoder.copy_generator."
    assert new == {prefix + "vocab_hidden.weight", prefix + "vocab_hidden.bias", prefix + "vocab_bias"}
    assert model.args.copy_p_vocab == "eq4" and default.args.copy_p_vocab == "output"
    sample = first_batch(task, split="valid")
    randomize_switch(model, seed=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    loss, _, _ = task.build_criterion(args)(model, sample)
    loss.backward()
    optimizer.step()
    for name in new | {"decoder.output_projection.weight"}:
        assert not torch.equal(before[name], dict(model.named_parameters())[name]), name
    model.eval()
    net = sample["net_input"]
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    full, steps = decode_full_and_stepwise(model, enc, net["prev_output_tokens"])
    real = net["prev_output_tokens"].ne(task.target_dictionary.pad())  # (a padded step sees other keys)
    stepwise = torch.cat([model.get_normalized_probs(out, log_probs=True) for out in steps], dim=1)
    whole = model.get_normalized_probs(full, log_probs=True)
    finite = torch.isfinite(whole[real])
    assert torch.equal(torch.isfinite(stepwise[real]), finite)
    torch.testing.assert_close(stepwise[real][finite], whole[real][finite], atol=1e-5, rtol=1e-5)


def old_and_fresh(data, tmp_path, *, arch="copy_transformer", task_name="translation", flags=(), **changes):
    """A model with today's defaults saved as a checkpoint from before ``--copy-alpha`` existed (no
    ``copy_alpha`` in its args, ``changes`` set), loaded back by fairseq."""
    from fairseq import checkpoint_utils

    task, model, args = build_task_and_model(data, arch, *TINY_MODEL, "--dropout", "0", *flags, task=task_name)
    save_checkpoint(model, args, tmp_path / "old.pt", drop=("copy_alpha",), **changes)
    (old,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "old.pt")], task=task)
    return task, model, args, old


@pytest.mark.parametrize("heads, expected_heads", [(None, None), (1, 1)])
def test_a_checkpoint_from_before_the_flag_keeps_its_alpha(word_level_bin, tmp_path, heads, expected_heads):
    """Args with ``copy_heads`` (None: all heads, the old default) and no ``copy_alpha``: the model is rebuilt
    with renormalized alpha and those heads, its args say so (a checkpoint saved again records them), and its
    outputs are those of a model built with ``--copy-alpha renormalized --copy-heads all|1``, not today's."""
    task, today, _, old = old_and_fresh(word_level_bin / "bin", tmp_path, copy_heads=heads)
    assert old.decoder.copy_alpha == "renormalized" and old.decoder.copy_heads == expected_heads
    assert old.args.copy_alpha == "renormalized" and old.args.copy_heads == (heads or 0)
    _, ref, _ = build(word_level_bin / "bin", "--copy-alpha", "renormalized", "--copy-heads", str(heads or "all"))
    ref.load_state_dict(today.state_dict())
    net = first_batch(task)["net_input"]
    outputs = []
    for m in (old, ref, today):
        m.eval()
        with torch.no_grad():
            outputs.append(m.get_normalized_probs(m(**net), log_probs=True))
    finite = torch.isfinite(outputs[1])
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    assert not torch.allclose(outputs[2][finite], outputs[1][finite], atol=1e-3)
    assert today.decoder.copy_alpha == "raw" and today.decoder.copy_heads == 1


def test_an_eki_copy_checkpoint_from_before_the_flag_keeps_its_renormalized_alpha(eki_bin, tmp_path):
    """The same for ``eki_transformer --copy`` (its decoder is built from a copy of the args, so only what the
    parser put there is saved); a checkpoint saved today loads with raw alpha and one head."""
    from fairseq import checkpoint_utils

    flags = ("--eki-scaling-dim", "8", "--copy", "--copy-layer", "0")
    task, today, args, old = old_and_fresh(
        eki_bin, tmp_path, arch="eki_transformer", task_name="eki_generation", flags=flags
    )
    assert old.decoder.copy_alpha == "renormalized" and old.decoder.copy_heads is None
    assert today.decoder.copy_alpha == "raw" and today.decoder.copy_heads == 1
    save_checkpoint(today, args, tmp_path / "new.pt")
    (new,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "new.pt")], task=task)
    assert new.decoder.copy_alpha == "raw" and new.decoder.copy_heads == 1


def test_copy_flags_on_the_command_line(tiny_bin):
    """``--copy-heads all`` averages every head (0 in the args), ``--copy-heads 2`` the first two, both with raw
    alpha (a command line is never taken for an old checkpoint's args, whatever flags it gives); a number of
    heads out of range is refused."""
    _, model, args = build(tiny_bin, "--copy-heads", "all")
    assert args.copy_heads == 0 and model.decoder.copy_heads is None
    assert args.copy_alpha == "raw" and model.decoder.copy_alpha == "raw"
    _, model, args = build(tiny_bin, "--copy-heads", "2", "--copy-layer", "-1")
    assert model.decoder.copy_heads == 2 and args.copy_alpha == "raw" and model.decoder.copy_alpha == "raw"
    _, model, args = build(tiny_bin, "--copy-alpha", "renormalized")
    assert model.decoder.copy_heads == 1 and model.decoder.copy_alpha == "renormalized"
    with pytest.raises(ValueError, match="--copy-heads must be 'all' or in 1..2, got 3"):
        build(tiny_bin, "--copy-heads", "3")
