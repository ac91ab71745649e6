"""copy_transformer + force_copy: every term against a hand computation, and end to end."""

import math

import pytest
import torch
from conftest import TINY_MODEL, TRAIN_COMMON, run_cli

from fairseq_knowgen.criterions.force_copy import force_copy_terms, switch_loss
from fairseq_knowgen.modules.copy_generator import CopyGenerator
from fairseq_knowgen.prep.placeholders import encode_pair, restore

EOS, UNK = 2, 3


def test_mixture_hand_computed():
    """P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} alpha_i (Eq. 6), EOS never copied."""
    gen = CopyGenerator(state_dim=2, context_dim=2, input_dim=2)
    torch.nn.init.zeros_(gen.switch.weight)
    torch.nn.init.constant_(gen.switch.bias, math.log(0.25 / 0.75))  # p_gen = 0.25
    logits = torch.zeros(1, 1, 6)  # P_vocab uniform = 1/6
    src = torch.tensor([[4, 5, 4, EOS]])  # word 4 occurs twice
    attn = torch.tensor([[[0.2, 0.3, 0.4, 0.1]]])
    copyable = torch.tensor([[True, True, True, False]])
    out = gen(logits, torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), attn, torch.randn(1, 4, 2), src, copyable)
    alpha = torch.tensor([0.2, 0.3, 0.4]) / 0.9
    expected = torch.full((6,), 0.25 / 6)
    expected[4] += 0.75 * (alpha[0] + alpha[2])
    expected[5] += 0.75 * alpha[1]
    torch.testing.assert_close(out["probs"][0, 0], expected)
    assert out["probs"].sum().item() == pytest.approx(1.0)
    assert out["p_gen"].item() == pytest.approx(0.25)
    assert out["copy_attn"][0, 0, 3].item() == 0.0


def test_loss_terms_hand_computed():
    """Target (4, UNK, 5, 7): 4 occurs twice in the source; UNK is out of vocabulary and not in
    the source; 5 is in the source; 7 (placeholder <unk-0>) is in the source and OOV."""
    src = torch.tensor([[4, 5, 4, 7, EOS]])
    copyable = torch.tensor([[True, True, True, True, False]])
    target = torch.tensor([[4, UNK, 5, 7]])
    is_oov = torch.zeros(8, dtype=torch.bool)
    is_oov[UNK] = is_oov[7] = True
    alpha = torch.tensor([[[0.1, 0.2, 0.3, 0.4, 0.0]] * 4])
    p_gen = torch.tensor([[[0.8], [0.6], [0.5], [0.1]]])
    vocab = torch.full((1, 4, 8), 0.05)
    vocab[0, :, 4], vocab[0, :, UNK], vocab[0, :, 5], vocab[0, :, 7] = 0.4, 0.2, 0.1, 0.0
    vocab = vocab / vocab.sum(-1, keepdim=True)
    copy = torch.zeros(1, 4, 8).scatter_add_(2, src.unsqueeze(1).expand(1, 4, 5), alpha)
    probs = p_gen * vocab + (1 - p_gen) * copy
    t = force_copy_terms(probs, vocab, p_gen, alpha, src, target, copyable, is_oov)

    pv = [vocab[0, i, w].item() for i, w in enumerate([4, UNK, 5, 7])]
    attn_mass = [0.1 + 0.3, 0.0, 0.2, 0.4]  # sum of alpha over positions holding the target
    pg = [0.8, 0.6, 0.5, 0.1]
    nll = [-math.log(pg[i] * pv[i] + (1 - pg[i]) * attn_mass[i]) for i in range(4)]
    assert t["nll"][0].tolist() == pytest.approx(nll, rel=1e-5)
    assert t["vocab"][0].tolist()[:3] == pytest.approx([-math.log(p) for p in pv[:3]], rel=1e-5)
    assert t["attn"][0].tolist() == pytest.approx([-math.log(0.4), 0.0, -math.log(0.2), -math.log(0.4)], rel=1e-5)
    assert t["copy_force"][0].tolist() == [True, False, True, True]
    assert t["copy_force_unk"][0].tolist() == [False, False, False, True]
    force = switch_loss(t["p_gen"], t["copy_force"])[0].tolist()
    assert force == pytest.approx([-math.log(0.2), -math.log(0.6), -math.log(0.5), -math.log(0.9)], rel=1e-5)
    unk = switch_loss(t["p_gen"], t["copy_force_unk"])[0].tolist()
    assert unk == pytest.approx([-math.log(0.8), -math.log(0.6), -math.log(0.5), -math.log(0.9)], rel=1e-5)


