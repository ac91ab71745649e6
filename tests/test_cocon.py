"""CoCon ("CoCon: A Self-Supervised Approach for Controlled Text Generation", ICLR 2021): the block's attention
against a hand computation (Eq. 6), the content bias tau, null content, the self-reconstruction mask (W' off and
on), incremental == full decoding (also across a beam reorder), the frozen LM, the losses' gradients, the update
counting, decoding with fairseq's search (fixed-length too), checkpoints of earlier versions, bad input. Against
the authors' block: tests/test_cocon_reference.py."""

import argparse
import math
import random

import pytest
import torch
from conftest import run_cli
from helpers import build_task_and_model, decode_full_and_stepwise, first_batch

from fairseq_knowgen.criterions.cocon import CoConCriterion, sample_fixed_splits, sample_splits, span_mask
from fairseq_knowgen.modules.cocon_block import CoConAttention, CoConBlock
from fairseq_knowgen.modules.cocon_discriminator import (
    HiddenStateDiscriminator,
    build_discriminator,
    discriminator_loss,
    generator_loss,
)

WORDS = "dog cat ball park run jump play throw catch field river boat sit swim the a and in".split()


def write_sentences(path, n, seed):
    rng = random.Random(seed)
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)) + "\n")


@pytest.fixture(scope="session")
def cocon_data(tmp_path_factory):
    """Binarized sentences (dict.txt, train, valid) and an untrained 2-layer transformer_lm on them."""
    from fairseq_knowgen.prep.cocon import save_untrained_lm

    raw = tmp_path_factory.mktemp("coconraw")
    write_sentences(raw / "train.txt", 200, 0)
    write_sentences(raw / "valid.txt", 20, 1)
    out = tmp_path_factory.mktemp("coconbin")
    run_cli(
        "fairseq-preprocess",
        "--only-source",
        "--trainpref",
        raw / "train.txt",
        "--validpref",
        raw / "valid.txt",
        "--destdir",
        out,
        "--workers",
        "1",
    )
    lm_dir = tmp_path_factory.mktemp("coconlm")
    save_untrained_lm(str(out), str(lm_dir / "lm.pt"), layers=2, dim=16, heads=2)
    return out, lm_dir / "lm.pt"


# the fixture's lines are short sentences, each a training sample (--cocon-sample-mode lines); the default samples,
# 30-token windows of running text, are tested in tests/test_cocon_windows.py
LINES = ("--cocon-sample-mode", "lines")


def build(cocon_data, *extra):
    data, lm = cocon_data
    args = ["--cocon-lm-path", lm, "--cocon-layer", "1", "--cocon-zero-init", "0", "--cocon-dropout", "0", *LINES]
    args += extra
    task, model, _ = build_task_and_model(data, "cocon_lm", *args, task="cocon_generation")
    return task, model.eval()


# -- the block (Eq. 5-7) -------------------------------------------------------------------------------------


def hand_attention(attn, x, c, tau=None, pad=None, qmask=None):
    """Eq. 6 with one head, written out per query and key from the projection weights. ``qmask`` (T x S
    bool, True = hidden): query i does not see content column j where qmask[i][j]; with W'
    (--cocon-content-prev-key) the previous-column part of key j counts for query i only where query i
    sees column j - 1."""
    T, S = x.size(0), (0 if c is None else c.size(0))
    Wq, bq = attn.q_proj.weight, attn.q_proj.bias
    text = [(attn.k_proj, attn.v_proj)] * T
    content_proj = (attn.content_k_proj, attn.content_v_proj) if attn.content_kv_mode == "separate" else text[0]
    inputs = ([] if c is None else [c[s, 0] for s in range(S)]) + [x[t, 0] for t in range(T)]
    kv = [(k.weight @ v_in + k.bias, v.weight @ v_in + v.bias) for (k, v), v_in in zip([content_proj] * S + text, inputs)]
    prev = getattr(attn, "content_prev_k_proj", None)
    out = []
    for i in range(T):
        q = Wq @ x[i, 0] + bq
        logits = []
        for j, (key, _) in enumerate(kv):
            # --cocon-content-prev-key: K_j += W' h_{j-1} (nothing at j = 0), where query i sees column j - 1
            if prev is not None and 0 < j < S and not (qmask is not None and qmask[i][j - 1]):
                key = key + prev.weight @ c[j - 1, 0]
            score = float(q @ key) / math.sqrt(x.size(-1))
            if j < S:
                if (pad is not None and pad[j]) or (qmask is not None and qmask[i][j]):
                    score = -math.inf
                elif tau is not None:
                    score += tau[j]
            elif j - S > i:  # causal: query i sees self positions 0..i
                score = -math.inf
            logits.append(score)
        m = max(logits)
        w = [math.exp(v - m) for v in logits]
        z = sum(w)
        ctx = sum((wi / z) * value for wi, (_, value) in zip(w, kv))
        out.append(attn.out_proj.weight @ ctx + attn.out_proj.bias)
    return torch.stack(out)


@pytest.mark.parametrize("tau", [None, [0.0, 0.0, 0.0], [2.0, -1.0, 5.0]])
@pytest.mark.parametrize("content_kv,prev_key", [("separate", False), ("shared", False), ("separate", True)])
def test_attention_over_content_and_causal_self_by_hand(tau, content_kv, prev_key):
    torch.manual_seed(0)
    attn = CoConAttention(4, 1, content_kv=content_kv, content_prev_key=prev_key).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p)
    x, c = torch.randn(3, 1, 4).double(), torch.randn(3, 1, 4).double()
    pad = torch.tensor([[False, False, True]])
    bias = None if tau is None else torch.tensor([tau]).double()
    got, w = attn(x, c, pad, bias, need_weights=True)
    want = hand_attention(attn, x, c, None if tau is None else tau, pad[0])
    assert torch.allclose(got[:, 0], want, atol=1e-10)
    assert w[0, 0, :, 2].eq(0).all()  # padded content position
    assert w[0, 0, 0, 4:].eq(0).all() and w[0, 0, 1, 5].eq(0)  # causal self part


@pytest.mark.parametrize("prev_key", [False, True])
def test_per_query_content_mask_by_hand_and_a_hidden_column_reaches_its_query_through_no_key(prev_key):
    """A per-query content mask (the aligned self mask, a random one) with every weight random and non-zero,
    W' too: the output equals the hand computation (W' h_{j-1} in key j only for queries that see column
    j - 1), and changing a content column that a query may not see leaves that query's output exactly as it
    was (W' on or off: with W' added to every key, column j would reach the query through key j + 1)."""
    torch.manual_seed(4)
    T, S, B = 6, 5, 2
    attn = CoConAttention(4, 1, content_prev_key=prev_key).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.7)
    assert all(p.abs().min() > 0 for p in attn.parameters())
    x, c = torch.randn(T, B, 4).double(), torch.randn(S, B, 4).double()
    qmask = torch.zeros(B, T, S, dtype=torch.bool)
    for p in range(1, T):  # row 0: the aligned mask (prefix of 1: query p hides column p - 1)
        if p - 1 < S:
            qmask[0, p, p - 1] = True
    qmask[1] = torch.rand(T, S, generator=torch.Generator().manual_seed(0)) < 0.4  # row 1: any per-query mask
    qmask[1, :, 0] = False  # (every query keeps a column)
    tau = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.0]] * B).double()
    got, _ = attn(x, c, None, tau, content_attn_mask=qmask)
    for b in range(B):
        want = hand_attention(attn, x[:, b : b + 1], c[:, b : b + 1], tau[b].tolist(), None, qmask[b].tolist())
        assert torch.allclose(got[:, b], want, atol=1e-10), b
    with torch.no_grad():
        for b, i, j in qmask.nonzero().tolist():
            changed = c.clone()
            changed[j, b] = torch.randn(4).double() * 3
            out, _ = attn(x, changed, None, tau, content_attn_mask=qmask)
            assert torch.equal(out[i, b], got[i, b]), (b, i, j)
            seen = (~qmask[b, :, j]).nonzero().flatten()  # the queries that see column j do change
            assert (out[seen, b] - got[seen, b]).abs().amax() > 1e-6, (b, i, j)


