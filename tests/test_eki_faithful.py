"""EKI as the paper ("An Enhanced Knowledge Injection Model for Commonsense Generation") and the
authors' code (LibertFan/EKI-BART) define it, against references written here in plain PyTorch from
the paper, with random non-zero weights: the group embedding (Eq. 3) in the encoder's input, the
scaling module (Eq. 5) alone and on the encoder output, the authors' dropout placement; the input
layouts, the L_E label units and the position-indicator centers by hand; the defaults of the
faithfulness table (docs/methods/eki.md); the loss, label-smoothed L_D + lambda L_E (Eq. 6, 10)."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL
from fairseq.data import Dictionary, LanguagePairDataset

from fairseq_knowgen.data.eki_dataset import EKIDataset
from fairseq_knowgen.modules.scaling_module import ScalingModule


def reference_scaling(h, w1, b1, w2, b2, act):
    """Eq. 5: Lambda = sigmoid(W2 act(W1 h + b1) + b2), h <- h (2 Lambda), every channel apart."""
    hidden = act(torch.einsum("sd,...d->...s", w1, h) + b1)
    lam = 1.0 / (1.0 + torch.exp(-(torch.einsum("ds,...s->...d", w2, hidden) + b2)))
    return h * 2.0 * lam, lam


def gelu(x):  # erf GELU, BART's (the authors' activation)
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_scaling_module_is_eq5(activation):
    torch.manual_seed(0)
    m = ScalingModule(12, 7, activation=activation, init_std=0.3).eval()
    with torch.no_grad():  # non-zero biases too
        m.fc1.bias.normal_()
        m.fc2.bias.normal_()
    h = torch.randn(4, 3, 12)
    act = {"relu": lambda x: x.clamp(min=0), "gelu": gelu}[activation]
    want, want_lam = reference_scaling(h, m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias, act)
    out, lam = m(h)
    torch.testing.assert_close(lam, want_lam, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    assert (2 * lam - 1).abs().max() > 0.1  # far from the identity: the test sees the weights


def test_scaling_dropout_where_the_authors_put_it():
    """The authors' Adaptor: dropout on the input of W1 and on the hidden units; the state that
    is scaled is the undropped h."""
    torch.manual_seed(0)
    m = ScalingModule(10, 6, init_std=0.4, dropout=0.3).train()
    h = torch.randn(5, 10)
    torch.manual_seed(7)
    out, lam = m(h)
    torch.manual_seed(7)  # the same masks, drawn in the same order
    x = F.dropout(h, 0.3, training=True)
    hidden = F.dropout(torch.relu(x @ m.fc1.weight.T + m.fc1.bias), 0.3, training=True)
    want_lam = torch.sigmoid(hidden @ m.fc2.weight.T + m.fc2.bias)
    torch.testing.assert_close(lam, want_lam)
    torch.testing.assert_close(out, h * 2 * want_lam)


def make_dict(words):
    d = Dictionary()
    for w in words:
        d.add_symbol(w)
    return d


WORDS = "dog run <sep> the dog@@ s are run@@ ning fast runs".split()


def encode(d, text):
    return torch.tensor([d.index(w) for w in text.split()] + [d.eos()])


def dataset(d, src, tgt, **settings):
    return EKIDataset(LanguagePairDataset([src], [len(src)], d, [tgt], [len(tgt)], d), d, **settings)


def test_concat_layout_is_the_papers_s_equals_c_o_by_hand():
    d = make_dict(WORDS)
    src = encode(d, "dog run <sep> the dog@@ s are run@@ ning fast")
    tgt = encode(d, "the dog runs")
    a = dataset(d, src, tgt)[0]  # defaults: concat layout, token centers, token labels
    # <s> C O </s>: <sep> out, <s> first, in the concepts' group
    assert [d[i] for i in a["source"].tolist()] == "<s> dog run the dog@@ s are run@@ ning fast </s>".split()
    assert a["group"].tolist() == [1, 1, 1] + [2] * 8
    # centers by id (Eq. 7, s_p = c): none of the prototype's pieces is 'dog' or 'run' ('dog@@', 'run@@' are
    # other tokens): every prototype token gets the no-center distance
    assert a["distance"][:3].tolist() == [0, 0, 0] and (a["distance"][3:] > 10**6).all()
    # labels by id: 'dog' and 'the' are target ids; 'run' is not ('runs' is); <s> and </s> left out
    assert a["label"].tolist() == [-1, 1, 0, 1, 0, 0, 0, 0, 0, 0, -1]


def test_token_centers_and_word_labels_by_hand():
    d = make_dict(WORDS + ["cat"])
    src = encode(d, "dog run <sep> the dog runs and run fast")
    tgt = encode(d, "the dog@@ s run")
    a = dataset(d, src, tgt, layout="sep", label_unit="word")[0]
    # centers: 'dog' (3 positions after <sep>: 2nd prototype token) and 'run' (5th); 'runs' is another id
    assert a["distance"].tolist() == [0, 0, 0, 2, 1, 2, 2, 1, 2, 3]
    # words of the target: the, dogs, run: 'dog' is not 'dogs'
    assert a["label"].tolist() == [0, 1, -1, 1, 0, 0, 0, 1, 0, -1]
    lemma = dataset(d, src, tgt, layout="sep", center_match="lemma")[0]
    assert lemma["distance"].tolist() == [0, 0, 0, 2, 1, 1, 2, 1, 2, 3]  # 'runs' matches 'run' by lemma


def encoder_input(model, net):
    """The encoder's input to its first layer (eval mode: no dropout), caught with a hook."""
    caught = []
    hook = model.encoder.layers[0].register_forward_pre_hook(lambda mod, args: caught.append(args[0]))
    try:
        model.encoder(net["src_tokens"], net["src_lengths"], net["src_group"], net["src_distance"])
    finally:
        hook.remove()
    return caught[0]  # T x B x C