def test_placeholders_round_trip():
    vocab = {"was", "born", "in", "and", "<S>", "<P>", "<O>", "birth", "place", "."}
    src = "<S> Zorblat Quux <P> birth place <O> Xyloville <S> Zorblat".split()
    tgt = "Zorblat Quux was born in Xyloville and Nowhere .".split()
    s, t = encode_pair(src, tgt, vocab, max_positions=100)
    assert s == ["<S>", "<unk-1>", "<unk-2>", "<P>", "birth", "place", "<O>", "<unk-7>", "<S>", "<unk-1>"]
    assert t == ["<unk-1>", "<unk-2>", "was", "born", "in", "<unk-7>", "and", "<unk>", "."]
    assert restore(" ".join(t), src).split()[:6] == tgt[:6]


@pytest.fixture(scope="module")
def word_level_bin(tiny_raw, tmp_path_factory):
    """Tiny demo data at word level with a vocabulary of frequent words only: most names
    become <unk-N> placeholders."""
    out = tmp_path_factory.mktemp("copybin")
    run_cli(
        "-m",
        "fairseq_knowgen.prep.placeholders",
        "encode",
        "--train-prefix",
        tiny_raw / "train",
        "--splits",
        tiny_raw / "train",
        tiny_raw / "valid",
        tiny_raw / "test",
        "--out-dir",
        out / "text",
        "--min-count",
        "25",
        "--min-source-df",
        "1000",
        "--max-positions",
        "40",
    )
    run_cli(
        "fairseq-preprocess",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--srcdict",
        out / "text" / "dict.txt",
        "--tgtdict",
        out / "text" / "dict.txt",
        "--trainpref",
        out / "text" / "train",
        "--validpref",
        out / "text" / "valid",
        "--testpref",
        out / "text" / "test",
        "--destdir",
        out / "bin",
        "--workers",
        "1",
    )
    return out


TINY_COPY = ["--arch", "copy_transformer_small", *TINY_MODEL, "--criterion", "force_copy"]


@pytest.mark.parametrize("mode", ["none", "force", "force-unk"])
def test_each_mode_trains_and_loss_goes_down(word_level_bin, tmp_path, mode):
    import json

    out = run_cli(
        "fairseq-train",
        word_level_bin / "bin",
        *TRAIN_COMMON,
        *TINY_COPY,
        "--lr",
        "3e-3",
        "--copy-supervision",
        mode,
        "--max-update",
        "30",
        "--save-dir",
        tmp_path,
        "--log-format",
        "json"
    )
    inner = [
        json.loads(line[line.index("{") :])
        for line in (out.stdout + out.stderr).splitlines()
        if "| train_inner |" in line
    ]
    assert len(inner) == 30
    assert float(inner[-1]["loss"]) < 0.8 * float(inner[0]["loss"])
    for key in ("loss_vocab", "loss_attn", "loss_pgen", "copy_share", "p_gen"):
        assert key in inner[0]