def test_null_content_is_attention_over_self_only():
    torch.manual_seed(1)
    block = CoConBlock(4, 1, 8, dropout=0.0, attention_dropout=0.0, zero_init=False).double()
    h, c = torch.randn(3, 2, 4).double(), torch.randn(2, 2, 4).double()
    null, _ = block(h)
    all_padded, _ = block(h, c, torch.ones(2, 2, dtype=torch.bool))
    assert torch.allclose(null, all_padded, atol=1e-12)
    a = hand_attention(block.attn, block.attn_layer_norm(h[:, :1]), None)
    h1 = h[:, 0] + a
    want = h1 + block.fc2(torch.nn.functional.gelu(block.fc1(block.ffn_layer_norm(h1))))  # the default activation
    assert torch.allclose(null[:, 0], want, atol=1e-10)


def test_tau_zero_is_no_bias_and_tau_raises_content_attention():
    torch.manual_seed(2)
    block = CoConBlock(8, 2, 16, dropout=0.0, attention_dropout=0.0, zero_init=False)
    h, c = torch.randn(5, 3, 8), torch.randn(4, 3, 8)
    plain, w0 = block(h, c, need_weights=True)
    zero, _ = block(h, c, content_bias=torch.zeros(3, 4))
    assert torch.equal(plain, zero)
    mass = [block(h, c, content_bias=torch.full((3, 4), t), need_weights=True)[1][..., :4].sum(-1) for t in (0, 2, 5)]
    assert (mass[1] > mass[0]).all() and (mass[2] > mass[1]).all()
    assert torch.allclose(mass[0], w0[..., :4].sum(-1))


def test_zero_init_block_leaves_the_lm_unchanged(cocon_data):
    """With --cocon-zero-init 1 the block's output projections are zero: CoCon computes the LM exactly."""
    task, model = build(cocon_data, "--cocon-zero-init", "1")
    batch = first_batch(task)
    prev = batch["net_input"]["prev_output_tokens"]
    enc = model.encoder(batch["net_input"]["src_tokens"])
    with torch.no_grad():
        cocon = model.decoder(prev, encoder_out=enc)[0]
        model.decoder.bypass = True
        lm = model.decoder(prev, encoder_out=enc)[0]
        direct = model.decoder.lm(prev)[0]
    n = direct.size(-1)
    assert torch.allclose(cocon[..., :n], lm[..., :n], atol=1e-6)
    assert torch.equal(lm[..., :n], direct)
    assert torch.isinf(lm[..., n:]).all()  # <sep>, <prompt> are never generated


# -- the self-reconstruction mask -------------------------------------------------------------------------------


def randomize_block(block, std=0.5):
    """Every weight of the block random and non-zero (LayerNorms, biases and W' included): the mask's guarantee
    must not rest on a weight that starts at zero."""
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * std)
    assert all(p.abs().min() > 0 for p in block.parameters())


@pytest.mark.parametrize("prev_key", ["0", "1"])
def test_step_predicting_content_token_j_does_not_see_content_position_j(cocon_data, prev_key):
    """The aligned self mask (the default), with W' off (the default) and on, every weight of the block random:
    changing content state j changes nothing at the step predicting x^b_j, for every j, and changes the
    other steps."""
    task, model = build(cocon_data, "--cocon-content-prev-key", prev_key)
    assert hasattr(model.decoder.block.attn, "content_prev_k_proj") == (prev_key == "1")
    torch.manual_seed(5)
    randomize_block(model.decoder.block)
    crit = CoConCriterion(task)
    assert crit.self_mask == "aligned"
    batch = first_batch(task)
    target = batch["target"]
    n_words = target.ne(1).sum(1) - 1
    t = torch.minimum(torch.full_like(n_words, 2), n_words - 1)
    dec = model.decoder
    content, states, cpad, qmask = crit.self_content(dec, target, t, n_words - t)
    b = int((~cpad).sum(1).argmax())
    L = int((~cpad[b]).sum())
    assert L >= 3
    for j in range(L):
        # input position t+j predicts target[t+j] = x^b_j, which is content token j
        assert target[b, t[b] + j] == content[b, j]
        assert qmask[b, t[b] + j].nonzero().flatten().tolist() == [j]
    assert not qmask[b, : t[b]].any()
    # behaviour: changing content state j changes no output at the step predicting x^b_j
    h, _ = dec.lower(batch["net_input"]["prev_output_tokens"])
    real = int(n_words[b]) + 1
    with torch.no_grad():
        out1, _ = dec.block(h, states, cpad, None, content_attn_mask=qmask)
        for j in range(L):
            changed = states.clone()
            changed[j, b] = torch.randn_like(changed[j, b]) * 3  # (a constant shift would vanish in the LayerNorm)
            out2, _ = dec.block(h, changed, cpad, None, content_attn_mask=qmask)
            diff = (out1[:real, b] - out2[:real, b]).abs().amax(-1)
            p = int(t[b]) + j
            assert diff[p] == 0, (j, diff)
            others = [i for i in range(real) if i != p]
            assert (diff[others] > 1e-6).all(), (j, diff)


@pytest.mark.parametrize("prev_key", ["0", "1"])
def test_random_self_mask_hides_the_same_columns_from_every_step(cocon_data, prev_key):
    task, model = build(cocon_data, "--cocon-content-prev-key", prev_key)
    torch.manual_seed(6)
    randomize_block(model.decoder.block)  # W' too, when on
    crit = CoConCriterion(task, cocon_self_mask="random", cocon_self_mask_prob=0.5)
    batch = first_batch(task)
    target = batch["target"]
    n_words = target.ne(1).sum(1) - 1
    t = torch.zeros_like(n_words)
    dec = model.decoder
    hidden = 0
    real = 0
    for seed in range(20):
        content, states, cpad, qmask = crit.self_content(dec, target, t, n_words, torch.Generator().manual_seed(seed))
        assert qmask.shape == (target.size(0), target.size(1), content.size(1))
        assert (qmask == qmask[:, :1]).all()  # one column set per sentence, for every step
        assert not (qmask[:, 0] & cpad).any()  # padding is not counted as hidden
        assert ((~qmask[:, 0]) & ~cpad).any(1).all()  # every sentence keeps a visible column
        hidden += int(qmask[:, 0].sum())
        real += int((~cpad).sum())
    assert 0.35 < hidden / real < 0.6
    # behaviour: a hidden column changes no output anywhere in its sentence, a visible one does
    content, states, cpad, qmask = crit.self_content(dec, target, t, n_words, torch.Generator().manual_seed(0))
    b = int(((qmask[:, 0] & ~cpad).sum(1) * ((~qmask[:, 0]) & ~cpad).sum(1)).argmax())
    hid = int(qmask[b, 0].nonzero()[0])
    vis = int(((~qmask[b, 0]) & ~cpad[b]).nonzero()[0])
    h, _ = dec.lower(batch["net_input"]["prev_output_tokens"])
    with torch.no_grad():
        out = dec.block(h, states, cpad, None, content_attn_mask=qmask)[0][:, b]
        diffs = []
        for col in (hid, vis):
            changed = states.clone()
            changed[col, b] = torch.randn_like(changed[col, b]) * 3
            diffs.append((dec.block(h, changed, cpad, None, content_attn_mask=qmask)[0][:, b] - out).abs().max())
    assert diffs[0] == 0 and diffs[1] > 1e-4


@pytest.mark.parametrize("value,mode", [("1", "aligned"), ("0", "none"), ("none", "none"), ("random", "random")])
def test_self_mask_choices_and_earlier_checkpoints_values(cocon_data, value, mode):
    task, model = build(cocon_data)
    crit = CoConCriterion(task, cocon_self_mask=value)
    assert crit.self_mask == mode
    if mode == "none":
        batch = first_batch(task)
        n_words = batch["target"].ne(1).sum(1) - 1
        assert crit.self_content(model.decoder, batch["target"], torch.zeros_like(n_words), n_words)[3] is None


def test_unknown_self_mask_is_refused(cocon_data):
    task, _ = build(cocon_data)
    with pytest.raises(ValueError, match="--cocon-self-mask"):
        CoConCriterion(task, cocon_self_mask="sometimes")


