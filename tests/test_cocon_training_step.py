"""One CoCon training step with all four losses on, against the authors' training loop written again here in plain
PyTorch: which parameters each loss's gradient reaches, what the cycle detaches, and the discriminator's own update.

The reference follows ``train_cocon`` in the authors' ``traininfer_cocon.py`` (alvinchangw/COCON_ICLR2021; read, not
copied), with their ``train_cocon.sh`` settings and ``--adv_use_th_gen_output`` (the package's default):

- the frozen LM's states of the text, and of the content run alone (l. 500-508); the batch's previous sample is the
  cycle's other sample, cyclically (l. 478);
- L_self (l. 555-575): the block on [history; x^b] with content x^b and the self-token mask; the upper layers read
  the LM's own states before the history's last one (l. 558); the token mean of the NLL of x^b. L_null (l. 591-610,
  their ``hist_cocon_lm_loss``): the same without content;
- the cycle (l. 647-717): q^1 is generated for ``max_cocon_AR_length`` steps from the other sample's history with
  content x^b. Each step runs the block on [history; fed-back states] (no cache) and feeds the soft token
  softmax(logits) through the embedding matrix and the LM's lower layers. The state fed back is detached where
  ``cur_len % train_cycle_detach_interval == 0`` (l. 703; cur_len is the step's index, so at interval 1 every step
  is detached). L_cycle (l. 721-749): the block on [history; x^b] with the LM's states of q^1 as content, the token
  mean of the NLL of x^b;
- L_adv (l. 795-823): fake = the LM's lower states of the generated q^1 (l. 798, ``cocon_th_gen_output``, not
  detached), real = the LM's states of x^b's tokens (l. 508, 801). CoCon's loss is ``-d_fake_loss - d_real_loss``
  (l. 821), means over the batch; its only term with a gradient into the block is log(1 - sigmoid(D(fake))) (the
  minimax form). The discriminator (``HDiscriminator``, ``modeling_gpt2.py`` l. 1216) is
  ``test_cocon_reference.ref_discriminator``;
- the discriminator's update (l. 898-960): where ``step % disc_update_interval == 0``, after the block's step (l.
  889), it takes ``d_fake_loss + d_real_loss`` on the detached states of that step (means over the batch), clips the
  gradient to norm ``max_grad_norm`` 1.0 (l. 929) and takes one step of its own AdamW (l. 335, 957: betas
  0.9/0.999, eps 1e-8, weight decay 0 by default).

The block's weights are read from the package's model into the authors' fused Conv1D layout, as fresh leaves. The
LM's lower and upper layers are the model's own (frozen). The block and the discriminator are
``test_cocon_reference.ref_block`` and ``ref_discriminator`` (torch only). Where the package differs from the
authors by design, the reference does as the package (``test_cocon_reference`` says why): the LM's start symbol
``</s>`` comes first in every text, history and content (the authors' GPT-2 has none), and dropout is off. Where
it differs otherwise, a test fails.
"""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from helpers import build_task_and_model, write_binarized
from test_cocon_reference import ref_block, ref_discriminator

from fairseq_knowgen.criterions.cocon import CoConCriterion

WORDS = "a b c d e f g h".split()
B, T = 3, 6  # sentences, window length
P, M = 2, 3  # the split: x^a = x_0 x_1, x^b = x_2 x_3 x_4 (x_5 is in no loss)
STEPS = 3  # soft tokens of q^1
LR_DISC = 1e-2
LOSSES = {"self": (1, 0, 0, 0), "null": (0, 1, 0, 0), "cycle": (0, 0, 1, 0), "adv": (0, 0, 0, 1)}  # the weights
# Tolerances, relative to the largest entry of the reference's gradient. The model runs in float64 here, but the
# package takes its attention softmax and its NLL logits in float32 (measured: L_self, L_null and L_cycle agree to
# 5e-7) and runs the discriminator in float32, on float32 states (L_adv through it: 1.1e-4; L_disc: 1.6e-6); each
# tolerance leaves a margin of 6x or more. Every broken variant, and the other detach interval, moves the gradient
# by more than 100x its tolerance.
RTOL = {"self": 1e-5, "null": 1e-5, "cycle": 1e-5, "adv": 1e-3, "disc": 1e-5}


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    """An untrained 2-layer, 8-wide transformer_lm on an 8-word vocabulary. The block sits after its first layer (the
    authors' relative depth)."""
    from fairseq_knowgen.prep.cocon import save_untrained_lm

    data = tmp_path_factory.mktemp("cocon_step")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(34)) for _ in range(4)]
    write_binarized(data, {"train": lines, "valid": lines}, words=WORDS)
    save_untrained_lm(str(data), str(data / "lm.pt"), layers=2, dim=8, heads=2)
    return data