def test_copies_unseen_words_end_to_end(word_level_bin, tiny_raw, tmp_path):
    """With the switch forced to copy (p_gen ~ 0), fairseq-generate outputs source words only,
    and restoring placeholders brings back words that are not in the vocabulary."""
    run_cli(
        "fairseq-train", word_level_bin / "bin", *TRAIN_COMMON, *TINY_COPY, "--max-update", "3", "--save-dir", tmp_path
    )
    ck = torch.load(tmp_path / "checkpoint_last.pt")
    ck["model"]["decoder.copy_generator.switch.weight"].zero_()
    ck["model"]["decoder.copy_generator.switch.bias"].fill_(-30.0)
    torch.save(ck, tmp_path / "copy_only.pt")
    gen = tmp_path / "gen.out"
    out = run_cli(
        "fairseq-generate",
        word_level_bin / "bin",
        "--user-dir",
        "fairseq_knowgen",
        "--cpu",
        "--path",
        tmp_path / "copy_only.pt",
        "--beam",
        "5",
        "--batch-size",
        "8",
        "--gen-subset",
        "test",
    )
    gen.write_text(out.stdout)
    run_cli(
        "-m",
        "fairseq_knowgen.prep.placeholders",
        "restore",
        "--gen",
        gen,
        "--src",
        tiny_raw / "test.src",
        "--out",
        tmp_path / "restored.out",
    )
    vocab = {line.split()[0] for line in (word_level_bin / "text" / "dict.txt").read_text().splitlines()}
    src = (tiny_raw / "test.src").read_text().splitlines()
    copied_oov = 0
    for line in (tmp_path / "restored.out").read_text().splitlines():
        if line.startswith("H-"):
            idx, _, text = line.split("\t")
            words = text.split()
            source_words = set(src[int(idx[2:])].split())
            assert set(words) <= source_words, (words, source_words)
            copied_oov += sum(w not in vocab for w in words)
    assert copied_oov > 0


@pytest.mark.parametrize("flags", [[], ["--dimattn-type", "dydim", "--copy-heads", "1"]])
def test_copy_incremental_equals_full(tiny_bin, flags):
    from helpers import build_task_and_model, decode_full_and_stepwise, first_batch

    task, model, _ = build_task_and_model(tiny_bin, "copy_transformer", *TINY_MODEL, *flags)
    model.eval()
    net = first_batch(task)["net_input"]
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    prev = net["prev_output_tokens"]
    (full, extra), steps = decode_full_and_stepwise(model, enc, prev)
    real = prev.ne(task.target_dictionary.pad())
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1)[real], full[real], atol=1e-5, rtol=1e-5)
    pgen = torch.cat([s[1]["p_gen"] for s in steps], 1)
    torch.testing.assert_close(pgen[real], extra["p_gen"][real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full.sum(-1)[real], torch.ones_like(full.sum(-1)[real]), atol=1e-5, rtol=0)


def test_copy_distribution_uses_diminishing_weights(tiny_bin):
    """With --dimattn-* the copy attention is the copy layer's diminishing weights, renormalized."""
    from helpers import build_task_and_model, first_batch

    from fairseq_knowgen.analysis.coverage import teacher_forced_maps
    from fairseq_knowgen.modules.diminishing_attention import DiminishingMultiheadAttention

    task, model, _ = build_task_and_model(
        tiny_bin, "copy_transformer", *TINY_MODEL, "--dimattn-type", "dim", "--copy-layer", "0"
    )
    model.eval()
    assert isinstance(model.decoder.layers[0].encoder_attn, DiminishingMultiheadAttention)
    assert not isinstance(model.decoder.layers[1].encoder_attn, DiminishingMultiheadAttention)
    net = first_batch(task)["net_input"]
    with torch.no_grad():
        _, extra = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
    maps = teacher_forced_maps(model, net["src_tokens"], net["src_lengths"], net["prev_output_tokens"], layer=0)
    used = maps["used"].mean(1)  # B x T x S, heads averaged
    copyable = ~model.decoder.special[net["src_tokens"]]
    used = used * copyable.unsqueeze(1)
    expected = used / used.sum(-1, keepdim=True)
    torch.testing.assert_close(extra["copy_attn"], expected, atol=1e-5, rtol=1e-5)
    raw = maps["raw"].mean(1) * copyable.unsqueeze(1)
    assert not torch.allclose(extra["copy_attn"], raw / raw.sum(-1, keepdim=True), atol=1e-3)
