"""EKI models and modules: the documented start (with the exact-start flags EKI-BART computes
BART's function before its first update; new parameters at their EKI init after fairseq's own
init and after --restore-file), the position indicator's single query projection and cached E_D (beam search
included), option checks, and the one-dictionary requirement."""

import argparse
import math
import shutil

import pytest
import torch
from conftest import TINY_BART, TINY_MODEL, pretrain_tiny_bart
from helpers import first_batch

from fairseq_knowgen.models.eki import eki_defaults
from fairseq_knowgen.modules.position_indicator import PositionIndicatorAttention
from fairseq_knowgen.modules.scaling_module import ScalingModule


def train_args(data, arch, *extra, task="eki_generation"):
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(
        parser, [str(data), "--task", task, "--arch", arch, "--cpu", "--user-dir", "fairseq_knowgen", *map(str, extra)]
    )


def build_model(data, arch, *extra):
    """The task (no data loaded) and the model fairseq-train would build."""
    from fairseq import tasks

    args = train_args(data, arch, *extra)
    task = tasks.setup_task(args)
    return task, task.build_model(args)


# --- scaling module (Eq. 5): exact identity at the start, every weight still trainable


def test_mirrored_scaling_starts_exactly_at_identity_with_live_gradients():
    torch.manual_seed(0)
    m = ScalingModule(32, 16, init_std=1e-3, init="mirrored")
    h = torch.randn(5, 3, 32)
    out, lam = m(h)
    # old init (plain N(0, 1e-3^2)): |2 Lambda - 1| ~ 1e-5 everywhere
    assert (2 * lam - 1).abs().max().item() == 0.0
    assert torch.equal(out, h)
    # marginally each weight is still N(0, std^2); halves mirrored
    w1, w2 = m.fc1.weight, m.fc2.weight
    assert 0.8e-3 < w1[:8].std().item() < 1.2e-3 and 0.8e-3 < w2[:, :8].std().item() < 1.2e-3
    assert torch.equal(w1[8:], w1[:8]) and torch.equal(w2[:, 8:], -w2[:, :8])
    # unlike W2 = 0, every weight gets a gradient at the first step (DDP and Adam see them all)
    (out * torch.randn_like(out)).sum().add(lam.mean()).backward()
    assert all(p.grad.abs().min() > 0 for p in (m.fc1.weight, m.fc2.weight, m.fc2.bias))


def test_normal_scaling_init_is_the_papers():
    torch.manual_seed(0)
    m = ScalingModule(64, 32, init_std=0.01, init="normal")
    for w in (m.fc1.weight, m.fc2.weight):
        assert 0.009 < w.std().item() < 0.011
    assert not torch.equal(m.fc1.weight[16:], m.fc1.weight[:16])
    out, lam = m(torch.randn(4, 64))
    assert 0 < (2 * lam - 1).abs().max() < 0.02  # near 1, not exactly


@pytest.mark.parametrize("kwargs", [{"inner_dim": 0}, {"inner_dim": 4, "init_std": 0.0}, {"inner_dim": 4, "init": "x"}])
def test_scaling_module_rejects_bad_options(kwargs):
    with pytest.raises(ValueError, match="scaling module"):
        ScalingModule(8, **kwargs)


# --- position indicator (Eq. 9): one q projection per call, E_D cached with the keys


def beam_inputs(bsz=2, beam=3, tgt_len=4, src_len=5, dim=8):
    torch.manual_seed(0)
    q = torch.randn(tgt_len, bsz * beam, dim)
    kv = torch.randn(src_len, bsz, dim).repeat_interleave(beam, dim=1)  # beams share a source
    dist = torch.randint(0, 5, (bsz, src_len)).repeat_interleave(beam, dim=0)
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    pad[1, :2] = True  # left padding of the second sentence
    return q, kv, dist, pad.repeat_interleave(beam, dim=0)


