"""The three generation methods composed by flags: EKI + copy head (``eki_* --copy``), EKI +
diminishing attention (``eki_* --dimattn-type``), all three, and copy + diminishing attention
(``copy_transformer --dimattn-type``); the ``eki_force_copy`` criterion (force-copy loss +
lambda L_E). For each: step-by-step decoding (with a beam reorder) equals full decoding,
the flags-off models keep today's parameters, the criterion is the sum of its logged
parts, a short fairseq-train lowers the loss, fairseq-generate decodes with beam 3, and the
checkpoint loads back into the same model. (Every parameter gets a gradient: tests/test_ddp_ready.py.)"""

import json
import math

import pytest
import torch
from conftest import TINY_BART, TINY_MODEL, TRAIN_COMMON, run_cli
from helpers import build_task_and_model, first_batch

from fairseq_knowgen.models.copy_transformer import uncopyable_mask
from fairseq_knowgen.models.eki import DiminishingPositionIndicatorAttention
from fairseq_knowgen.modules.diminishing_attention import DiminishingMultiheadAttention
from fairseq_knowgen.modules.position_indicator import PositionIndicatorAttention

EKI = ("eki_bin", "eki_generation", "eki_transformer", [*TINY_MODEL, "--eki-scaling-dim", "8"])
COPY = ("tiny_bin", "translation", "copy_transformer", [*TINY_MODEL])
# name: (data fixture, task, arch, size + flags, criterion, cross-attention class of each decoder layer)
PIA, DIM, PLAIN = PositionIndicatorAttention.__name__, DiminishingMultiheadAttention.__name__, "MHA"
BOTH = DiminishingPositionIndicatorAttention.__name__
COMBOS = {
    "eki+copy": (*EKI[:3], [*EKI[3], "--copy"], "eki_force_copy", [PIA, PIA]),
    "eki+dimattn": (*EKI[:3], [*EKI[3], "--dimattn-type", "dydim"], "eki_label_smoothed_cross_entropy", [PIA, BOTH]),
    "eki+copy+dimattn": (
        *EKI[:3],
        [*EKI[3], "--copy", "--copy-layer", "0", "--dimattn-type", "dim"],  # dimattn goes to the copy layer
        "eki_force_copy",
        [BOTH, PIA],
    ),
    "eki+copy+dimattn-all-pos-last": (
        *EKI[:3],
        [*EKI[3], "--copy", "--dimattn-type", "dydim", "--dimattn-layers", "all", "--eki-position-layers", "-1"],
        "eki_force_copy",
        [DIM, BOTH],
    ),
    "copy+dimattn": (*COPY[:3], [*COPY[3], "--dimattn-type", "dydim"], "force_copy", [PLAIN, DIM]),
    "ekibart+copy+dimattn": (
        "eki_bin",
        "eki_generation",
        "eki_bart_base",
        [*TINY_BART, "--eki-scaling-dim", "8", "--copy", "--dimattn-type", "dim"],
        "eki_force_copy",
        [BOTH],
    ),
}


def build(request, name, *extra):
    data, task, arch, flags, criterion, _ = COMBOS[name]
    return build_task_and_model(
        request.getfixturevalue(data), arch, *flags, "--criterion", criterion, *extra, task=task
    )


def layer_kinds(model):
    kinds = []
    for layer in model.decoder.layers:
        a = layer.encoder_attn
        kinds.append(PLAIN if type(a).__module__.startswith("fairseq.") else type(a).__name__)
    return kinds


def encode(model, net):
    if "src_group" in net:
        return model.encoder(net["src_tokens"], net["src_lengths"], net["src_group"], net["src_distance"])
    return model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])


# --- incremental decoding == full decoding, with a beam reorder in the middle


REORDER_AT = 3


