"""CoCon against an independent reference (issue 38): the block, its attention and the discriminator written
here in plain PyTorch, and the four losses on a 3-token example by hand.

The reference follows the paper ("CoCon: A Self-Supervised Approach for Controlled Text Generation", Section 3,
Eq. 5-7: K' = [K^(c); K], V' = [V^(c); V], A = softmax(W) V', h'_i = FF(a_i); tau biases W_{:,:l_c}) and the
authors' description of their block (alvinchangw/COCON_ICLR2021, ``transformers/modeling_gpt2.py``,
``CoconBlock`` / ``CoconAttention`` / ``HDiscriminator``; read, not copied):

- GPT-2's Conv1D convention: ``y = x W + b``, W of shape (in, out); the text's Q, K, V from one fused map
  (``c_attn``) of the LayerNorm'd text, the content's K, V from one fused map of their own
  (``ref_source_attn``) of the raw content states (no LayerNorm);
- layer order: LN_1 -> attention over [content keys/values; text keys/values] -> residual -> LN_2 -> MLP
  (4d, gelu_new) -> residual;
- logits scaled by 1/sqrt(d_head); the causal mask over the concatenated keys (query i sees every content
  column and the text keys 0..i); masked logits set to -1e4 (GPT-2's way);
- the self-token mask (``--self_token_mask_prob 1``): ones with a zero diagonal, shifted by the history's
  length - 1 over the concatenated keys, so the query predicting content token j does not see column j;
- tau (``context_attn_bias``): added to the logits of each content's columns, one value per content;
- the block gets the history (x^a, or the prompt) and the rest of the text, and returns the states from the
  history's last position on (before it, their model feeds the LM's own states to the upper layers);
- the discriminator: 1-D convolutions of widths 1, 2, 3 over the positions, each max-pooled, LeakyReLU (0.01),
  dropout, a linear map without bias to one logit; the generator's loss ``-(d_fake_loss + d_real_loss)``, whose
  only term with a gradient into CoCon is log(1 - sigmoid(D(fake))) (minimax).

The reference functions below use torch only; the package's modules are imported for the comparisons. Where the
package differs from the authors by design, the comparison leaves it out (each place says why):

- dropout: the package drops out the attention weights, both residual branches and the FFN's activation (the
  authors: the attention weights, after the attention's output map and after the MLP); both are compared in
  eval mode, as functions;
- the authors' learned ``sos_h`` start state, used when the block gets no history: the package always has one
  (decoding starts from the LM's state of ``</s>``), so the reference is always given a history;
- before the history's last position the authors' block output is dropped (their upper layers read the LM's own
  states there, Eq. 7, as the package's default ``--cocon-prefix-states lm`` does: checked through the decoder and
  the losses below): block outputs are compared from the history's last position on;
- the authors' shifted diagonal runs on past the content into the text keys (a query past the content, their
  last and unscored position, loses text key p - t - l_c); the package hides content columns only. Those
  queries are left out (and shown to differ);
- padding: the authors' contents in a batch have one length; the package pads: compared row by row with each
  row's unpadded content;
- the content states themselves (the authors run the LM on the content alone, the package after ``</s>``) are
  outside the block: both get the same states;
- masked logits: -1e4 (the authors') against -inf (the package's): in float64 both weigh exactly 0;
- the activation: the package's block uses the LM's (GPT-2's own gelu_new for a converted GPT-2); the block alone is
  built here with fairseq's ``gelu_accurate`` (= gelu_new), the decoder test passes the tiny LM's relu to the
  reference.
"""

import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from helpers import build_task_and_model, write_binarized

from fairseq_knowgen.criterions.cocon import CoConCriterion, CoConCriterionConfig
from fairseq_knowgen.models.cocon import default_cocon_layer
from fairseq_knowgen.modules.cocon_block import CoConBlock
from fairseq_knowgen.modules.cocon_discriminator import ConvDiscriminator

# -- the reference (torch only) ----------------------------------------------------------------------------------


def conv1d(x, w, b):
    """GPT-2's Conv1D: x W + b with W of shape (in, out)."""
    return x @ w + b


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * g + b