def count_calls(module):
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_position_indicator_projects_query_once_and_caches_distance_keys():
    """Incremental decoding with beam search (fairseq keeps one copy of the keys per
    sentence) and a beam reorder equals the full computation on the expanded batch, with
    one q projection per call and E_D looked up once (the old code: two q projections per
    call and E_D on every step)."""
    q, kv, dist, pad = beam_inputs()
    pia = PositionIndicatorAttention(8, 2, max_distance=4).eval()
    with torch.no_grad():
        pia.distance_embed.weight.normal_()
        full, _ = pia(q, kv, kv, key_padding_mask=pad, distances=dist)
    q_calls, e_calls, k_calls = count_calls(pia.q_proj), count_calls(pia.distance_embed), count_calls(pia.k_proj)
    pia.set_beam_size(3)
    state, steps = {}, []
    order = torch.tensor([2, 0, 1, 4, 5, 3])  # reorder within each sentence's beams
    with torch.no_grad():
        for t in range(q.size(0)):
            if t == 2:
                pia.reorder_incremental_state(state, order)
            steps.append(pia(q[t : t + 1], kv, kv, key_padding_mask=pad, incremental_state=state, distances=dist)[0])
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-6, rtol=1e-6)
    assert len(q_calls) == q.size(0) and len(k_calls) == 1 and len(e_calls) == 1
    assert pia._get_input_buffer(state)["prev_key"].shape == (2, 2, 5, 4)  # kv_bsz x H x S x d


def test_position_indicator_by_hand_with_padding():
    """Eq. 9 written out: softmax((W_q q)(W_k k + E_D(D))^T / sqrt(d_k)) over non-padding keys."""
    q, kv, dist, pad = beam_inputs(beam=1)
    pia = PositionIndicatorAttention(8, 2, max_distance=4)
    with torch.no_grad():
        pia.distance_embed.weight.normal_()
    _, w = pia(q, kv, kv, key_padding_mask=pad, distances=dist, need_head_weights=True)
    Q = pia.q_proj(q).transpose(0, 1).reshape(2, 4, 2, 4)  # B x T x H x dh
    K = (pia.k_proj(kv).transpose(0, 1) + pia.distance_embed(dist)).reshape(2, 5, 2, 4)
    logits = torch.einsum("bthd,bshd->hbts", Q, K) / math.sqrt(4)
    logits = logits.masked_fill(pad[None, :, None, :], float("-inf"))
    torch.testing.assert_close(w, torch.softmax(logits, -1), atol=1e-6, rtol=1e-6)


# --- options


@pytest.mark.parametrize("flag", ["--eki-scaling-dim", "--eki-max-distance"])
def test_zero_is_refused_at_the_command_line(eki_bin, flag, capsys):
    """The old ``x or default`` turned 0 into the default silently."""
    with pytest.raises(SystemExit) as e:
        train_args(eki_bin, "eki_transformer", flag, "0")
    assert e.value.code == 2
    assert f"argument {flag}: must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name,value,flag",
    [
        ("eki_scaling_dim", 0, "--eki-scaling-dim"),
        ("eki_max_distance", 0, "--eki-max-distance"),
        ("eki_scaling_init_std", 0.0, "--eki-scaling-init-std"),
    ],
)
def test_eki_defaults_never_replace_a_given_value(name, value, flag):
    with pytest.raises(ValueError, match=flag):
        eki_defaults(argparse.Namespace(**{name: value}))
    args = argparse.Namespace(eki_group_embeddings=0, eki_scaling=0, eki_position_indicator=0)
    eki_defaults(args)
    assert (args.eki_group_embeddings, args.eki_scaling, args.eki_position_indicator) == (0, 0, 0)
    assert args.eki_scaling_dim == 512 and args.eki_max_distance == 64 and args.eki_position_layers == "all"
    assert args.eki_scaling_activation == "relu" and args.eki_scaling_init == "normal"
    assert args.eki_scaling_dropout is None  # the model's --dropout


def test_old_checkpoint_args_keep_their_scaling_module():
    """Args saved before the activation and dropout options: ReLU, no dropout, their d_s."""
    old = argparse.Namespace(eki_scaling_dim=128, eki_scaling_init="mirrored", dropout=0.3)
    eki_defaults(old)
    assert (old.eki_scaling_dim, old.eki_scaling_activation, old.eki_scaling_dropout) == (128, "relu", 0.0)


@pytest.mark.parametrize("spec", ["2", "x", ""])  # old: names --dimattn-layers; "" became "all"
def test_bad_position_layers_names_its_flag(eki_bin, spec):
    with pytest.raises(ValueError, match="--eki-position-layers"):
        build_model(eki_bin, "eki_transformer", *TINY_MODEL, "--eki-position-layers", spec)