@pytest.mark.parametrize("name", sorted(COMBOS))
def test_incremental_with_reorder_equals_full(request, name):
    """Step by step with fairseq's incremental state and a beam reorder after step 3 equals
    the full teacher-forced decoding (the mixture log P, p_gen and the copy attention).

    Beam-shaped batch: each source twice (two hypotheses), with different target prefixes,
    swapped within each pair after step 3 (EKI's targets all start ``</s> the``: the
    hypotheses must differ before the reorder), as beam search reorders (fairseq keeps the
    cross-attention keys per sentence; the coverage, running max and E_D lookups are per
    hypothesis and must move)."""
    task, model, _ = build(request, name)
    assert layer_kinds(model) == COMBOS[name][5]
    model.eval()
    with torch.no_grad():  # non-zero new parameters, so that every part matters
        for n, p in model.named_parameters():
            if "group_embedding" in n or "distance_embed" in n:
                p.normal_()
    net = first_batch(task)["net_input"]
    bsz = net["src_tokens"].size(0)
    beams = torch.arange(bsz).repeat_interleave(2)
    net = {k: (v[beams] if k != "prev_output_tokens" else v) for k, v in net.items()}
    other = torch.stack([torch.arange(bsz), (torch.arange(bsz) + 1) % bsz], 1).view(-1)
    prev = net["prev_output_tokens"][other]  # hypothesis 2 of a source: another sentence's prefix
    order = torch.arange(2 * bsz).view(bsz, 2).flip(1).reshape(-1)
    with torch.no_grad():
        enc = encode(model, net)
        full, extra = model.decoder(prev, encoder_out=enc)
        state, steps = {}, []
        for t in range(prev.size(1)):
            if t == REORDER_AT:
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
            rows = order if t >= REORDER_AT else torch.arange(2 * bsz)
            steps.append(model.decoder(prev[rows, : t + 1], encoder_out=enc, incremental_state=state))

    def decoded(x):  # what the steps decoded: rows as they were before the reorder, reordered after
        return torch.cat([x[:, :REORDER_AT], x[order, REORDER_AT:]], 1)

    real = decoded(prev.ne(task.target_dictionary.pad()))
    assert real[:, REORDER_AT:].any()
    full = model.get_normalized_probs((full, extra), log_probs=True)
    stepwise = torch.cat([model.get_normalized_probs(s, log_probs=True) for s in steps], 1)
    torch.testing.assert_close(stepwise[real], decoded(full)[real], atol=1e-5, rtol=1e-5)
    if "p_gen" in extra:
        for key in ("p_gen", "copy_attn"):
            got = torch.cat([s[1][key] for s in steps], 1)
            torch.testing.assert_close(got[real], decoded(extra[key])[real], atol=1e-5, rtol=1e-5)
        total = full.exp().sum(-1)[prev.ne(task.target_dictionary.pad())]
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-5, rtol=0)