def build(lm_dir, **flags):
    """The model (float64), its criterion with all four losses on from update 0, and a batch of B windows. Every
    weight is random and non-zero (the model's N(0, 0.5^2); the discriminator's N(0, 1), so that its gradient's norm
    exceeds the clip of 1). The discriminator's dropout is off."""
    task, model, _ = build_task_and_model(
        lm_dir, "cocon_lm", "--cocon-lm-path", lm_dir / "lm.pt", "--cocon-dropout", "0",
        "--cocon-attention-dropout", "0", task="cocon_generation",
    )  # fmt: skip
    flags = dict(dict(cocon_prefix_len=P, cocon_content_len=M, cocon_len_jitter=0, cocon_min_content=1,
                      cocon_max_content=M, cocon_cycle_steps=STEPS, cocon_cycle_start=0, cocon_adv_start=0,
                      cocon_cycle_sentences=B, cocon_disc_dim=4), **flags)  # fmt: skip
    crit = CoConCriterion(task, **flags)
    g = torch.Generator().manual_seed(5)
    model = model.double()
    with torch.no_grad():
        for scale, params in ((0.5, model.parameters()), (1.0, crit.parameters())):
            for p in params:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    assert all(p.abs().min() > 0 for p in [*model.parameters(), *crit.parameters()])
    crit.discriminator.discriminator.dropout = 0.0  # 0.5 (the authors') draws random masks
    model.train()
    x = torch.randint(4, len(model.decoder.lm.dictionary), (B, T), generator=g)  # the LM's words
    prev = torch.cat([torch.full((B, 1), task.target_dictionary.eos()), x[:, :-1]], dim=1)
    net_input = {"src_tokens": x, "src_lengths": torch.full((B,), T), "prev_output_tokens": prev}
    sample = {"id": torch.arange(B), "nsentences": B, "ntokens": B * T, "target": x, "net_input": net_input}
    return model, crit, sample


# -- the reference ---------------------------------------------------------------------------------------------------


def authors_layout(t):
    """Block tensors by the package's parameter names (weights or their gradients) in the authors' fused layout, as a
    flat list: ln_1, c_attn, ref_source_attn (the content's K/V), c_proj, ln_2, c_fc, mlp_c_proj, weight then bias."""

    def conv1d(*names):  # GPT-2's Conv1D: W of shape (in, out), the maps side by side
        return [torch.cat([t[f"{n}.weight"].t() for n in names], 1), torch.cat([t[f"{n}.bias"] for n in names])]

    def ln(name):
        return [t[f"{name}.weight"], t[f"{name}.bias"]]

    return [*ln("attn_layer_norm"), *conv1d("attn.q_proj", "attn.k_proj", "attn.v_proj"),
            *conv1d("attn.content_k_proj", "attn.content_v_proj"), *conv1d("attn.out_proj"), *ln("ffn_layer_norm"),
            *conv1d("fc1"), *conv1d("fc2")]  # fmt: skip


NAMES = ["ln_1", "c_attn", "ref_source_attn", "c_proj", "ln_2", "c_fc", "mlp_c_proj"]
CONTENT_KV = [4, 5]  # the indices of ref_source_attn's weight and bias


def leaves(model, crit):
    """The block's weights as fresh leaves in the authors' layout (by name, and as a list), and the discriminator's
    (float64)."""
    params = {n: p.detach() for n, p in model.decoder.block.named_parameters()}
    w = [a.clone().requires_grad_() for a in authors_layout(params)]
    disc = crit.discriminator.discriminator
    dw = {n: p.detach().double().clone().requires_grad_() for n, p in disc.named_parameters()}
    return {k: (w[2 * i], w[2 * i + 1]) for i, k in enumerate(NAMES)}, w, dw