@pytest.mark.parametrize("arch", ["eki_transformer", "eki_bart_base"])
def test_group_embedding_is_eq3_in_the_encoder_input(eki_bin, arch):
    """E(c_j) = E_B(c_j) + E_C, E(o_k) = E_B(o_k) + E_O (Eq. 3), E_B the model's own token (scaled)
    and position embeddings; BART's embedding LayerNorm then normalizes the sum."""
    from helpers import build_task_and_model, first_batch

    torch.manual_seed(0)
    task, model, _ = build_task_and_model(eki_bin, arch, *TINY_MODEL, "--eki-scaling-dim", "8", task="eki_generation")
    model.eval()
    with torch.no_grad():
        model.encoder.group_embedding.embed.weight[1:].normal_()  # E_C, E_O far from their small start
    batch = first_batch(task)
    net = batch["net_input"]
    src, group = net["src_tokens"], net["src_group"]
    d = task.source_dictionary
    real = src.ne(d.pad())
    # the groups by hand from the data's 'concepts <sep> prototype' rows: <s> and the concepts 1, the rest 2
    for b, i in enumerate(batch["id"].tolist()):
        raw = task.datasets["valid"].dataset.src[i].tolist()
        n_concepts = raw.index(d.index("<sep>"))
        ids = src[b][real[b]].tolist()
        assert ids == [d.bos()] + raw[:n_concepts] + raw[n_concepts + 1 :]
        assert group[b][real[b]].tolist() == [1] * (1 + n_concepts) + [2] * (len(ids) - 1 - n_concepts)
    got = encoder_input(model, net)
    enc = model.encoder
    table = enc.group_embedding.embed.weight
    E_tok = enc.embed_tokens.weight[src] * enc.embed_scale  # B x S x C
    E_pos = enc.embed_positions(src)
    E_grp = torch.where(group.eq(1).unsqueeze(-1), table[1], torch.where(group.eq(2).unsqueeze(-1), table[2], 0.0))
    want = E_tok + E_pos + E_grp  # Eq. 3
    if enc.layernorm_embedding is not None:  # BART
        ln = enc.layernorm_embedding
        want = F.layer_norm(want, (want.size(-1),), ln.weight, ln.bias, ln.eps)
    torch.testing.assert_close(got.transpose(0, 1)[real], want[real], atol=1e-5, rtol=1e-5)