@pytest.mark.parametrize("adv_weight", ["0", "1"])
def test_without_adversarial_loss_no_discriminator_is_built_and_every_parameter_learns(cocon_data, adv_weight):
    """DDP without find_unused_parameters: the configuration creates only what its loss uses."""
    task, model = build(cocon_data, "--criterion", "cocon", "--cocon-adv-weight", adv_weight)
    crit = CoConCriterion(task, cocon_adv_weight=float(adv_weight), cocon_cycle_start=0, cocon_adv_start=0)
    assert (crit.discriminator is None) == (adv_weight == "0")
    assert not any(k.startswith("discriminator") for k in model.state_dict())  # the criterion's, not the model's
    model.train()
    loss, _, log = crit(model, first_batch(task))
    loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None for _, p in trainable), [n for n, p in trainable if p.grad is None]
    assert ("loss_adv" in log) == (adv_weight == "1")
    # the discriminator is outside fairseq's optimizer (it builds one from what requires gradients) and DDP
    assert not any(p.requires_grad for p in crit.parameters())


def test_split_points_within_bounds():
    n = torch.tensor([1, 2, 5, 9, 30])
    for _ in range(50):
        t = sample_splits(n, 0, 1)
        assert (t >= 0).all() and (t <= (n - 1)).all()
        t = sample_splits(n, 3, 2)
        assert (t <= (n - 1).clamp(min=0)).all()
        assert ((t >= 3) | (n - 2 < 3)).all()


def test_fixed_splits_follow_the_authors_scheme():
    """--cocon-split fixed: prefix P + d and content C - d (d in -J..J) where the sentence is long enough; a
    short sentence keeps --cocon-min-content words of content by a shorter prefix."""
    n = torch.tensor([40] * 500 + [12, 7, 3, 0])
    t, m = sample_fixed_splits(n, prefix_len=10, content_len=20, jitter=2, min_content=5, max_content=32)
    d = t[:500] - 10
    assert set(d.tolist()) == {-2, -1, 0, 1, 2}  # every offset is drawn
    assert torch.equal(m[:500], 20 - d)  # the content shrinks as the prefix grows (their sum is fixed)
    assert t[500:].tolist() == [7, 2, 0, 0] and m[500:].tolist() == [5, 5, 3, 0]
    assert sample_fixed_splits(n, 10, 20, 2, 5, 16)[1][:500].max() == 16  # --cocon-max-content cuts


def test_split_sampling_stays_on_the_models_device():
    """The split points of a training step are drawn where the data lies (a CUDA batch must not meet a CPU
    random tensor: the crash at --cocon-cycle-start on GPUs). On the meta device any CPU tensor in the
    arithmetic raises."""
    n = torch.empty(6, dtype=torch.long, device="meta")
    t = sample_splits(n, 0, 1)
    tf, m = sample_fixed_splits(n, 10, 20, 2, 5, 32)
    assert t.device.type == tf.device.type == m.device.type == "meta"
    assert span_mask(12, tf, m, n).device.type == "meta"


def test_content_states_do_not_depend_on_batch_padding(cocon_data):
    """Each content is encoded alone (``</s> c_1 .. c_n`` through the lower layers): in a padded batch
    its states equal those of the content run by itself."""
    task, model = build(cocon_data)
    dec = model.decoder
    rows = [[4, 5, 6, 7, 8], [9, 10], [11, 12, 13]]
    batch = torch.tensor([r + [1] * (5 - len(r)) for r in rows])
    with torch.no_grad():
        states, pad = dec.encode_content_tensor(batch)
        for b, r in enumerate(rows):
            alone, _ = dec.encode_content_tensor(torch.tensor([r]))
            assert torch.allclose(states[: len(r), b], alone[:, 0], atol=1e-6)
            assert pad[b].tolist() == [False] * len(r) + [True] * (5 - len(r))
            # and by hand: the LM's own lower layers on </s> c_1 .. c_n, the </s> state dropped
            lm_states = dec.lm(torch.tensor([[2] + r]), return_all_hiddens=True)[1]["inner_states"][dec.split]
            assert torch.allclose(alone[:, 0], lm_states[1:, 0], atol=1e-6)


# -- incremental decoding ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prev_key", [False, True])
def test_incremental_equals_full_decoding_with_several_contents_and_tau(cocon_data, prev_key):
    task, model = build(cocon_data, *(["--cocon-content-prev-key", "1"] if prev_key else []))
    if prev_key:  # it starts at zero: make it count
        torch.nn.init.normal_(model.decoder.block.attn.content_prev_k_proj.weight)
    d = task.target_dictionary
    sep = d.index("<sep>")
    src = torch.tensor([[4, 5, sep, 6, 7, 8], [9, 10, 11, 1, 1, 1], [12, sep, 13, sep, 14, 1]])
    enc = model.encoder(src, content_tau=torch.tensor([2.0, 0.5]))
    # tau per content: row 0 = [2, 2, 0.5, 0.5, 0.5], row 2 = [2, 0.5, 0.5]
    assert enc["content_bias"][0][0].tolist() == [2.0, 2.0, 0.5, 0.5, 0.5]
    assert enc["content_bias"][0][2, :3].tolist() == [2.0, 0.5, 0.5] and enc["content_padding_mask"][0][2, 3:].all()
    prev = torch.tensor([[2, 4, 9, 7, 5, 6], [2, 8, 8, 10, 4, 12], [2, 5, 13, 14, 9, 9]])
    full, steps = decode_full_and_stepwise(model, enc, prev)
    for t, (step, _) in enumerate(steps):
        assert torch.allclose(step[:, 0], full[0][:, t], atol=1e-5), t


def test_incremental_state_follows_a_beam_reorder(cocon_data):
    task, model = build(cocon_data)
    src = torch.tensor([[4, 5, 6], [7, 8, 1]])
    prev = torch.tensor([[2, 4, 9, 7, 5], [2, 8, 8, 10, 4]])
    enc = model.encoder(src, content_tau=torch.tensor([1.0]))
    order = torch.tensor([1, 0])
    with torch.no_grad():
        state = {}
        for t in range(2):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        enc_r = model.encoder.reorder_encoder_out(enc, order)
        prev_r = prev.index_select(0, order)
        outs = [model.decoder(prev_r[:, : t + 1], encoder_out=enc_r, incremental_state=state)[0] for t in range(2, 5)]
        full = model.decoder(prev_r, encoder_out=enc_r)[0]
    for i, t in enumerate(range(2, 5)):
        assert torch.allclose(outs[i][:, 0], full[:, t], atol=1e-5)


@pytest.mark.parametrize("order", [[2, 0, 1, 4, 4, 3], [5, 3, 4], [1, 4]])
def test_incremental_equals_full_when_beams_reorder_and_inputs_finish(cocon_data, order):
    """fairseq's beam layout (3 rows per input, content stored once per input): a reorder within inputs,
    one input finishing (the batch shrinks to the other's rows), and an order breaking the layout."""
    task, model = build(cocon_data)
    src = torch.tensor([[4, 5, 6, 7], [8, 9, 1, 1]])
    enc = model.encoder.reorder_encoder_out(
        model.encoder(src, content_tau=torch.tensor([1.5])), torch.arange(2).repeat_interleave(3)
    )
    prev = torch.randint(4, 20, (6, 6))
    prev[:, 0] = 2
    order = torch.tensor(order)
    with torch.no_grad():
        state = {}
        for t in range(3):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        enc_r = model.encoder.reorder_encoder_out(enc, order)
        prev_r = prev.index_select(0, order)
        steps = [model.decoder(prev_r[:, : t + 1], encoder_out=enc_r, incremental_state=state)[0] for t in range(3, 6)]
        full = model.decoder(prev_r, encoder_out=enc_r)[0]
    for i, t in enumerate(range(3, 6)):
        assert torch.allclose(steps[i][:, 0], full[:, t], atol=1e-5), t