def reference(model, w, dw, sample, interval=1):
    """The authors' losses (module docstring) on a batch: L_self, L_null, L_cycle and L_adv (with a graph to the
    block's leaves ``w``) and L_disc (on detached states, with a graph to the discriminator's leaves ``dw``).
    ``interval``: their ``--train_cycle_detach_interval`` (0: never detach)."""
    dec = model.decoder
    heads = dec.block.attn.num_heads
    eos, unk = dec.lm.dictionary.eos(), dec.lm.dictionary.unk()
    E = dec.lm.embed_tokens.weight
    x, prev = sample["target"], sample["net_input"]["prev_output_tokens"]
    n = x.size(0)

    def lower(tokens, embeddings=None):  # n x L x C, the LM's layers below the block
        return dec.lower(tokens, token_embeddings=embeddings)[0].transpose(0, 1)

    def logits(history, out):  # the upper layers on [the LM's states before the history's last; the block's]
        return dec.lm_logits(dec.upper(torch.cat([history[:, :-1], out], 1).transpose(0, 1)))

    def block(history, text, content, **mask):
        return ref_block(w, history, text, content, heads, act=F.relu, **mask)

    eos_col = torch.full((n, 1), eos)
    h = lower(prev)  # </s> x_0 .. x_4 (the frozen LM: no graph)
    history, text = h[:, : P + 1], h[:, P + 1 : P + M]  # </s> x^a, and x^b but its last token
    content = lower(torch.cat([eos_col, x[:, P : P + M]], 1))[:, 1:]

    def nll(out):  # the token mean over x^b (GPT-2's CrossEntropyLoss)
        return F.cross_entropy(logits(history, out)[:, P:].reshape(n * M, -1), x[:, P : P + M].reshape(-1))

    losses = {"self": nll(block(history, text, content, self_token_mask=True)), "null": nll(block(history, text, None))}
    # the cycle: q^1 from the other sample's history with content x^b, each step on everything so far
    other = torch.roll(torch.arange(n), 1)
    o_tokens, o_history = prev[other, : P + 1], h[other, : P + 1]
    embeds, fed, fake, ys = E[o_tokens], [], [], []
    for s in range(STEPS):
        out = block(o_history, torch.cat(fed, 1) if fed else None, content)
        ys.append(torch.softmax(logits(o_history, out)[:, -1], dim=-1))
        embeds = torch.cat([embeds, (ys[-1] @ E)[:, None]], 1)
        next_h = lower(torch.cat([o_tokens, torch.full((n, s + 1), unk)], 1), embeds)[:, -1:]
        fake.append(next_h)
        fed.append(next_h.detach() if interval and s % interval == 0 else next_h)
    soft = torch.cat([E[eos_col], torch.stack(ys, 1) @ E], 1)
    q1 = lower(torch.cat([eos_col, torch.full((n, STEPS), unk)], 1), soft)[:, 1:]
    losses["cycle"] = nll(block(history, text, q1))
    # the adversarial pair: real = the states of x^b's tokens (positions P + 1 .. P + M of </s> x)
    fake = torch.cat(fake, 1)
    real_states = h[:, P + 1 : P + M + 1]

    def disc(weights, seq):
        convs = [(weights[f"convs.{i}.weight"], weights[f"convs.{i}.bias"]) for i in range(3)]
        return torch.stack([ref_discriminator(convs, weights["out.weight"][0], s, [True] * s.size(0)) for s in seq])

    losses["adv"] = F.logsigmoid(-disc({k: v.detach() for k, v in dw.items()}, fake)).mean()  # log(1 - sigmoid)
    z_real, z_fake = disc(dw, real_states.detach()), disc(dw, fake.detach())
    losses["disc"] = (-F.logsigmoid(z_real) - F.logsigmoid(-z_fake)).mean()
    return losses


def reference_grads(model, crit, sample, **kwargs):
    """The gradient of each reference loss: of the four w.r.t. the block's leaves (the authors' layout), of L_disc
    w.r.t. the discriminator's weights; and the losses' values."""
    named, w, dw = leaves(model, crit)
    losses = reference(model, named, dw, sample, **kwargs)
    grads = {k: torch.autograd.grad(losses[k], w, allow_unused=True, retain_graph=True) for k in LOSSES}
    grads = {k: [torch.zeros_like(a) if g is None else g for g, a in zip(v, w)] for k, v in grads.items()}
    grads["disc"] = list(torch.autograd.grad(losses["disc"], list(dw.values())))
    return grads, {k: float(v) for k, v in losses.items()}


# -- the package's side ------------------------------------------------------------------------------------------


def package_grads(model, crit, sample, weights):
    """The gradient of the criterion's loss with (w_self, w_null, w_cycle, w_adv) = ``weights`` w.r.t. the block, in
    the authors' layout and divided by the sample size (fairseq's normalization: then the authors' means), and the
    logging output."""
    crit.w_self, crit.w_null, crit.w_cycle, crit.w_adv = weights
    model.zero_grad()
    loss, sample_size, log = crit(model, sample)
    loss.backward()
    assert all(p.grad is None for p in model.decoder.lm.parameters())  # the frozen LM gets nothing
    assert all(p.grad is None for p in crit.parameters())  # nor the discriminator, from the block's loss
    g = {n: (torch.zeros_like(p) if p.grad is None else p.grad) / sample_size
         for n, p in model.decoder.block.named_parameters()}  # fmt: skip
    return authors_layout(g), log