def test_scaling_module_on_the_encoder_output(eki_bin):
    """The encoder's output is its last layer's states h times 2 Lambda(h) (Eq. 5), with Mean(Lambda)
    the L_E probability; the states computed with the module taken out, Lambda by the reference."""
    from helpers import build_task_and_model, first_batch

    flags = ["--eki-scaling-dim", "8", "--eki-scaling-activation", "gelu", "--eki-scaling-init-std", "0.5"]
    torch.manual_seed(0)
    task, model, _ = build_task_and_model(eki_bin, "eki_transformer", *TINY_MODEL, *flags, task="eki_generation")
    model.eval()
    net = first_batch(task)["net_input"]
    args = (net["src_tokens"], net["src_lengths"], net["src_group"], net["src_distance"])
    with torch.no_grad():
        out = model.encoder(*args)
        scaling, model.encoder.scaling = model.encoder.scaling, None
        plain = model.encoder(*args)
        model.encoder.scaling = scaling
    h = plain["encoder_out"][0]
    want, lam = reference_scaling(h, scaling.fc1.weight, scaling.fc1.bias, scaling.fc2.weight, scaling.fc2.bias, gelu)
    torch.testing.assert_close(out["encoder_out"][0], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["eki_lambda_mean"][0], lam.mean(-1).transpose(0, 1), atol=1e-6, rtol=1e-5)
    assert (out["encoder_out"][0] - h).abs().max() > 1e-3


def test_defaults_are_the_faithfulness_tables(eki_bin):
    """Paper first, then the authors' code: ReLU (paper), d_s 512, dropout = --dropout, N(0, 1e-3^2)
    (authors), E_C/E_O ~ N(0, 0.01^2), E_D ~ N(0, 0.005^2), lambda 0.5, concat layout, token labels
    and centers, concept labels as the paper's Eq. 6."""
    from helpers import build_task_and_model

    from fairseq_knowgen.criterions.eki_label_smoothed_cross_entropy import EKILossConfig

    torch.manual_seed(0)
    task, model, args = build_task_and_model(
        eki_bin, "eki_bart_base", *TINY_MODEL, "--dropout", "0.25", task="eki_generation"
    )
    s = model.encoder.scaling
    assert (s.fc1.out_features, s.activation_name, s.init, s.dropout.p) == (512, "relu", "normal", 0.25)
    assert s.fc1.weight.std().item() == pytest.approx(1e-3, rel=0.1)
    g = model.encoder.group_embedding.embed.weight
    assert g[0].abs().max() == 0 and g[1:].std().item() == pytest.approx(0.01, rel=0.3)
    e_d = model.decoder.layers[0].encoder_attn.distance_embed.weight
    assert e_d.std().item() == pytest.approx(5e-3, rel=0.2)
    assert EKILossConfig().eki_lambda == 0.5 and EKILossConfig().eki_concept_label == "target"
    cfg = task.cfg
    assert (cfg.eki_input_layout, cfg.eki_center_match, cfg.eki_label_unit) == ("concat", "token", "token")


def test_a_checkpoint_is_read_with_the_data_settings_it_was_trained_with():
    """fairseq-generate passes the checkpoint's saved task config: one saved before the options
    existed was trained on 'C <sep> O' with lemma centers and word labels; a newer one says its own."""
    import argparse

    from omegaconf import OmegaConf

    from fairseq_knowgen.data.eki_dataset import LEGACY_DATA_SETTINGS, data_settings
    from fairseq_knowgen.tasks.eki_generation import EKIGenerationConfig

    old = OmegaConf.create({"_name": "eki_generation", "data": "bin", "eki_max_distance": 64})
    assert data_settings(old, legacy=True) == LEGACY_DATA_SETTINGS
    assert LEGACY_DATA_SETTINGS == {"eki_input_layout": "sep", "eki_center_match": "lemma", "eki_label_unit": "word"}
    saved = OmegaConf.create({"eki_input_layout": "concat", "eki_center_match": "token", "eki_label_unit": "word"})
    assert data_settings(saved, legacy=True) == dict(saved)
    args = argparse.Namespace(eki_input_layout="sep", eki_center_match="token", eki_label_unit="token")
    assert data_settings(args, legacy=True)["eki_input_layout"] == "sep"  # a model's args (fairseq-interactive)
    fresh = {"eki_input_layout": "concat", "eki_center_match": "token", "eki_label_unit": "token"}
    assert data_settings(EKIGenerationConfig()) == fresh