def test_content_keys_are_computed_once_per_sentence(cocon_data):
    """O(1) work per new token: the content's keys/values are projected on the first step only and
    kept once per input (not per beam row) with the same values through steps and beam reorders
    within each input."""
    task, model = build(cocon_data)
    src = torch.tensor([[4, 5, 6, 7], [8, 9, 1, 1]])
    beam = 3
    enc = model.encoder.reorder_encoder_out(model.encoder(src), torch.arange(2).repeat_interleave(beam))
    prev = torch.randint(4, 20, (2 * beam, 6))
    prev[:, 0] = 2
    calls, content_calls = [], []
    attn = model.decoder.block.attn
    handles = [
        attn.k_proj.register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape))),
        attn.content_k_proj.register_forward_hook(lambda m, i, o: content_calls.append(tuple(i[0].shape))),
    ]
    seen = []
    with torch.no_grad():
        state = {}
        for t in range(6):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            seen.append(attn.get_incremental_state(state, "cocon")["content_k"])
            # a beam reorder within each input (rows 0-2 belong to input 0, rows 3-5 to input 1)
            model.decoder.reorder_incremental_state_scripting(state, torch.tensor([2, 0, 0, 5, 3, 4]))
    for h in handles:
        h.remove()
    assert calls == [(1, 6, 16)] and content_calls == [(4, 2, 16)]  # first step only: new tokens, two contents
    assert all(torch.equal(k, seen[0]) for k in seen) and seen[0].size(0) == 2


# -- the losses --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
@pytest.mark.parametrize("adv_loss", ["minimax", "non-saturating"])
def test_discriminator_and_generator_gradients_are_separated(kind, adv_loss):
    """Both discriminators (the authors' CNN, the default; the MLP) and both generator losses (the authors'
    minimax L_adv = log(1 - sigmoid(D(fake))), the default; non-saturating -log sigmoid(D(fake)))."""
    torch.manual_seed(3)
    disc = build_discriminator(kind, 8, 16).eval()  # (the CNN's dropout off: the losses are recomputed below)
    real = torch.randn(3, 5, 8, requires_grad=True)
    fake = torch.randn(3, 5, 8, requires_grad=True)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True
    weights = {k: v.detach().clone().requires_grad_() for k, v in disc.named_parameters()}
    l_disc, correct = discriminator_loss(disc, weights, real, fake, None, pad)
    g = torch.autograd.grad(l_disc, [real, fake, *weights.values()], allow_unused=True)
    assert g[0] is None and g[1] is None and all(x is not None and x.abs().sum() > 0 for x in g[2:])
    assert all(p.grad is None for p in disc.parameters())  # the module's own weights took no gradient
    l_adv = generator_loss(disc, fake, pad, adv_loss=adv_loss)
    g = torch.autograd.grad(l_adv, [real, fake, *disc.parameters()], allow_unused=True)
    assert g[0] is None and g[1].abs().sum() > 0 and all(x is None for x in g[2:])
    assert g[1][0, 3:].eq(0).all()  # padded positions are not pooled
    # L_adv and L_disc = -log sigmoid(D(real)) - log(1 - sigmoid(D(fake))), by hand
    zf, zr = disc(fake, pad), disc(real)
    sig = torch.sigmoid
    gen = torch.log(1 - sig(zf)) if adv_loss == "minimax" else -torch.log(sig(zf))
    assert torch.allclose(l_adv, gen.sum())
    assert torch.allclose(l_disc, -(torch.log(sig(zr)) + torch.log(1 - sig(zf))).sum())
    assert correct == ((zr > 0).sum() + (zf < 0).sum())
    # rows: only the kept sequences count
    rows = torch.tensor([True, False, True])
    l_disc_r, correct_r = discriminator_loss(disc, weights, real, fake, None, pad, rows)
    assert torch.allclose(generator_loss(disc, fake, pad, rows, adv_loss), gen[rows].sum())
    assert torch.allclose(l_disc_r, -(torch.log(sig(zr)) + torch.log(1 - sig(zf)))[rows].sum())
    assert correct_r == ((zr > 0) & rows).sum() + ((zf < 0) & rows).sum()
    # the default generator loss is the authors' minimax one
    assert torch.equal(generator_loss(disc, fake, pad), generator_loss(disc, fake, pad, adv_loss="minimax"))
    with pytest.raises(ValueError, match="adversarial loss"):
        generator_loss(disc, fake, pad, adv_loss="wasserstein")


def test_cycle_loss_reaches_the_block_through_both_passes(cocon_data):
    task, model = build(cocon_data)
    crit = CoConCriterion(task, cocon_cycle_steps=3, cocon_min_content=1)  # the batch's short sentences take part
    model.train()
    batch = first_batch(task)
    dec = model.decoder
    target, prev = batch["target"], batch["net_input"]["prev_output_tokens"]
    h, _ = dec.lower(prev)
    crit.cycle_split = lambda T: (2, 32)  # a split every sentence of the batch can take
    loss, n = crit.cycle_loss(model, crit.cycle(model, batch, h))
    loss.backward()
    assert n > 0 and loss > 0
    # --cocon-cycle-sentences 2: the first two sentences only
    crit2 = CoConCriterion(task, cocon_cycle_steps=3, cocon_cycle_sentences=2, cocon_min_content=1)
    crit2.cycle_split = crit.cycle_split
    _, n2 = crit2.cycle_loss(model, crit2.cycle(model, batch, h.detach()))
    assert 0 < n2 <= int(target[:2].ne(1).sum()) < n
    grads = {k: p.grad for k, p in model.named_parameters() if p.requires_grad}
    assert all(grads[k] is not None and grads[k].abs().sum() > 0 for k in grads if k.startswith("decoder.block."))
    assert all(p.grad is None for p in dec.lm.parameters())
    # the first pass alone (q^1 from p' and q) carries gradient too: the soft tokens are differentiable
    model.zero_grad()
    q = target[:, :3].clone()
    qs, qp = dec.encode_content_tensor(q)
    q1, states = crit.generate_soft(dec, prev[:, :2], qs, qp)
    assert q1.shape[1] == 3 and torch.allclose(q1.sum(-1), torch.ones(q1.shape[:2]))
    assert states.shape == (q1.size(0), 3, dec.embed_dim)  # the block's states that generated q^1
    q1[..., 5].sum().backward()
    assert dec.block.attn.content_k_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("fake_side", ["text", "block"])
def test_soft_generation_equals_a_full_recomputation(cocon_data, fake_side):
    """The incremental soft generation of the cycle equals running the whole soft sequence at once, the upper
    layers reading the LM's own states before the prefix's last token (Eq. 7) and the block's from there on; the
    adversarial loss's fake side is the LM's lower states of the generated tokens (text) or the block's states
    that generated them (block)."""
    task, model = build(cocon_data)
    crit = CoConCriterion(task, cocon_cycle_steps=4, cocon_adv_fake=fake_side)
    dec = model.decoder
    prefix = torch.tensor([[2, 4, 5], [2, 6, 7]])
    content = torch.tensor([[8, 9, 10], [11, 12, 1]])
    cs, cp = dec.encode_content_tensor(content)
    P = prefix.size(1)
    with torch.no_grad():
        ys, states = crit.generate_soft(dec, prefix, cs, cp)
        emb = dec.lm.embed_tokens
        soft = torch.cat([emb(prefix), ys[:, :-1] @ emb.weight], dim=1)
        toks = torch.cat([prefix, torch.full((2, 3), 3)], dim=1)
        h, _ = dec.lower(toks, token_embeddings=soft)
        h_block, _ = dec.block(h, cs, cp)
        logits = dec.lm_logits(dec.upper(torch.cat([h[: P - 1], h_block[P - 1 :]])))
        block_everywhere = dec.lm_logits(dec.upper(h_block))
    want = torch.softmax(logits[:, P - 1 :], -1)
    assert torch.allclose(ys, want, atol=1e-5)
    assert not torch.allclose(ys, torch.softmax(block_everywhere[:, P - 1 :], -1), atol=1e-4)  # it matters
    if fake_side == "block":  # the block's states at the positions that generated q^1
        assert torch.allclose(states, h_block[P - 1 :].transpose(0, 1), atol=1e-5)
    else:  # the LM's lower states of the 4 generated tokens, after the prefix
        with torch.no_grad():
            every = torch.cat([emb(prefix), ys @ emb.weight], dim=1)
            h_all, _ = dec.lower(torch.cat([prefix, torch.full((2, 4), 3)], dim=1), token_embeddings=every)
        assert torch.allclose(states, h_all[P:].transpose(0, 1), atol=1e-5)