def gelu_new(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def split_heads(x, n_head):
    """N x L x d -> N x H x L x d_head."""
    N, L, d = x.shape
    return x.view(N, L, n_head, d // n_head).permute(0, 2, 1, 3)


def ref_attention(w, x, content, n_head, history_len, self_token_mask=False, taus=None, lengths=None):
    """The authors' CoconAttention: ``x`` N x L x d (the LayerNorm'd [history; text]), ``content`` N x S x d (raw
    content states, several contents concatenated: ``lengths``, tau of each in ``taus``) or None."""
    N, L, d = x.shape
    q, k, v = conv1d(x, *w["c_attn"]).split(d, dim=2)
    S = 0
    if content is not None:
        S = content.size(1)
        kc, vc = conv1d(content, *w["ref_source_attn"]).split(d, dim=2)
        k, v = torch.cat([kc, k], dim=1), torch.cat([vc, v], dim=1)
    q, k, v = (split_heads(t, n_head) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(d // n_head)  # N x H x L x (S + L)
    nd, ns = L, S + L
    causal = torch.tril(torch.ones(ns, ns, dtype=x.dtype))[ns - nd : ns, :ns]
    logits = logits * causal - 1e4 * (1 - causal)
    if self_token_mask and content is not None:
        offset = max(history_len - 1, 0)
        diagonal_free = 1 - torch.eye(offset + ns, dtype=x.dtype)
        m = diagonal_free[:nd, offset : offset + ns]
        logits = logits * m - 1e4 * (1 - m)
    if taus is not None:
        start = 0
        for tau, n in zip(taus, lengths):
            bias = torch.zeros(ns, dtype=x.dtype)
            bias[start : start + n] = tau
            logits = logits + bias
            start += n
    a = torch.softmax(logits, dim=-1) @ v  # N x H x L x d_head
    return conv1d(a.permute(0, 2, 1, 3).reshape(N, L, d), *w["c_proj"])


def ref_block(w, history, x, content, n_head, act=gelu_new, **attn):
    """The authors' CoconBlock given a history (N x H x d) and the text after it (N x L x d, or None): the states
    from the history's last position on."""
    inp = history if x is None else torch.cat([history, x], dim=1)
    H = history.size(1)
    h = inp + ref_attention(w, layer_norm(inp, *w["ln_1"]), content, n_head, H, **attn)
    if H > 1:
        h = h[:, H - 1 :]
    return h + conv1d(act(conv1d(layer_norm(h, *w["ln_2"]), *w["c_fc"])), *w["mlp_c_proj"])


def ref_discriminator(convs, out_weight, x, valid):
    """The authors' HDiscriminator on one sequence ``x`` (L x C) with its windows inside the ``valid`` positions
    (the authors' have no padding; a width with no such window gives 0), dropout off: convolutions as sums over
    the window's positions, max over the windows, LeakyReLU (0.01), a linear map without bias."""
    feats = []
    for weight, bias in convs:  # weight: channels x C x width
        width = weight.size(2)
        windows = [
            bias + sum(weight[:, :, k] @ x[i + k] for k in range(width))
            for i in range(x.size(0) - width + 1)
            if all(valid[i : i + width])
        ]
        pooled = torch.stack(windows).max(0).values if windows else torch.zeros(weight.size(0), dtype=x.dtype)
        feats.append(torch.where(pooled > 0, pooled, 0.01 * pooled))
    return out_weight @ torch.cat(feats)


# -- the package's weights in the authors' layout ----------------------------------------------------------------


def authors_weights(block):
    """The package block's weights as the authors' (fused Conv1D maps)."""
    a = block.attn

    def t(lin):
        return lin.weight.detach().t()

    def fused(*lins):
        return torch.cat([t(x) for x in lins], dim=1), torch.cat([x.bias.detach() for x in lins])

    def ln(m):
        return m.weight.detach(), m.bias.detach()

    return {
        "ln_1": ln(block.attn_layer_norm),
        "c_attn": fused(a.q_proj, a.k_proj, a.v_proj),
        "ref_source_attn": fused(a.content_k_proj, a.content_v_proj),
        "c_proj": fused(a.out_proj),
        "ln_2": ln(block.ffn_layer_norm),
        "c_fc": fused(block.fc1),
        "mlp_c_proj": fused(block.fc2),
    }


def random_block(d=8, heads=2, seed=0):
    """The package's default block (separate content K/V, no W'), float64, eval mode (dropout off), every weight
    random and non-zero."""
    torch.manual_seed(seed)
    block = CoConBlock(d, heads, 4 * d, activation="gelu_accurate").double().eval()
    assert not hasattr(block.attn, "content_prev_k_proj") and block.attn.content_kv_mode == "separate"
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    assert all(p.abs().min() > 0 for p in block.parameters())
    return block


def test_training_call_with_the_aligned_mask_equals_the_authors_block():
    """The self-reconstruction call as the criterion makes it (its splits, its content and aligned mask, the
    content's states standing in for the LM's) against the authors' block with their self-token mask, row by row:
    the history is the text up to the split (``</s> x_1 .. x_t``: t + 1 positions), the content x^b. Every
    query from the history's last one to the content's end (the scored ones) agrees within 1e-6."""
    d, heads, T = 8, 2, 9
    block = random_block(d, heads)
    w = authors_weights(block)
    d_ = Dictionary()
    for i in range(20):
        d_.add_symbol(f"w{i}")
    # P + C = 8 < T: with the split's jitter the content ends at T - 1, one query after it
    crit = CoConCriterion(SimpleNamespace(target_dictionary=d_), cocon_prefix_len=3, cocon_content_len=5,
                          cocon_len_jitter=2, cocon_min_content=1, cocon_adv_weight=0)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    B = 6
    target = torch.randint(d_.nspecial, len(d_), (B, T), generator=g)  # a window: no </s>, no padding
    n_words = torch.full((B,), T)
    t, m, loss_mask = crit.draw_splits(n_words, T, g)
    assert len(set(t.tolist())) > 1  # several splits in the batch
    table = torch.randn(len(d_), d, generator=g).double()
    stub = SimpleNamespace(encode_content_tensor=lambda c: (table[c].transpose(0, 1), c.eq(d_.pad())))
    content, states, cpad, qmask = crit.self_content(stub, target, t, m)
    assert cpad.any()  # contents of several lengths: the package pads them
    h = torch.randn(T, B, d, generator=g).double()  # the LM's lower states of </s> x_1 .. x_{T-1}
    with torch.no_grad():
        got, _ = block(h, states, cpad, None, content_attn_mask=qmask)
        for b in range(B):
            tb, mb = int(t[b]), int(m[b])
            assert loss_mask[b].nonzero().flatten().tolist() == list(range(tb, tb + mb))
            ref = ref_block(w, h[None, : tb + 1, b], h[None, tb + 1 :, b], states[None, :mb, b], heads,
                            self_token_mask=True)[0]  # fmt: skip
            assert ref.shape == (T - tb, d)
            assert torch.allclose(got[tb : tb + mb, b], ref[:mb], atol=1e-6, rtol=0), b
            if tb + mb < T:  # past the content the authors' diagonal hides a text key; the package nothing
                assert not torch.allclose(got[tb + mb :, b], ref[mb:], atol=1e-3)
    # the mask is the reference's: without it the outputs differ
    with torch.no_grad():
        unmasked, _ = block(h, states, cpad, None)
    assert not torch.allclose(unmasked, got, atol=1e-3)


@pytest.mark.parametrize("history", [1, 3])
def test_incremental_decoding_equals_the_authors_block_on_the_full_sequence(history):
    """Decoding as fairseq's search runs it (first call with the history, then one step at a time, the content's
    keys cached once per input in the beam layout, a beam reorder on the way) against the authors' block run
    again on the whole sequence at each step, as their generation does: two inputs (one with two contents of tau
    2 and -1, one with a single, shorter content of tau 2), two rows each. From the history's last position on,
    within 1e-6."""
    d, heads, T = 8, 2, history + 5
    block = random_block(d, heads, seed=1)
    w = authors_weights(block)
    g = torch.Generator().manual_seed(2)
    lengths = [[2, 3], [4]]
    taus = [[2.0, -1.0], [2.0]]
    S = 5
    content = torch.randn(S, 2, d, generator=g).double()
    cpad = torch.tensor([[False] * 5, [False] * 4 + [True]])
    bias = torch.tensor([[2.0, 2.0, -1.0, -1.0, -1.0], [2.0] * 5]).double()
    rows = torch.tensor([0, 0, 1, 1])
    h = torch.randn(T, 4, d, generator=g).double()
    reorder_at, new_order = history + 2, torch.tensor([1, 1, 3, 3])  # within each input's rows: 0 <- 1, 2 <- 3
    state, outs = {}, []
    with torch.no_grad():
        first, _ = block(h[:history], content, cpad, bias, incremental_state=state, content_rows=rows)
        outs.append(first[-1])
        for s in range(history, T):
            if s == reorder_at:
                block.attn.reorder_incremental_state(state, new_order)
            outs.append(block(h[s : s + 1], incremental_state=state)[0][0])
    got = torch.stack(outs)  # (T - history + 1) x 4 x d: positions history - 1 .. T - 1
    for r in range(4):
        # the text row r has seen: its own before the reorder; after it, the row it took over, then its own steps
        after = torch.cat([h[:reorder_at, int(new_order[r])], h[reorder_at:, r]])
        i = int(rows[r])
        c = content[: sum(lengths[i]), i][None]
        for s in range(history, T + 1):  # the reference at each step on everything so far: output position s - 1
            seq = h[:, r] if s - 1 < reorder_at else after
            ref = ref_block(w, seq[None, :history], seq[None, history:s] if s > history else None, c, heads,
                            taus=taus[i], lengths=lengths[i])[0]  # fmt: skip
            assert torch.allclose(got[s - history, r], ref[-1], atol=1e-6, rtol=0), (r, s)


def test_the_cnn_discriminator_is_the_authors_and_ignores_padded_windows():
    """ConvDiscriminator (the default, eval mode: dropout off) against the reference; a window that touches
    padding is left out of the max (changing padded states changes nothing), a row equals itself unpadded, and a
    width longer than a row's real positions gives a 0 feature."""
    torch.manual_seed(3)
    disc = ConvDiscriminator(6, 5).double().eval()
    with torch.no_grad():
        for p in disc.parameters():
            p.copy_(torch.randn_like(p))
    x = torch.randn(3, 6, 6).double()
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
    got = disc(x, pad)
    convs = [(c.weight.detach(), c.bias.detach()) for c in disc.convs]
    assert [c.kernel_size[0] for c in disc.convs] == [1, 2, 3] and disc.out.bias is None and disc.dropout == 0.5
    for b in range(3):
        want = ref_discriminator(convs, disc.out.weight.detach()[0], x[b], (~pad[b]).tolist())
        assert torch.allclose(got[b], want, atol=1e-10), b
        n = int((~pad[b]).sum())
        assert torch.allclose(got[b], disc(x[b : b + 1, :n])[0], atol=1e-12)  # the row alone, unpadded
    changed = x.clone()
    changed[pad] = torch.randn(int(pad.sum()), 6).double() * 10
    assert torch.equal(disc(changed, pad), got)


# -- the four losses by hand ----------------------------------------------------------------------------------------

WORDS = "a b c d e f".split()


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A 6-word vocabulary, lines of running text (windows need 30 tokens) and an untrained 1-layer, 8-wide
    transformer_lm on them."""
    from fairseq_knowgen.prep.cocon import save_untrained_lm

    data = tmp_path_factory.mktemp("cocon3tok")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(34)) for _ in range(4)]
    write_binarized(data, {"train": lines, "valid": lines}, words=WORDS)
    save_untrained_lm(str(data), str(data / "lm.pt"), layers=1, dim=8, heads=2)
    return data, data / "lm.pt"


def test_defaults_are_the_authors(tiny_lm):
    """`--arch cocon_lm` with no other flag: the authors' block (no W', separate content K/V, zero biases, dropout
    0.1 on the attention and the residual branches) after round(7/24 x layers) LM layers, the LM's own states
    before the prefix's last token (Eq. 7), their CNN discriminator, their losses and schedule, 30-token windows,
    decoding without a fixed length. The start: Xavier (the paper is silent; measured better than the authors'
    N(0, 0.02^2) on the toy copy task, docs/methods/cocon.md), N(0, 0.02^2) with --cocon-init normal."""
    data, lm = tiny_lm
    task, model, _ = build_task_and_model(data, "cocon_lm", "--cocon-lm-path", lm, task="cocon_generation")
    block = model.decoder.block
    assert model.args.cocon_layer == model.decoder.split == 1 == default_cocon_layer(1)
    assert [default_cocon_layer(n) for n in (2, 4, 12, 24)] == [1, 1, 4, 7]
    assert not hasattr(block.attn, "content_prev_k_proj") and block.attn.content_kv_mode == "separate"
    assert block.attn.dropout == 0.1 and block.dropout == 0.1
    assert model.args.cocon_prefix_states == model.decoder.prefix_states == "lm"
    lins = (block.attn.q_proj, block.attn.content_k_proj, block.attn.out_proj)
    assert model.args.cocon_init == "xavier" and all(float(lin.weight.std()) > 0.1 for lin in lins)
    assert all(lin.bias.abs().max() == 0 for lin in lins)
    _, normal, _ = build_task_and_model(
        data, "cocon_lm", "--cocon-lm-path", lm, "--cocon-init", "normal", task="cocon_generation"
    )
    b = normal.decoder.block
    for lin in (b.attn.q_proj, b.attn.content_k_proj, b.attn.out_proj, b.fc1, b.fc2):
        assert 0.01 < float(lin.weight.std()) < 0.03 and lin.bias.abs().max() == 0
    cfg = CoConCriterionConfig()
    assert (cfg.cocon_adv_loss, cfg.cocon_split, cfg.cocon_self_mask) == ("minimax", "fixed", "aligned")
    assert (cfg.cocon_prefix_len, cfg.cocon_content_len, cfg.cocon_len_jitter) == (10, 20, 2)
    assert (cfg.cocon_cycle_start, cfg.cocon_adv_start, cfg.cocon_cycle_steps, cfg.cocon_disc_update_freq) == (
        2000, 2000, 20, 5,
    )  # fmt: skip
    crit = CoConCriterion(task)
    assert (crit.adv_loss, crit.split, crit.self_mask) == ("minimax", "fixed", "aligned")
    disc = crit.discriminator.discriminator
    assert isinstance(disc, ConvDiscriminator) and [c.out_channels for c in disc.convs] == [128] * 3
    assert crit.cycle_detach_interval == 1  # the authors' --train_cycle_detach_interval
    assert crit.adv_fake == "text"  # the authors' --adv_use_th_gen_output (their train_cocon.sh: the block's states)
    assert (task.cfg.cocon_sample_mode, task.cfg.cocon_window, task.cfg.cocon_fixed_len) == ("window", 30, 0)


def test_decoding_from_a_prompt_equals_the_authors_model(tiny_lm):
    """The decoder (Eq. 7 as the authors: the upper layers read the LM's own states before the prompt's last
    token and the block's from there on) step by step as fairseq's search calls it, and on the whole prefix,
    against the LM's parts with the reference block, float64 (but the softmaxes), every weight random: prompts of 2
    and 3 tokens, two contents with tau 2 and -1 in one row. The block sits before the 1-layer LM's only layer
    (``--cocon-layer 0``), so that the upper layer reads every position."""
    from helpers import decode_full_and_stepwise

    data, lm = tiny_lm
    task, model, _ = build_task_and_model(data, "cocon_lm", "--cocon-lm-path", lm, "--cocon-layer", "0",
                                          task="cocon_generation")  # fmt: skip
    model = model.double().eval()
    torch.manual_seed(9)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    dec, d = model.decoder, task.target_dictionary
    assert dec.block.activation_fn is F.relu  # the LM's (fairseq's transformer_lm default)
    w = authors_weights(dec.block)
    ids = [[d.index(x) for x in line.split()] for line in ("a b <sep> c d e", "f a c <sep>")]
    src = torch.tensor([ids[0], ids[1] + [d.pad()] * 2])
    prompt_lengths = torch.tensor([2, 3])
    prev = torch.tensor([[d.eos()] + [d.index(x) for x in "d f b e c".split()],
                         [d.eos()] + [d.index(x) for x in "e e a d b".split()]])  # fmt: skip
    enc = model.encoder(src, content_tau=torch.tensor([2.0, -1.0]), prompt_lengths=prompt_lengths)
    full, steps = decode_full_and_stepwise(model, enc, prev)
    V = dec.lm_vocab
    contents = [(5, [2.0, -1.0], [2, 3]), (3, [2.0], [3])]  # (columns, tau per content, content lengths)
    with torch.no_grad():
        for b in range(2):
            k = int(prompt_lengths[b])
            S, taus, lengths = contents[b]
            content = enc["content"][0][:S, b][None]
            for pos in range(k, prev.size(1)):  # from the prompt's last token on
                h = dec.lower(prev[b : b + 1, : pos + 1])[0]  # (pos + 1) x 1 x C, the LM's own states
                out = ref_block(w, h[None, : k + 1, 0], h[None, k + 1 :, 0] if pos > k else None, content, 2,
                                act=F.relu, taus=taus, lengths=lengths)[0]  # fmt: skip
                upper_in = torch.cat([h[:k, 0], out])[:, None]  # [h_{:t-2}; h'_{t-1}]
                want = dec.lm_logits(dec.upper(upper_in))[0, -1]
                # (fairseq's attention and the block take their softmax in float32: 1e-5 on logits of size ~10)
                for got in (steps[pos][0][b, 0, :V], full[0][b, pos, :V]):
                    assert torch.allclose(got, want, atol=1e-5, rtol=0), (b, pos, float((got - want).abs().max()))


@pytest.mark.parametrize("fake_side", ["text", "block"])
def test_the_four_losses_on_a_three_token_example_by_hand(tiny_lm, fake_side):
    """Two 3-token windows x = abc, x' = def (the cycle pairs each with the other), every weight random and
    non-zero, prefix 1 and content 2 (no jitter), 2 cycle steps, every loss on, the default CNN discriminator and
    minimax loss; the block before the 1-layer LM's only layer (``--cocon-layer 0``), so that the upper layer reads
    every position: Eq. 7's [h_{:t-2}; h'_{t-1}] (the LM's own state at </s>, the block's from x^a's last token on)
    matters. Each loss is assembled here from the model's parts (the LM's lower and upper layers, the block) with
    loops and log-softmaxes of its logits, and compared with the criterion's logging outputs:

    - L_self = -sum_b sum_{p=1,2} log p(x_p | c = x_1 x_2, column p - 1 hidden);
    - L_null = the same without content;
    - L_cycle: q^1 = 2 soft tokens generated from </s> x'_0 with c = x_1 x_2 (each step recomputed on the whole
      sequence of soft embeddings), then -sum_{p=1,2} log p(x_p | c = q^1, no mask);
    - L_adv = sum_b log(1 - sigmoid(D(fake_b))), fake = the LM's lower states of the generated q^1 after p'
      (``text``, the default) or the block's states that generated q^1 (``block``);
      L_disc = sum_b -log sigmoid(D(real_b)) - log(1 - sigmoid(D(fake_b))), real = the LM's lower states of x^b's
      tokens.
    """
    data, lm = tiny_lm
    task, model, _ = build_task_and_model(
        data, "cocon_lm", "--cocon-lm-path", lm, "--cocon-layer", "0", "--cocon-dropout", "0",
        "--cocon-attention-dropout", "0", task="cocon_generation",
    )  # fmt: skip
    crit = CoConCriterion(task, cocon_prefix_len=1, cocon_content_len=2, cocon_len_jitter=0, cocon_min_content=1,
                          cocon_max_content=2, cocon_cycle_steps=2, cocon_cycle_start=0, cocon_adv_start=0,
                          cocon_disc_update_freq=1, cocon_disc_dim=4, cocon_adv_fake=fake_side)  # fmt: skip
    torch.manual_seed(7)
    with torch.no_grad():
        for p in [*model.parameters(), *crit.parameters()]:
            p.copy_(torch.randn_like(p) * 0.5)
    disc = crit.discriminator.discriminator
    # the discriminator's dropout (0.5, the authors') draws random masks: the comparison is made without it
    disc.dropout = 0.0
    model.train()
    crit.set_update_num(0)
    d = task.target_dictionary
    eos = d.eos()
    # two windows of running text: x^b = x_1 x_2, whose LM states (the real side) are at positions 2 and 3 of the
    # shifted input; x_3 is in no loss
    x = torch.tensor([[d.index(w) for w in "a b c a".split()], [d.index(w) for w in "d e f d".split()]])
    prev = torch.cat([torch.full((2, 1), eos), x[:, :-1]], dim=1)
    net_input = {"src_tokens": x, "src_lengths": torch.tensor([4, 4]), "prev_output_tokens": prev}
    sample = {"id": torch.tensor([0, 1]), "nsentences": 2, "ntokens": 8, "target": x, "net_input": net_input}
    loss, sample_size, log = crit(model, sample)

    dec = model.decoder
    emb = dec.lm.embed_tokens.weight

    def logp(h, h_block):  # Eq. 7: the LM's state at position 0 (</s>), the block's from x^a's last token on
        upper_in = torch.cat([h[:1], h_block[1:]])
        return torch.log_softmax(dec.lm_logits(dec.upper(upper_in)).double()[0], dim=-1)

    def states_of(tokens):  # lower states of tokens run alone after </s>, the </s> state dropped
        return dec.lower(torch.tensor([[eos] + tokens]))[0][1:]

    def soft_states(ys):  # lower states of soft tokens y_s (as embeddings y_s E) after </s>
        toks = torch.full((1, len(ys) + 1), d.unk())
        toks[0, 0] = eos
        return dec.lower(toks, token_embeddings=torch.cat([emb[eos][None], *(y[None] @ emb for y in ys)])[None])[0]

    l_self = l_null = l_cycle = l_adv = l_disc = 0.0
    convs = [(c.weight.detach().double(), c.bias.detach().double()) for c in disc.convs]
    out_w = disc.out.weight.detach().double()[0]
    with torch.no_grad():
        for b in range(2):
            other = 1 - b  # x' of row b: the previous row, cyclically
            row = x[b].tolist()
            h = dec.lower(prev[b : b + 1])[0]  # 4 x 1 x C
            content = states_of(row[1:3])
            hidden = torch.zeros(1, 4, 2, dtype=torch.bool)
            hidden[0, 1, 0] = hidden[0, 2, 1] = True  # query p predicts content token p - 1
            lp_self = logp(h, dec.block(h, content, None, None, content_attn_mask=hidden)[0])
            lp_null = logp(h, dec.block(h)[0])
            for p in (1, 2):
                l_self -= float(lp_self[p, row[p]])
                l_null -= float(lp_null[p, row[p]])
            # the cycle: q^1 = f(p' = </s> x'_0, c = x_1 x_2), each step on the whole soft sequence
            ys, fake = [], []
            for s in range(2):
                toks = torch.tensor([[eos, int(x[other, 0])] + [d.unk()] * s])
                tok_emb = torch.cat([emb[toks[0, :2]], *(y[None] @ emb for y in ys)])[None]
                hs = dec.lower(toks, token_embeddings=tok_emb)[0]
                hb = dec.block(hs, content)[0]
                ys.append(torch.softmax(logp(hs, hb)[-1], dim=-1).float())
                fake.append(hb[-1, 0].double())  # block: the block's state that generated y_s
            if fake_side == "text":  # the LM's own lower states of the generated tokens, after p'
                tok_emb = torch.cat([emb[[eos, int(x[other, 0])]], *(y[None] @ emb for y in ys)])[None]
                hs = dec.lower(torch.tensor([[eos, int(x[other, 0]), d.unk(), d.unk()]]), token_embeddings=tok_emb)[0]
                fake = [hs[2, 0].double(), hs[3, 0].double()]
            lp_cycle = logp(h, dec.block(h, soft_states(ys)[1:])[0])
            for p in (1, 2):
                l_cycle -= float(lp_cycle[p, row[p]])
            # the adversarial pair: real = the LM's lower states of x^b's tokens (positions 2, 3 of the shifted
            # input), fake = the states above
            z_real = ref_discriminator(convs, out_w, h[:, 0].double(), [False, False, True, True])
            z_fake = ref_discriminator(convs, out_w, torch.stack(fake), [True, True])
            l_adv += math.log(1 - torch.sigmoid(z_fake).item())
            l_disc += -math.log(torch.sigmoid(z_real).item()) - math.log(1 - torch.sigmoid(z_fake).item())
    assert int(sample_size) == 4 and int(log["ntokens_cycle"]) == 4 and int(log["nsentences_adv"]) == 2
    for key, want in (("loss_self", l_self), ("loss_null", l_null), ("loss_cycle", l_cycle), ("loss_adv", l_adv),
                      ("loss_disc", l_disc)):  # fmt: skip
        assert float(log[key]) == pytest.approx(want, rel=1e-4, abs=1e-6), key
    assert l_adv < 0  # minimax: log(1 - D(fake)), not the non-saturating -log D(fake)
    # the total: L_cycle per cycle token weighed as a self token, L_adv per sentence; L_disc is the discriminator's
    # own loss (its own optimizer), not a part of the block's
    want = l_self + l_null + l_cycle * 4 / 4 + (4 / 2) * l_adv
    assert float(loss) == pytest.approx(want, rel=1e-4)