def off_by(got, want):
    """The largest entry of got - want, relative to the largest entry of want."""
    return max(float((a.double() - b).abs().max()) for a, b in zip(got, want)) / max(float(b.abs().max()) for b in want)


def assert_close(got, want, rtol, what):
    assert off_by(got, want) <= rtol, f"{what}: off by {off_by(got, want):.3g} of the largest entry"


def test_each_loss_reaches_the_block_as_the_authors(lm_dir):
    """Update 0, detach interval 1. The gradient of each of L_self, L_null, L_cycle and L_adv w.r.t. the block
    (weights one at a time) equals the reference's, signs included, and reaches every block weight, except that
    L_null reaches no content key/value map. None reaches the frozen LM or the discriminator. With all four on, the
    block's gradient is their sum (L_disc is not in the block's loss), and the discriminator's pending gradient is
    the reference's ∇L_disc (L_adv is not in it). L_adv has the minimax form: log(1 - sigmoid(D(fake))) < 0, at the
    reference's value."""
    model, crit, sample = build(lm_dir)
    crit.begin_update(0)
    want, values = reference_grads(model, crit, sample)
    for loss, weights in LOSSES.items():
        got, log = package_grads(model, crit, sample, weights)
        assert_close(got, want[loss], RTOL[loss], f"∇L_{loss}")
        reached = [i for i, g in enumerate(got) if g.abs().max() > 0]
        assert reached == [i for i in range(len(got)) if loss != "null" or i not in CONTENT_KV], loss
        assert loss != "null" or all(want[loss][i].abs().max() == 0 for i in CONTENT_KV)
    # all four at once, and the discriminator's gradient from this batch alone
    crit.discriminator.begin_update()
    total, log = package_grads(model, crit, sample, (1, 1, 1, 1))
    assert_close(total, [sum(want[k][i] for k in LOSSES) for i in range(len(total))], RTOL["self"], "∇ of the sum")
    assert_close(crit.discriminator._grads, want["disc"], RTOL["disc"], "∇L_disc")
    for key, size in (("self", "sample_size"), ("null", "sample_size"), ("cycle", "ntokens_cycle")):  # sums
        assert float(log[f"loss_{key}"]) / float(log[size]) == pytest.approx(values[key], rel=1e-5), key
    assert values["adv"] < 0 and float(log["loss_adv"]) / B == pytest.approx(values["adv"], rel=1e-5)
    assert float(log["loss_disc"]) / B == pytest.approx(values["disc"], rel=1e-5)


@pytest.mark.parametrize(
    "interval",
    [1, 0, 2],
)
def test_the_fed_back_state_is_detached_as_the_authors(lm_dir, interval):
    """--cocon-cycle-detach-interval 1 (the default): the gradient of L_cycle and of L_adv does not flow through the
    lower-layer states fed back into the block to earlier generation steps; 0: it does. Each gradient equals the
    reference's with the same interval, and the reference's with the other differs by more than 100x the tolerance."""
    model, crit, sample = build(lm_dir, cocon_cycle_detach_interval=interval)
    crit.begin_update(0)
    want, _ = reference_grads(model, crit, sample, interval=interval)
    other, _ = reference_grads(model, crit, sample, interval=0 if interval else 1)
    for loss in ("cycle", "adv"):
        assert off_by(other[loss], want[loss]) > 100 * RTOL[loss], loss
        got, _ = package_grads(model, crit, sample, LOSSES[loss])
        assert_close(got, want[loss], RTOL[loss], f"∇L_{loss}, interval {interval}")


def adamw(theta, grads, state, lr):
    """One AdamW step (betas 0.9/0.999, eps 1e-8, weight decay 0) on the gradient clipped to norm 1.0, as torch's
    ``clip_grad_norm_`` and ``AdamW`` compute them; ``state`` keeps the moments and the step count."""
    norm = float(torch.cat([g.reshape(-1) for g in grads]).norm())
    k = state["k"] = state.get("k", 0) + 1
    out = []
    for i, (p, g) in enumerate(zip(theta, grads)):
        g = g * min(1.0, 1.0 / (norm + 1e-6))
        m = state[f"m{i}"] = 0.9 * state.get(f"m{i}", 0) + 0.1 * g
        v = state[f"v{i}"] = 0.999 * state.get(f"v{i}", 0) + 0.001 * g * g
        out.append(p - lr / (1 - 0.9**k) * m / (v.sqrt() / math.sqrt(1 - 0.999**k) + 1e-8))
    return out