def test_cycle_generates_q1_from_the_other_prefix_and_reconstructs_own_q(cocon_data, monkeypatch):
    """Section 3.1, Cycle Reconstruction Loss: q^1 = f(p', c = q) from the *other* sentence's prefix p'
    and this sentence's q; then q^2 = f(p, c = q^1) is scored against q. Assembled row by row (each row
    alone, so no batching is shared with the criterion), with x' of row b = row b - 1."""
    torch.manual_seed(0)  # the block's start
    task, model = build(cocon_data)
    crit = CoConCriterion(task, cocon_cycle_steps=3, cocon_min_content=1)
    batch = first_batch(task)
    dec = model.decoder
    with torch.no_grad():  # outputs that depend strongly on the content (an untrained LM and block barely do)
        for lin in (dec.block.attn.q_proj, dec.block.attn.k_proj, dec.block.attn.v_proj, dec.block.attn.out_proj):
            lin.weight.mul_(4.0)
        dec.lm.output_projection.weight.mul_(5.0)
    target, prev = batch["target"][:4], batch["net_input"]["prev_output_tokens"][:4]
    n_words = target.ne(1).sum(1) - 1
    tc = 2
    assert int(n_words.min()) > tc
    crit.cycle_split = lambda T: (tc, crit.max_content)
    sub = {"target": target, "net_input": {"prev_output_tokens": prev}}
    with torch.no_grad():
        h, _ = dec.lower(prev)
        got, n = crit.cycle_loss(model, crit.cycle(model, sub, h))
        want, count = 0.0, 0
        emb = dec.lm.embed_tokens.weight
        for b in range(4):
            other = (b - 1) % 4
            q = target[b : b + 1, tc : tc + min(int(n_words[b]) - tc, crit.max_content)]  # x^b of row b
            q1, _ = crit.generate_soft(dec, prev[other : other + 1, : tc + 1], *dec.encode_content_tensor(q))
            c1, _ = dec.encode_contents(None, q.device, soft=q1 @ emb)
            hb, pb = dec.lower(prev[b : b + 1, : int(n_words[b]) + 1])  # row b unpadded: p then q
            h2, _ = dec.block(hb, c1.transpose(0, 1))
            h2 = torch.cat([hb[:tc], h2[tc:]])  # Eq. 7: the LM's own states before p's last token
            lp = torch.log_softmax(dec.lm_logits(dec.upper(h2, None, pb)).double(), -1)[0]
            for i in range(tc, int(n_words[b]) + 1):  # the positions predicting q (and </s>)
                want -= float(lp[i, target[b, i]])
                count += 1
    assert int(n) == count
    assert abs(float(got) - want) < 1e-5 * abs(want)
    # pairing rows with themselves (x' = x) gives another loss: the pairing above is what was checked
    monkeypatch.setattr(torch, "roll", lambda x, *a, **k: x)
    with torch.no_grad():
        same, _ = crit.cycle_loss(model, crit.cycle(model, sub, h))
    assert abs(float(same) - want) > 1e-2 * abs(want)


def test_losses_run_inside_one_model_forward(cocon_data):
    """torch's DDP (fairseq's pytorch_ddp) all-reduces the gradients of a forward it ran: every loss
    must be computed inside one call of the model's forward."""
    task, model = build(cocon_data)
    crit = CoConCriterion(task, cocon_cycle_start=0, cocon_adv_start=0, cocon_cycle_steps=2)
    model.train()
    depth, outside = [0], []
    model.register_forward_pre_hook(lambda m, a: depth.__setitem__(0, depth[0] + 1))
    model.register_forward_hook(lambda m, a, o: depth.__setitem__(0, depth[0] - 1))
    for sub in (model.decoder.block, model.decoder.lm.layers[0]):
        sub.register_forward_pre_hook(lambda m, a: outside.append(m) if depth[0] == 0 else None)
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    _, _, log = crit(model, first_batch(task))
    assert len(calls) == 1 and not outside and "loss_cycle" in log and "loss_adv" in log


def test_cycle_and_adversarial_losses_start_at_their_update(cocon_data):
    task, model = build(cocon_data)
    crit = CoConCriterion(task, cocon_cycle_start=3, cocon_adv_start=5, cocon_cycle_steps=2)
    model.train()
    batch = first_batch(task)
    seen = {}
    for n in (0, 2, 3, 4, 5, 9):
        crit.set_update_num(n)
        _, _, log = crit(model, batch)
        seen[n] = ("loss_cycle" in log, "loss_adv" in log and "loss_disc" in log)
    assert seen == {0: (0, 0), 2: (0, 0), 3: (1, 0), 4: (1, 0), 5: (1, 1), 9: (1, 1)}
    model.eval()
    _, _, log = crit(model, batch)
    assert "loss_cycle" not in log and "loss_adv" not in log and "loss_null" in log


def test_loss_goes_down_and_only_cocon_learns(cocon_data):
    torch.manual_seed(0)  # the block's start (the test must not depend on what ran before it)
    task, model = build(cocon_data)
    # the adversarial pair is on too (its gradients are checked above) but weighs little: pushing CoCon's states
    # towards the LM's works against reconstruction in a 16-wide random LM
    crit = CoConCriterion(
        task, cocon_cycle_start=0, cocon_adv_start=0, cocon_cycle_steps=2, cocon_adv_weight=0.01, cocon_disc_weight=0.01,
        cocon_prefix_len=2, cocon_content_len=6, cocon_len_jitter=1, cocon_min_content=2,  # the toy's 3-12 word sentences
    )  # fmt: skip
    lm_before = {k: v.clone() for k, v in model.decoder.lm.state_dict().items()}
    cocon_before = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    batch = first_batch(task, max_sentences=8)

    def self_loss():  # validation mode: the split points are a function of the sample ids
        model.eval()
        with torch.no_grad():
            _, size, log = crit(model, batch)
        model.train()
        return log["loss_self"] / size

    before = self_loss()
    torch.manual_seed(0)
    for step in range(40):
        crit.set_update_num(step)
        loss, size, log = crit(model, batch)
        (loss / size).backward()
        opt.step()
        opt.zero_grad()
    after = self_loss()
    assert after < before - 0.25, (before, after)  # measured: 3.21 -> 2.82 bits per token
    for k, v in model.decoder.lm.state_dict().items():
        assert torch.equal(v, lm_before[k]), k
    changed = [k for k, p in model.named_parameters() if p.requires_grad and not torch.equal(p, cocon_before[k])]
    assert sorted(changed) == sorted(cocon_before)
    assert all(k.startswith("decoder.block.") for k in cocon_before)


@pytest.mark.parametrize("mask", ["aligned", "none"])
def test_content_bag_of_words_loss_by_hand(cocon_data, mask):
    """L_bow = -log of the probability mass on the distinct visible content tokens at or after the target's
    column, computed here with loops over sets, independently of the criterion's tensor code."""
    task, _ = build(cocon_data)
    crit = CoConCriterion(task, cocon_self_mask=mask, cocon_bow_weight=1.0)
    pad, eos = task.target_dictionary.pad(), task.target_dictionary.eos()
    g = torch.Generator().manual_seed(3)
    B, T, V, L = 2, 7, 12, 4
    logits = torch.randn(B, T, V, generator=g) * 2
    content = torch.tensor([[5, 6, 5, 7], [8, 9, eos, pad]])  # a repeated token; </s> and padding never count
    t = torch.tensor([1, 2])
    lengths = torch.tensor([6, 6])
    pos = torch.arange(T)[None]
    loss_mask = (pos >= t[:, None]) & (pos < lengths[:, None])
    qmask = None
    if mask == "aligned":
        qmask = torch.zeros(B, T, L, dtype=torch.bool)
        for b in range(B):
            for p in range(T):
                if 0 <= p - t[b] < L:
                    qmask[b, p, p - t[b]] = True
    got, steps = crit.bow_loss(logits, content, t, qmask, loss_mask)
    want, n = 0.0, 0
    probs = logits.softmax(-1)
    for b in range(B):
        for p in range(T):
            if not loss_mask[b, p]:
                continue
            j = p - int(t[b])
            visible = [k for k in range(L) if k >= j and not (mask == "aligned" and k == j)]
            bag = {int(content[b, k]) for k in visible} - {pad, eos}
            if bag:
                want -= math.log(sum(float(probs[b, p, w]) for w in bag))
                n += 1
    assert int(steps) == n and n > 0
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_bow_weight_adds_the_bow_loss_in_training_only(cocon_data):
    task, model = build(cocon_data)
    batch = first_batch(task)
    off = CoConCriterion(task)
    on = CoConCriterion(task, cocon_bow_weight=0.5)
    runs = {}
    for training in (True, False):
        model.train(training)
        for name, crit in (("off", off), ("on", on)):
            torch.manual_seed(0)  # the same split points in both calls (training draws them)
            with torch.no_grad():
                loss, _, log = crit(model, batch)
            runs[training, name] = (loss.item(), log)
    model.eval()
    (l_off, log_off), (l_on, log_on) = runs[True, "off"], runs[True, "on"]
    assert "loss_bow" not in log_off and log_on["ntokens_bow"] > 0 and log_on["loss_bow"] > 0
    assert l_on == pytest.approx(l_off + 0.5 * float(log_on["loss_bow"]), rel=1e-5)
    # validation: L_bow logged, not in the loss that picks checkpoints
    assert runs[False, "on"][0] == pytest.approx(runs[False, "off"][0], rel=1e-6) and "loss_bow" in runs[False, "on"][1]
    with pytest.raises(ValueError):
        CoConCriterion(task, cocon_bow_weight=-1.0)