def test_diminishing_position_indicator_is_both_by_hand():
    """The combined attention's weights are the diminishing weights (Eq. 4) of the softmax of
    Eq. 9's logits (E_D added to the keys), written out: coverage by cumulative sum, g = log(x+1)."""
    torch.manual_seed(0)
    tgt_len, bsz, src_len, dim, heads = 4, 2, 5, 8, 2
    q, kv = torch.randn(tgt_len, bsz, dim), torch.randn(src_len, bsz, dim)
    dist = torch.randint(0, 5, (bsz, src_len))
    attn = DiminishingPositionIndicatorAttention(dim, heads, max_distance=4, dim_type="dim", g="log")
    with torch.no_grad():
        attn.distance_embed.weight.normal_()
        _, w = attn(q, kv, kv, distances=dist, need_head_weights=True)
    Q = attn.q_proj(q).transpose(0, 1).reshape(bsz, tgt_len, heads, dim // heads)
    K = (attn.k_proj(kv).transpose(0, 1) + attn.distance_embed(dist)).reshape(bsz, src_len, heads, dim // heads)
    a = torch.softmax(torch.einsum("bthd,bshd->hbts", Q, K) / math.sqrt(dim // heads), -1)
    c = a.cumsum(2)
    expected = torch.log1p(c) - torch.log1p(c - a)  # g(c^t) - g(c^{t-1})
    torch.testing.assert_close(w, expected.detach(), atol=1e-6, rtol=1e-5)
    assert {n for n, _ in attn.named_parameters()} == {
        n for n, _ in PositionIndicatorAttention(dim, heads, max_distance=4).named_parameters()
    }


# --- flags off: today's parameters; flags on: only the parameters they use


def keys(request, data, task, arch, *flags):
    return set(build_task_and_model(request.getfixturevalue(data), arch, *flags, task=task)[1].state_dict())


EKI_NEW = ("encoder.group_embedding.", "encoder.scaling.", ".encoder_attn.distance_embed.")
SWITCH = {"decoder.copy_generator.switch.weight", "decoder.copy_generator.switch.bias"}


@pytest.mark.parametrize(
    "eki_arch,base_arch,size",
    [("eki_transformer", "transformer", TINY_MODEL), ("eki_bart_base", "bart_base", TINY_BART)],
)
def test_state_dict_keys_with_flags_off_and_on(request, eki_arch, base_arch, size):
    """With the new flags off, an EKI model has fairseq's keys plus EKI's own and nothing
    else (so its old checkpoints load strictly); --dimattn-* adds no key, --copy adds exactly
    the switch of Eq. 5; copy_transformer with --dimattn-* keeps its keys."""
    base = keys(request, "eki_bin", "translation", base_arch, *size)
    eki = keys(request, "eki_bin", "eki_generation", eki_arch, *size, "--eki-scaling-dim", "8")
    assert base <= eki and eki - base and all(any(p in k for p in EKI_NEW) for k in eki - base), eki - base
    flags = [*size, "--eki-scaling-dim", "8"]
    assert keys(request, "eki_bin", "eki_generation", eki_arch, *flags, "--dimattn-type", "dydim") == eki
    assert keys(request, "eki_bin", "eki_generation", eki_arch, *flags, "--copy") == eki | SWITCH
    both = keys(request, "eki_bin", "eki_generation", eki_arch, *flags, "--copy", "--dimattn-type", "dim")
    assert both == eki | SWITCH
    if base_arch == "transformer":
        plain = keys(request, "tiny_bin", "translation", "transformer", *TINY_MODEL)
        copy = keys(request, "tiny_bin", "translation", "copy_transformer", *TINY_MODEL)
        assert copy == plain | SWITCH
        assert (
            keys(request, "tiny_bin", "translation", "copy_transformer", *TINY_MODEL, "--dimattn-type", "dim") == copy
        )


def test_bad_copy_layer_is_refused(request):
    with pytest.raises(ValueError, match="--copy-layer 2 out of range for 2 decoder layers"):
        build(request, "eki+copy+dimattn", "--copy-layer", "2")
    with pytest.raises(ValueError, match="--copy-layer -3 out of range"):
        build(request, "eki+copy", "--copy-layer", "-3")


# --- what may be copied from an EKI source


def test_uncopyable_mask_by_hand():
    from fairseq.data import Dictionary

    d = Dictionary()
    ids = {w: d.add_symbol(w) for w in ["dog", "<sep>", "<mask>", "<unk-3>", "<S>"]}
    never = {d.pad(), d.eos(), d.bos(), d.unk(), ids["<sep>"], ids["<mask>"]}
    mask = uncopyable_mask(d, ("<sep>", "<mask>", "<absent>"))
    assert set(mask.nonzero().squeeze(1).tolist()) == never
    assert set(uncopyable_mask(d).nonzero().squeeze(1).tolist()) == never - {ids["<sep>"], ids["<mask>"]}


def test_sep_is_never_copied_from_an_eki_source(request):
    """With --copy-alpha renormalized the EKI copy head gives <sep> no copy attention (every concept
    and prototype token keeps some), P(<sep>) = p_gen P_vocab(<sep>), and a target <sep> is no copy
    step for the criterion, although <sep> is in every source (raw alpha, the default, copies it as
    Eq. 6 does; the criterion's copy candidates leave it out either way)."""
    # the sep input layout: the model reads <sep> (the default concat layout removes it from the source)
    task, model, args = build(
        request, "eki+copy", "--copy-supervision", "force", "--copy-alpha", "renormalized", "--eki-input-layout", "sep"
    )
    d = task.target_dictionary
    sep = d.index("<sep>")
    model.eval()
    sample = first_batch(task)
    src, target = sample["net_input"]["src_tokens"], sample["target"]
    at_sep = src.eq(sep)
    assert at_sep.sum(1).eq(1).all()
    target[:, 0] = sep
    with torch.no_grad():
        out = model(**sample["net_input"])
        lprobs, extra = model.get_normalized_probs(out, log_probs=True), out[1]
        _, _, log = task.build_criterion(args)(model, sample)
    alpha = extra["copy_attn"]
    assert (alpha.masked_select(at_sep.unsqueeze(1)) == 0).all()
    words = src.ne(d.pad()) & src.ne(d.eos()) & ~at_sep
    assert (alpha.masked_select(words.unsqueeze(1)) > 0).all()
    gen_only = torch.nn.functional.logsigmoid(extra["p_gen_logit"][..., 0]) + extra["vocab_lprobs"][..., sep]
    torch.testing.assert_close(lprobs[..., sep], gen_only, atol=1e-5, rtol=1e-5)
    never = {d.pad(), d.eos(), d.bos(), d.unk(), sep}
    expected = sum(w in set(s) - never for s, t in zip(src.tolist(), target.tolist()) for w in t if w != d.pad())
    assert int(log["copy_steps"]) == expected


# --- the combined criterion


def test_eki_force_copy_is_the_sum_of_its_logged_parts(request):
    """loss = force-copy loss + lambda L_E: the copy part equals what ``force_copy`` gives on
    the same output and is w_v loss_vocab + w_a loss_attn + w_p loss_pgen of the logged terms;
    L_E is the BCE of Mean(Lambda) against the labels, computed here by hand; both are logged
    and reduced (loss_e, acc_e next to loss_vocab, loss_attn, loss_pgen)."""
    from fairseq import metrics

    from fairseq_knowgen.criterions.force_copy import EKIForceCopyCriterion, ForceCopyCriterion

    task, model, args = build(request, "eki+copy+dimattn", "--eki-lambda", "0.7", "--attn-loss-weight", "2.0")
    crit = task.build_criterion(args)
    assert isinstance(crit, EKIForceCopyCriterion)
    model.eval()
    sample = first_batch(task)
    with torch.no_grad():
        loss, sample_size, log = crit(model, sample)
        copy_loss, copy_size, copy_log = ForceCopyCriterion(
            task, "force", 1.0, 2.0, 1.0, sentence_avg=False, oov_vocab_target="unk"
        )(model, sample)
        lam = model(**sample["net_input"])[1]["eki_lambda_mean"]
    labels = sample["src_label"]
    p = lam.clamp(1e-6, 1 - 1e-6)[labels.ge(0)].double()
    y = labels[labels.ge(0)].double()
    l_e = -(y * p.log() + (1 - y) * (1 - p).log()).sum().item()
    assert labels.ge(0).sum() > 0 and 0 < y.mean() < 1
    assert float(log["loss_e"]) == pytest.approx(l_e, rel=1e-5)
    assert int(log["n_e"]) == labels.ge(0).sum().item()
    assert loss.item() == pytest.approx(copy_loss.item() + 0.7 * l_e, rel=1e-5)
    assert copy_loss.item() == pytest.approx(
        float(log["loss_vocab"]) + 2.0 * float(log["loss_attn"]) + float(log["loss_pgen"]), rel=1e-5
    )
    for k in ("nll_loss", "loss_vocab", "loss_attn", "loss_pgen", "copy_steps", "p_gen_sum"):
        assert float(log[k]) == pytest.approx(float(copy_log[k]), rel=1e-6), k
    assert sample_size == copy_size == sample["ntokens"]
    with metrics.aggregate() as agg:
        crit.reduce_metrics([log])
    logged = agg.get_smoothed_values()
    for k in ("loss", "nll_loss", "loss_vocab", "loss_attn", "loss_pgen", "copy_share", "p_gen", "loss_e", "acc_e"):
        assert k in logged, k
    assert logged["loss_e"] == pytest.approx(l_e / int(log["n_e"]) / math.log(2), abs=1e-3)


def test_eki_force_copy_is_registered_as_ours():
    from fairseq.criterions import CRITERION_REGISTRY

    crit = CRITERION_REGISTRY["eki_force_copy"]
    assert crit.__module__ == "fairseq_knowgen.criterions.force_copy" and crit.__name__ == "EKIForceCopyCriterion"


# --- fairseq-train, fairseq-generate and the checkpoint of each composed configuration

TRAINED = ["eki+copy", "eki+dimattn", "eki+copy+dimattn", "copy+dimattn"]


@pytest.fixture(scope="module", params=TRAINED)
def trained(request, tmp_path_factory):
    name = request.param
    data, task, arch, flags, criterion, _ = COMBOS[name]
    data_dir = request.getfixturevalue(data)
    save = tmp_path_factory.mktemp("composed")
    out = run_cli(
        "fairseq-train",
        data_dir,
        *TRAIN_COMMON,
        "--task",
        task,
        "--arch",
        arch,
        *flags,
        "--criterion",
        criterion,
        "--lr",
        "3e-3",
        "--max-update",
        "20",
        "--save-dir",
        save,
        "--log-format",
        "json",
    )
    inner = [
        json.loads(line[line.index("{") :])
        for line in (out.stdout + out.stderr).splitlines()
        if "| train_inner |" in line
    ]
    return name, data_dir, task, save / "checkpoint_last.pt", inner


def test_training_lowers_the_loss_and_logs_every_part(trained):
    name, _, _, _, inner = trained
    assert len(inner) == 20
    first, last = (sum(float(r["loss"]) for r in rows) / 3 for rows in (inner[:3], inner[-3:]))
    assert last < first - 0.1, (first, last)
    parts = {"loss_e", "acc_e"} if "eki" in name else set()
    if "copy" in name:
        parts |= {"loss_vocab", "loss_attn", "loss_pgen", "copy_share", "p_gen"}
    assert parts <= set(inner[-1]), (parts, sorted(inner[-1]))


def test_generate_with_beam_3(trained):
    name, data_dir, task, ckpt, _ = trained
    gen = run_cli(
        "fairseq-generate",
        data_dir,
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--task",
        task,
        "--path",
        ckpt,
        "--beam",
        "3",
        "--batch-size",
        "4",
        "--gen-subset",
        "valid",
        "--required-batch-size-multiple",
        "1",
    )
    assert gen.stdout.count("\nH-") == (16 if "eki" in name else 24)


def test_checkpoint_round_trip(trained, request):
    """The checkpoint's model config rebuilds the composed model (same attention classes,
    copy head): it loads strictly, with every saved tensor, and computes what a model built
    from the command-line flags computes with the saved weights."""
    from fairseq import checkpoint_utils

    name, data_dir, task_name, ckpt, _ = trained
    (loaded,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)])
    saved = torch.load(ckpt)["model"]
    assert set(loaded.state_dict()) == set(saved)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert layer_kinds(loaded) == COMBOS[name][5]
    assert hasattr(loaded.decoder, "copy_generator") == ("copy" in name)
    t, fresh, _ = build(request, name)
    fresh.load_state_dict(saved, strict=True)
    loaded.eval(), fresh.eval()
    net = first_batch(t)["net_input"]
    with torch.no_grad():
        torch.testing.assert_close(loaded(**net)[0], fresh(**net)[0], rtol=0, atol=0)