def test_the_discriminator_learns_every_fifth_update_with_its_own_adamw(lm_dir):
    """Updates 0..6 as the cocon_generation task drives them: begin_update, the criterion, the backward of the
    block's loss, a plain SGD step of the block, then step_discriminator. The discriminator's weights change at
    updates 0 and 5 only, each time by one AdamW step on the reference's ∇L_disc of that update (the mean over the
    sentences of BCE(D(real), 1) + BCE(D(fake), 0), at that update's weights), clipped to norm 1 (its norm is above
    1 at both). The block changes at every update."""
    model, crit, sample = build(lm_dir)
    block = model.decoder.block
    sgd = torch.optim.SGD(block.parameters(), lr=0.1)
    disc = list(crit.discriminator.discriminator.parameters())
    state, largest = {}, None
    for update in range(7):
        learns = update % 5 == 0
        before, block_before = [p.double().clone() for p in disc], [p.detach().clone() for p in block.parameters()]
        if learns:
            g = reference_grads(model, crit, sample)[0]["disc"]
            assert torch.cat([a.reshape(-1) for a in g]).norm() > 1.1  # the clip acts
            want = adamw(before, g, state, LR_DISC)
            largest = [a.abs() for a in g] if largest is None else [torch.maximum(a.abs(), b) for a, b in zip(g, largest)]
        crit.begin_update(update)
        loss, sample_size, _ = crit(model, sample)
        sgd.zero_grad()
        (loss / sample_size).backward()
        sgd.step()
        assert crit.step_discriminator(LR_DISC) == learns, update
        assert all(not torch.equal(a, b) for a, b in zip(block_before, block.parameters())), update
        after = [p.double() for p in disc]
        if not learns:
            assert all(torch.equal(a, b) for a, b in zip(after, before)), update
            continue
        # Adam divides by |g|: an entry's step is determined up to lr x (the noise of the package's float32 gradient,
        # within 1e-5 of its largest entry) / |g| of that entry; and float32 weights to 1e-6
        scale = max(float(a.max()) for a in largest)
        for a, b, w, gmax in zip(after, before, want, largest):
            assert (a != b).all(), update
            tol = 1e-6 + LR_DISC * 1e-5 * scale / gmax
            assert ((a - w).abs() <= tol).all(), (update, float((a - w).abs().max()))
    assert state["k"] == 2


def test_the_real_side_is_the_states_of_the_content_tokens(lm_dir):
    """The discriminator's real sequences are the LM's states of x^b's own tokens (``traininfer_cocon.py`` l. 508,
    801: ``hidden_states[:, hs_len:hs_len + tis_len]``, the states of ``inputs[:, hs_len:hs_len + tis_len]``), as its
    fake ones are the states of the generated tokens."""
    model, crit, sample = build(lm_dir)
    crit.begin_update(0)
    want, _ = reference_grads(model, crit, sample)
    crit.discriminator.begin_update()
    package_grads(model, crit, sample, (1, 1, 1, 1))
    assert_close(crit.discriminator._grads, want["disc"], RTOL["disc"], "∇L_disc")


def test_the_adversarial_loss_is_a_mean_over_the_cycle_sentences(lm_dir):
    """With a batch larger than --cocon-cycle-sentences, L_adv still weighs as a mean over the sentences it is
    computed on (the authors' ``lambda_adv * (-d_fake_loss - d_real_loss)``, BCE means over the cycle's batch, l.
    821), as L_cycle weighs as a mean over its tokens and L_disc over its sentences: the package's gradient of L_adv,
    divided by the sample size, is that of the mean of log(1 - sigmoid(D(fake))) over the batch's first two
    sentences (the cycle pairs them with each other)."""
    model, crit, sample = build(lm_dir, cocon_cycle_sentences=2)
    crit.begin_update(0)
    two = {"target": sample["target"][:2], "net_input": {k: v[:2] for k, v in sample["net_input"].items()}}
    want, _ = reference_grads(model, crit, two)
    got, _ = package_grads(model, crit, sample, LOSSES["adv"])
    assert_close(got, want["adv"], RTOL["adv"], "∇L_adv over the cycle's sentences")