# -- fairseq's search --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gen", [dict(beam=3), dict(beam=1, sampling=True), dict(beam=1, sampling=True, sampling_topp=0.5)]
)
def test_search_forces_each_prompt_and_keeps_every_input(cocon_data, gen):
    from fairseq.dataclass.configs import GenerationConfig

    from fairseq_knowgen.tasks.cocon_generation import CoConSourceDataset

    task, model = build(cocon_data)
    d = task.target_dictionary
    lines = ["dog ball <prompt> the cat", "river <sep> boat", "swim <sep> park <prompt> a", "run jump"]
    ds = CoConSourceDataset(task.encode_sources(lines), d)
    batch = ds.collater([ds[i] for i in range(len(ds))])
    generator = task.build_generator([model], GenerationConfig(max_len_a=0, max_len_b=6, **gen))
    hyps = task.inference_step(generator, [model], batch)
    assert len(hyps) == 4
    for line, hs in zip(lines, hyps):
        prompt = line.split("<prompt>")[1].split() if "<prompt>" in line else []
        for h in hs:
            words = d.string(h["tokens"]).split()
            assert words[: len(prompt)] == prompt
            assert "<sep>" not in words and "<prompt>" not in words


@pytest.fixture(scope="session")
def cocon_ckpt(cocon_data, tmp_path_factory):
    """cocon_lm_small after 3 updates of fairseq-train with every loss on from the start (the fixture's sentence
    lines as samples; otherwise the defaults: no W', the CNN discriminator, the minimax loss)."""
    data, lm = cocon_data
    ckpt = tmp_path_factory.mktemp("coconckpt")
    run_cli(
        "fairseq-train",
        data,
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--task",
        "cocon_generation",
        "--arch",
        "cocon_lm_small",
        "--cocon-lm-path",
        lm,
        *LINES,
        "--criterion",
        "cocon",
        "--cocon-cycle-start",
        "0",
        "--cocon-adv-start",
        "0",
        "--cocon-cycle-steps",
        "2",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "500",
        "--max-update",
        "3",
        "--save-dir",
        ckpt,
        "--no-epoch-checkpoints",
        "--no-progress-bar",
    )
    return ckpt / "checkpoint_last.pt"


def test_frozen_lm_unchanged_and_without_optimizer_state(cocon_data, cocon_ckpt):
    data, lm = cocon_data
    state = torch.load(cocon_ckpt, weights_only=False)
    lm_state = torch.load(lm, weights_only=False)["model"]
    for k, v in lm_state.items():
        assert torch.equal(state["model"]["decoder.lm." + k.split("decoder.", 1)[1]], v), k
    # (the block's and the discriminator's weights; not the int buffer decoder.cocon_version)
    n_trainable = sum(
        v.numel() for k, v in state["model"].items() if not k.startswith("decoder.lm.") and v.dtype.is_floating_point
    )
    exp_avg = sum(s["exp_avg"].numel() for s in state["last_optimizer_state"]["state"].values())
    assert exp_avg == n_trainable