def test_separate_dictionaries_are_refused(eki_bin, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(eki_bin, data)
    with open(data / "dict.tgt.txt", "a") as f:
        f.write("zebra 1\n")
    with pytest.raises(ValueError, match="one dictionary for source and target.*--joined-dictionary"):
        build_model(data, "eki_transformer", *TINY_MODEL)
    build_model(eki_bin, "eki_transformer", *TINY_MODEL)  # two dictionary objects, same symbols: fine


# --- EKI-BART starts as BART


def eki_parameters(model):
    return {n: p.detach() for n, p in model.named_parameters() if "group_embedding" in n or "distance_embed" in n}


# the exact start: EKI-BART computes BART's function before its first update
EXACT_START = ["--eki-group-init-std", "0", "--eki-distance-init-std", "0", "--eki-scaling-init", "mirrored"]


def assert_eki_start(model, std, group_std=0.0, distance_std=0.0):
    new = eki_parameters(model)
    assert any("group_embedding" in n for n in new) and any("distance_embed" in n for n in new)
    for n, p in new.items():  # BART's init made them N(0, 0.02^2)
        want = group_std if "group_embedding" in n else distance_std
        if "group_embedding" in n:
            assert p[0].abs().max() == 0, n  # the padding row
            p = p[1:]
        if want == 0:
            assert p.abs().max().item() == 0.0, n
        else:
            assert 0.6 * want < p.std().item() < 1.4 * want, n
    s = model.encoder.scaling
    half = s.fc1.out_features // 2 if s.init == "mirrored" else s.fc1.out_features
    for w in (s.fc1.weight[:half], s.fc2.weight[:, :half]):
        assert 0.6 * std < w.std().item() < 1.4 * std  # BART's init: 0.02
    assert s.fc1.bias.abs().max() == 0 and s.fc2.bias.abs().max() == 0


def test_new_parameters_survive_barts_init(eki_bin):
    torch.manual_seed(0)
    _, model = build_model(
        eki_bin, "eki_bart_base", *TINY_BART, "--eki-scaling-dim", "8", "--eki-scaling-init-std", "0.005", *EXACT_START
    )
    assert_eki_start(model, 0.005)
    # the defaults: the authors' small random start, not BART's 0.02
    _, model = build_model(eki_bin, "eki_bart_base", *TINY_BART, "--eki-scaling-dim", "64")
    assert_eki_start(model, 1e-3, group_std=0.01, distance_std=5e-3)
    # BART's own parameters keep BART's init
    assert 0.015 < model.encoder.embed_tokens.weight.std().item() < 0.025


@pytest.fixture(scope="module")
def tiny_bart(eki_bin, tmp_path_factory):
    return pretrain_tiny_bart(eki_bin, tmp_path_factory.mktemp("bart"), updates=3)[0]


def test_eki_bart_restored_from_bart_computes_barts_outputs(eki_bin, tiny_bart, tmp_path):
    """fairseq-train's own restore path (--restore-file and the reset flags, in-process):
    before any update, EKI-BART's decoder outputs equal BART's to 1e-5, and the new
    parameters are at their EKI init."""
    from fairseq import checkpoint_utils, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = train_args(
        eki_bin,
        "eki_bart_base",
        *TINY_BART,
        "--eki-scaling-dim",
        "8",
        *EXACT_START,
        "--criterion",
        "eki_label_smoothed_cross_entropy",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "1000",
        "--restore-file",
        tiny_bart,
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
        "--reset-lr-scheduler",
        "--save-dir",
        tmp_path,
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)

    bart = checkpoint_utils.load_model_ensemble([str(tiny_bart)])[0][0]
    bart_state = bart.state_dict()
    for k, v in model.state_dict().items():  # the pretrained weights were loaded
        if k in bart_state:
            assert torch.equal(v, bart_state[k]), k
    task.load_dataset("valid")
    net = first_batch(task)["net_input"]
    model.eval(), bart.eval()
    with torch.no_grad():
        ours = model(**net)[0]
        theirs = bart(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])[0]
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert_eki_start(model, 1e-3)