@pytest.mark.parametrize("epsilon", [0.1, 0.3])
def test_loss_is_label_smoothed_l_d_plus_lambda_l_e(eki_bin, epsilon):
    """``eki_label_smoothed_cross_entropy`` with label smoothing epsilon > 0 (the authors' 0.1, and 0.3) against
    L_D and L_E written here from their definitions, on a tiny eki_transformer with random weights and a scaling
    module far from its start:

    q_t(w) = 1 - epsilon for w = t_k, epsilon / (|V| - 1) for every other word (fairseq's label smoothing);
    L_D = - sum_k sum_w q_k(w) log P(w | O, C, t_<k)            (Eq. 10's L_D, smoothed; pad targets left out);
    L_E = - sum_v [y_v log Mean(Lambda_v) + (1 - y_v) log(1 - Mean(Lambda_v))]  (Eq. 6, labelled tokens only);
    loss = L_D + lambda L_E, and the logged nll_loss = - sum_k log P(t_k | ...)."""
    from helpers import build_task_and_model, first_batch

    lam_weight = 0.7
    flags = ["--eki-scaling-dim", "8", "--eki-scaling-init-std", "0.5", "--dropout", "0"]
    flags += ["--criterion", "eki_label_smoothed_cross_entropy", "--label-smoothing", str(epsilon)]
    flags += ["--eki-lambda", str(lam_weight)]
    torch.manual_seed(0)
    task, model, args = build_task_and_model(eki_bin, "eki_transformer", *TINY_MODEL, *flags, task="eki_generation")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every weight random and non-zero
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        # one random output row of the scaling module for every channel: Mean(Lambda_v) over channels then varies
        # from token to token as one channel's Lambda does (independent rows would average out near 0.5)
        fc2 = model.encoder.scaling.fc2.weight
        fc2.copy_(torch.randn(1, fc2.size(1), generator=gen).expand_as(fc2))
        model.decoder.output_projection.weight.mul_(10.0)  # P far from uniform, so that smoothing moves L_D
    sample = first_batch(task)
    model.train()  # dropout 0: the criterion's own forward gives the same output
    with torch.no_grad():
        out = model(**sample["net_input"])
        lprobs = torch.log_softmax(out[0].double(), -1)  # B x T x V
        mean_lambda = out[1]["eki_lambda_mean"].double()  # B x S
        loss, _, log = task.build_criterion(args)(model, sample)
    d = task.target_dictionary
    target = sample["target"]
    real = target.ne(d.pad())
    vocab = lprobs.size(-1)
    q = torch.full_like(lprobs, epsilon / (vocab - 1)).scatter(-1, target.unsqueeze(-1), 1.0 - epsilon)
    l_d = -(q * lprobs).sum(-1)[real].sum()
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[real].sum()
    labels = sample["src_label"]
    labelled = labels.ge(0)
    y, m = labels[labelled].double(), mean_lambda[labelled]
    l_e = -(y * m.log() + (1 - y) * (1 - m).log()).sum()
    assert labelled.sum() > 10 and 0 < y.mean() < 1 and m.std() > 0.01  # both labels, Lambda not constant
    # summed over 60 target tokens and 72 labelled source tokens in float32 (each term ~1e-7 relative): 1e-5
    # relative, 100 times below the smoothing term's share, so that a wrong smoothing fails
    assert (l_d - nll).abs() > 100 * 1e-5 * l_d
    assert float(loss) == pytest.approx(float(l_d + lam_weight * l_e), rel=1e-5)
    assert float(log["nll_loss"]) == pytest.approx(float(nll), rel=1e-5)
    assert float(log["loss_e"]) == pytest.approx(float(l_e), rel=1e-5)