def test_checkpoint_round_trip_and_resume(cocon_data, cocon_ckpt, tmp_path):
    """fairseq's loader rebuilds the model with every weight of the checkpoint (block, discriminator,
    frozen LM) and the same outputs; fairseq-train resumes from it (optimizer state of the trainable
    parameters only) and keeps the LM frozen."""
    import shutil

    from fairseq import checkpoint_utils

    data, lm = cocon_data
    saved = torch.load(cocon_ckpt, weights_only=False)["model"]
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(cocon_ckpt)])
    model = models[0].eval()
    assert set(model.state_dict()) == set(saved)
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    again = checkpoint_utils.load_model_ensemble([str(cocon_ckpt)], task=task)[0][0].eval()
    src, prev = torch.tensor([[4, 5, 6]]), torch.tensor([[2, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(model(src, None, prev)[0], again(src, None, prev)[0])
    resume = tmp_path / "resume"
    resume.mkdir()
    shutil.copy(cocon_ckpt, resume / "checkpoint_last.pt")
    args = ["--cocon-lm-path", lm, "--cocon-cycle-start", "0", "--cocon-adv-start", "0", "--cocon-cycle-steps", "2"]
    proc = train_cli(data, "--arch", "cocon_lm_small", *args, "--max-update", "5", "--save-dir", resume, save=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = torch.load(resume / "checkpoint_last.pt", weights_only=False)
    assert after["optimizer_history"][-1]["num_updates"] == 5
    assert all(torch.equal(after["model"][k], v) for k, v in saved.items() if k.startswith("decoder.lm."))
    assert not torch.equal(after["model"]["decoder.block.fc1.weight"], saved["decoder.block.fc1.weight"])


def test_checkpoint_from_before_the_content_kv_flag_loads_as_shared(cocon_data, cocon_ckpt, tmp_path):
    """A checkpoint saved before --cocon-content-kv existed (no such attribute, no content_k/v_proj weights:
    its block shared the text's projections) loads strictly, as ``shared``, with the same outputs; today's
    checkpoints carry ``separate``."""
    from fairseq import checkpoint_utils

    state = torch.load(cocon_ckpt, weights_only=False)
    assert state["cfg"]["model"].cocon_content_kv == "separate"
    assert any(".content_k_proj." in k for k in state["model"])
    old = dict(state)
    old["model"] = {k: v for k, v in state["model"].items() if ".content_k_proj." not in k and ".content_v_proj." not in k}
    old["cfg"]["model"] = argparse.Namespace(**{k: v for k, v in vars(state["cfg"]["model"]).items() if not k.startswith("cocon_content_kv")})
    path = tmp_path / "old.pt"
    torch.save(old, path)
    model = checkpoint_utils.load_model_ensemble([str(path)])[0][0].eval()
    assert model.decoder.block.attn.content_kv_mode == "shared"
    assert not hasattr(model.decoder.block.attn, "content_k_proj")
    assert all(torch.equal(v, old["model"][k]) for k, v in model.state_dict().items())


def test_checkpoints_with_and_without_w_prime_load_as_they_were_trained(cocon_data, cocon_ckpt, tmp_path):
    """Today's checkpoints have no W' (--cocon-content-prev-key 0, the default). One saved with W' (the earlier
    default: the flag 1 and content_prev_k_proj in the weights) loads with it, strictly, and decodes with it; one
    saved before the flag existed (no such attribute, no W') loads with one-column keys and the flag recorded 0."""
    from fairseq import checkpoint_utils

    state = torch.load(cocon_ckpt, weights_only=False)
    assert state["cfg"]["model"].cocon_content_prev_key == 0
    assert not any(".content_prev_k_proj." in k for k in state["model"])
    src, prev = torch.tensor([[4, 5, 6]]), torch.tensor([[2, 7, 8, 9]])
    base = checkpoint_utils.load_model_ensemble([str(cocon_ckpt)])[0][0].eval()
    # saved with W'
    dim = state["model"]["decoder.block.attn.q_proj.weight"].size(0)
    with_prev = dict(state)
    with_prev["model"] = dict(state["model"])
    with_prev["model"]["decoder.block.attn.content_prev_k_proj.weight"] = torch.randn(dim, dim)
    with_prev["cfg"]["model"] = argparse.Namespace(**dict(vars(state["cfg"]["model"]), cocon_content_prev_key=1))
    path = tmp_path / "with_prev.pt"
    torch.save(with_prev, path)
    model = checkpoint_utils.load_model_ensemble([str(path)])[0][0].eval()
    assert model.args.cocon_content_prev_key == 1 and hasattr(model.decoder.block.attn, "content_prev_k_proj")
    assert set(model.state_dict()) == set(with_prev["model"])
    assert all(torch.equal(v, with_prev["model"][k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert not torch.allclose(model(src, None, prev)[0], base(src, None, prev)[0], atol=1e-4)  # W' is used
    # saved before the flag existed
    old = dict(state)
    old["model"] = {k: v for k, v in state["model"].items() if ".content_prev_k_proj." not in k}
    old["cfg"]["model"] = argparse.Namespace(
        **{k: v for k, v in vars(state["cfg"]["model"]).items() if k != "cocon_content_prev_key"}
    )
    path = tmp_path / "old.pt"
    torch.save(old, path)
    model = checkpoint_utils.load_model_ensemble([str(path)])[0][0].eval()
    assert not hasattr(model.decoder.block.attn, "content_prev_k_proj")
    assert model.args.cocon_content_prev_key == 0
    assert all(torch.equal(v, old["model"][k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(model(src, None, prev)[0], base(src, None, prev)[0])


def test_checkpoint_from_before_the_prefix_states_flag_keeps_the_block_states(cocon_data, cocon_ckpt, tmp_path):
    """Today's checkpoints (decoder.cocon_version) decode with the LM's own states before the prompt's last token
    (Eq. 7, --cocon-prefix-states lm); one saved before the flag existed (no cocon_version, no attribute) loads
    strictly with the block's states everywhere, as it was trained (the prompt lengths change nothing)."""
    from fairseq import checkpoint_utils

    state = torch.load(cocon_ckpt, weights_only=False)
    assert "decoder.cocon_version" in state["model"] and state["cfg"]["model"].cocon_prefix_states == "lm"
    old = dict(state)
    old["model"] = {k: v for k, v in state["model"].items() if k != "decoder.cocon_version"}
    old["cfg"]["model"] = argparse.Namespace(
        **{k: v for k, v in vars(state["cfg"]["model"]).items() if k != "cocon_prefix_states"}
    )
    path = tmp_path / "old.pt"
    torch.save(old, path)
    before = checkpoint_utils.load_model_ensemble([str(path)])[0][0].eval()
    today = checkpoint_utils.load_model_ensemble([str(cocon_ckpt)])[0][0].eval()
    assert before.decoder.prefix_states == before.args.cocon_prefix_states == "block"
    assert today.decoder.prefix_states == "lm"
    assert all(torch.equal(v, state["model"][k]) for k, v in before.state_dict().items())
    src, prev, prompt = torch.tensor([[4, 5, 6]]), torch.tensor([[2, 7, 8, 9, 10]]), torch.tensor([3])
    with torch.no_grad():
        old_out = before(src, None, prev, prompt_lengths=prompt)[0]
        assert torch.equal(old_out, before(src, None, prev)[0])
        new_out = today(src, None, prev, prompt_lengths=prompt)[0]
        lm = today.decoder.lm(prev)[0]
    assert not torch.allclose(new_out, old_out, atol=1e-4)
    # before the prompt's last token the upper layers read the LM's own states: the LM's own predictions there
    assert torch.allclose(new_out[:, :3, : lm.size(-1)], lm[:, :3], atol=1e-5)


def test_checkpoint_whose_model_holds_the_discriminator_loads_and_resumes(cocon_data, cocon_ckpt, tmp_path):
    """A checkpoint saved when the discriminator was a part of the model (``discriminator.*`` in its weights, no
    criterion state) decodes without it, and fairseq-train resumes from it: the criterion's discriminator starts
    afresh, learns, and is saved in the criterion's state with its own optimizer's."""
    from fairseq import checkpoint_utils

    data, lm = cocon_data
    state = torch.load(cocon_ckpt, weights_only=False)
    assert not any(k.startswith("discriminator.") for k in state["model"])
    assert any(k.startswith("discriminator.") for k in state["criterion"])  # the criterion's own
    torch.manual_seed(8)
    mlp = HiddenStateDiscriminator(state["model"]["decoder.block.attn.q_proj.weight"].size(0), 64)
    old = dict(state, criterion=None)
    old["model"] = dict(state["model"], **{"discriminator." + k: v.clone() for k, v in mlp.state_dict().items()})
    folder = tmp_path / "old"
    folder.mkdir()
    torch.save(old, folder / "checkpoint_last.pt")
    model = checkpoint_utils.load_model_ensemble([str(folder / "checkpoint_last.pt")])[0][0]
    assert set(model.state_dict()) == set(state["model"])
    assert all(torch.equal(v, state["model"][k]) for k, v in model.state_dict().items())
    args = ["--cocon-lm-path", lm, "--cocon-cycle-start", "0", "--cocon-adv-start", "0", "--cocon-cycle-steps", "2"]
    # the fixture's lines (3-12 words) are too short for the fixed split's 10 + 20 tokens, so no row has a generated
    # fake: the teacher-forced fake gives every row to the discriminator
    args += ["--cocon-adv-fake", "teacher-forced"]
    proc = train_cli(
        data, "--arch", "cocon_lm_small", *args, "--cocon-disc-update-freq", "1", "--max-update", "2",
        "--save-dir", folder, "--reset-optimizer", save=True,
    )  # fmt: skip
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, log
    after = torch.load(folder / "checkpoint_last.pt", weights_only=False)
    assert after["optimizer_history"][-1]["num_updates"] == 2, log
    assert not any(k.startswith("discriminator.") for k in after["model"])
    assert not torch.equal(after["model"]["decoder.block.fc1.weight"], old["model"]["decoder.block.fc1.weight"]), log
    assert "loss_disc" in log
    assert after["criterion"]["discriminator._extra_state"]["adamw"]["state"], "no AdamW state saved"


@pytest.mark.parametrize("mode", ["cocon", "lm"])
@pytest.mark.parametrize("gen", [dict(beam=3), dict(beam=1, sampling=True, sampling_topp=0.9, sampling_topk=-1)])
def test_fixed_length_decoding_gives_every_prompt_exactly_n_tokens(cocon_data, mode, gen):
    """--cocon-fixed-len N (the authors' decoding: a fixed length, no EOS): every hypothesis is its prompt and
    exactly N generated tokens, no </s> before its end and no <s>, with prompts of different lengths (and none) in one batch,
    whatever --max-len-b says; also with --cocon-mode lm (the plain and the prompted LM)."""
    from fairseq.dataclass.configs import GenerationConfig

    from fairseq_knowgen.tasks.cocon_generation import CoConSourceDataset

    n = 4
    task, model = build(cocon_data, "--cocon-fixed-len", str(n), "--cocon-mode", mode)
    assert model.decoder.bypass == (mode == "lm")
    d = task.target_dictionary
    lines = ["dog ball <prompt> the cat sat", "river <sep> boat", "swim <sep> park <prompt> a", "run <prompt> in the"]
    ds = CoConSourceDataset(task.encode_sources(lines), d)
    batch = ds.collater([ds[i] for i in range(len(ds))])
    generator = task.build_generator([model], GenerationConfig(max_len_a=0, max_len_b=2, **gen))
    hyps = task.inference_step(generator, [model], batch)
    assert len(hyps) == len(lines)
    for line, hs in zip(lines, hyps):
        prompt = [d.index(w) for w in line.split("<prompt>")[1].split()] if "<prompt>" in line else []
        assert hs
        for h in hs:
            toks = h["tokens"].tolist()
            assert len(toks) == len(prompt) + n + 1 and toks[-1] == d.eos(), (line, toks)
            assert toks[: len(prompt)] == prompt and d.eos() not in toks[:-1]
            assert d.bos() not in toks  # fairseq prints <s> as nothing: the text would read a token short
            assert len(h["positional_scores"]) == len(toks)  # one per token, as fairseq-generate prints them
    assert (generator.min_len, generator.max_len_a, generator.max_len_b) == (1, 0, 2)  # restored


def test_fairseq_generate_and_interactive(cocon_data, cocon_ckpt, tmp_path):
    data, lm = cocon_data
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "dict.txt").write_text((data / "dict.txt").read_text())
    lines = ["dog <sep> ball", "cat <prompt> the river", "swim park"] * 3
    (gen / "test.src").write_text("\n".join(lines) + "\n")
    common = ["--user-dir", "fairseq_knowgen", "--task", "cocon_generation", "--path", cocon_ckpt]
    common += ["--max-len-a", "0", "--max-len-b", "5", "--cpu", "--cocon-content-bias", "2"]
    out = run_cli("fairseq-generate", gen, *common, "--gen-subset", "test", "--beam", "3").stdout
    hyps = [x for x in out.splitlines() if x.startswith("H-")]
    assert len(hyps) == 9  # fairseq's batching drops none (its default --required-batch-size-multiple is 8)
    out = run_cli("fairseq-interactive", gen, *common, "--beam", "2", "--input", gen / "test.src").stdout
    hyps = [x.split("\t")[2] for x in out.splitlines() if x.startswith("H-")]
    assert len(hyps) == 9 and all(h.split()[:2] == ["the", "river"] for h in hyps[1::3])
    # the authors' decoding: sampling with top-p 0.9 for a fixed 3 tokens after the prompt
    sampling = ["--sampling", "--sampling-topp", "0.9", "--sampling-topk", "-1", "--beam", "1", "--seed", "1"]
    out = run_cli("fairseq-generate", gen, *common, "--gen-subset", "test", "--cocon-fixed-len", "3", *sampling).stdout
    hyps = {int(x.split("\t")[0][2:]): x.split("\t")[2].split() for x in out.splitlines() if x.startswith("H-")}
    scores = {int(x.split("\t")[0][2:]): x.split("\t")[1].split() for x in out.splitlines() if x.startswith("P-")}
    assert sorted(hyps) == list(range(9))
    for i, line in enumerate(lines):
        prompt = line.split("<prompt>")[1].split() if "<prompt>" in line else []
        assert len(hyps[i]) == len(prompt) + 3 and hyps[i][: len(prompt)] == prompt, (line, hyps[i])
        assert len(scores[i]) == len(hyps[i]) + 1  # and the final </s>


# -- bad input ---------------------------------------------------------------------------------------------------


def train_cli(data, *extra, save=False):
    return run_cli(
        "fairseq-train",
        data,
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--task",
        "cocon_generation",
        "--arch",
        "cocon_lm",
        "--criterion",
        "cocon",
        "--optimizer",
        "adam",
        "--max-update",
        "1",
        "--max-tokens",
        "500",
        *LINES,
        *([] if save else ["--no-save"]),
        *extra,
        check=False,
    )


@pytest.mark.parametrize("case", ["missing", "layer", "dictionary", "not_a_checkpoint"])
def test_incompatible_lm_stops_with_a_clear_message(cocon_data, tmp_path, case):
    from fairseq_knowgen.prep.cocon import save_untrained_lm

    data, lm = cocon_data
    args = ["--cocon-lm-path", lm]
    want = None
    if case == "missing":
        args, want = ["--cocon-lm-path", tmp_path / "nope.pt"], "LM checkpoint not found"
    elif case == "layer":
        args, want = args + ["--cocon-layer", "3"], "--cocon-layer 3 is outside the LM"
    elif case == "dictionary":
        other = tmp_path / "other"
        write_sentences(tmp_path / "o.txt", 30, 9)
        (tmp_path / "o.txt").write_text((tmp_path / "o.txt").read_text() + "zebra giraffe\n")
        run_cli("fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "o.txt", "--destdir", other)
        save_untrained_lm(str(other), str(other / "lm.pt"), layers=1, dim=8, heads=2)
        args, want = ["--cocon-lm-path", other / "lm.pt"], "the LM's dictionary differs from the data's"
    else:
        (tmp_path / "bad.pt").write_text("not a checkpoint")
        args, want = ["--cocon-lm-path", tmp_path / "bad.pt"], "bad.pt: cannot be read: not a torch checkpoint"
    proc = train_cli(data, *args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert want in proc.stderr


def test_empty_content_names_file_and_line(cocon_data, cocon_ckpt, tmp_path):
    data, lm = cocon_data
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "dict.txt").write_text((data / "dict.txt").read_text())
    (gen / "test.src").write_text("dog ball\n<sep> <prompt> the cat\nriver\n")
    task, model = build(cocon_data)
    from fairseq_knowgen.textio import DataError

    with pytest.raises(DataError, match=r"test.src:2: empty content"):
        task.encode_sources((gen / "test.src").read_text().splitlines(), str(gen / "test.src"))
    proc = run_cli(
        "fairseq-generate",
        gen,
        "--user-dir",
        "fairseq_knowgen",
        "--task",
        "cocon_generation",
        "--gen-subset",
        "test",
        "--path",
        cocon_ckpt,
        "--cpu",
        check=False,
    )
    assert proc.returncode == 2 and "test.src:2: empty content" in proc.stderr, proc.stderr[-2000:]


def test_interactive_empty_content_exits_2(cocon_data, tmp_path):
    task, model = build(cocon_data)
    d = task.target_dictionary
    src = [d.encode_line("<prompt> the", add_if_not_exist=False).long()]
    with pytest.raises(SystemExit) as e:
        task.build_dataset_for_inference(src, [src[0].numel()])
    assert e.value.code == 2


# -- no host-device syncs -----------------------------------------------------------------------------------------


def test_training_step_and_decoding_steps_make_no_host_device_sync(cocon_data):
    """On the meta device every host-device sync raises (``.item()``, ``bool()``, ``.tolist()`` of a
    device tensor): a training step with all four losses on (the discriminator learning) and the
    block's incremental decoding steps run there, so they make none (fairseq's own trainer and
    search are not part of this)."""
    task, model = build(cocon_data, "--criterion", "cocon")
    crit = CoConCriterion(task, cocon_cycle_start=0, cocon_adv_start=0, cocon_cycle_steps=3)
    batch = first_batch(task)
    meta = {
        "target": batch["target"].to("meta"),
        "ntokens": batch["ntokens"],
        "net_input": {k: (v.to("meta") if torch.is_tensor(v) else v) for k, v in batch["net_input"].items()},
    }
    model, crit = model.to("meta").train(), crit.to("meta")
    crit.set_update_num(0)
    loss, size, log = crit(model, meta)
    assert loss.device.type == size.device.type == log["loss_self"].device.type == "meta"
    loss.backward()
    # decoding: the block's first call with the content, then one step at a time, a beam reorder between
    block = CoConBlock(8, 2, 16, dropout=0.0).to("meta").eval()
    state = {}
    h, c = torch.randn(3, 4, 8, device="meta"), torch.randn(5, 2, 8, device="meta")
    rows = torch.tensor([0, 0, 1, 1], device="meta")
    block(h, c, content_rows=rows, incremental_state=state)
    for _ in range(3):
        out, _ = block(torch.randn(1, 4, 8, device="meta"), incremental_state=state)
        block.attn.reorder_incremental_state(state, torch.tensor([1, 0, 2, 3], device="meta"))
    assert out.shape == (1, 4, 8)


def test_the_discriminator_keeps_its_float32_weights_when_fairseq_casts_the_criterion():
    """fairseq casts the criterion with --fp16 / --bf16 (``criterion.half()``): the discriminator, trained by its own
    float32 AdamW, keeps its weights, bit for bit (no round trip through float16); a move (``.to``) still applies."""
    from fairseq_knowgen.modules.cocon_discriminator import build_discriminator
    from fairseq_knowgen.optim.discriminator_optimizer import DiscriminatorOptimizer

    torch.manual_seed(3)
    disc = DiscriminatorOptimizer(build_discriminator("cnn", 16, 8))
    before = {k: v.detach().clone() for k, v in disc.discriminator.named_parameters()}
    assert any(not torch.equal(v, v.half().float()) for v in before.values())  # a round trip would show
    for cast in (torch.nn.Module.half, torch.nn.Module.bfloat16):
        cast(disc)
        for k, v in disc.discriminator.named_parameters():
            assert v.dtype == before[k].dtype and torch.equal(v, before[k]), k
    disc.to(torch.device("meta"))
    assert all(p.device.type == "meta" for p in disc.parameters())
