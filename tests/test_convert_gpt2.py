"""fairseq_knowgen.convert.hf_gpt2: a tiny random HuggingFace GPT-2, converted, gives GPT-2's logits
in fairseq (whole sequences and step by step), fairseq's GPT-2 BPE lands on the same rows, and
CoCon builds on it, trains a step and decodes with beam search."""

import json
import os

import pytest
import torch
from conftest import ROOT

from fairseq_knowgen.textio import DataError

WORDS = "dog cat ball park run jump the a and in".split()


def tiny_bpe(words, chars="abcdefghijklmnopqrstuvwxyz.,"):
    """A byte-level BPE as GPT-2's: one symbol per character (GPT-2's byte alphabet: ' ' is 'Ġ'),
    merges that make each ``" word"`` one token, ``<|endoftext|>`` last. Returns (vocab, merges)."""
    vocab = {c: i for i, c in enumerate(sorted(set(chars + "".join(words))) + ["Ġ"])}
    merges = []
    for w in sorted(set(words)):
        piece = "Ġ"
        for c in w:
            if piece + c not in vocab:
                merges.append((piece, c))
                vocab[piece + c] = len(vocab)
            piece += c
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


def save_tiny_gpt2(
    folder, words=WORDS, seed=0, chars="abcdefghijklmnopqrstuvwxyz.,", tokenizer_json=True, n_positions=32
):
    """A random GPT2LMHeadModel (2 layers x 16, 2 heads, ``n_positions``) and its tokenizer saved in
    ``folder``; every weight (LayerNorms too) ~ N(0, 0.5^2), so that each part of the network moves
    the logits. ``tokenizer_json``: the tokenizer as transformers saves it (tokenizer.json), else
    the hub's vocab.json + merges.txt. Returns the model (eval mode) and the HF tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    vocab, merges = tiny_bpe(words, chars)
    eos = vocab["<|endoftext|>"]
    cfg = GPT2Config(
        vocab_size=len(vocab), n_positions=n_positions, n_embd=16, n_layer=2, n_head=2, bos_token_id=eos, eos_token_id=eos
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.save_pretrained(folder)
    tok = GPT2Tokenizer(vocab=vocab, merges=merges)
    if tokenizer_json:
        tok.save_pretrained(folder)
    else:
        with open(os.path.join(folder, "vocab.json"), "w") as f:
            json.dump(vocab, f)
        with open(os.path.join(folder, "merges.txt"), "w") as f:
            f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return model, tok


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from fairseq import checkpoint_utils

    from fairseq_knowgen.convert.hf_gpt2 import convert

    root = tmp_path_factory.mktemp("gpt2")
    hf, tok = save_tiny_gpt2(root / "hf")
    path = convert(str(root / "hf"), str(root / "fs"))
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path])
    return hf, tok, models[0].eval(), task, root / "fs"


def rows_of(hf, task):
    """fairseq id of each GPT-2 id: str(id) in dict.txt, <|endoftext|> = </s>."""
    d, eos = task.dictionary, hf.config.eos_token_id
    return torch.tensor([d.eos() if i == eos else d.index(str(i)) for i in range(hf.config.vocab_size)])


def test_logits_equal_gpt2(converted):
    hf, _, model, task, _ = converted
    V, eos = hf.config.vocab_size, hf.config.eos_token_id
    rows = rows_of(hf, task)
    assert rows[0] == 4 and rows[eos] == task.dictionary.eos() and len(set(rows.tolist())) == V
    # GPT-2 reads <|endoftext|> w_1 .. w_n; fairseq's LM </s> w_1 .. w_n (positions from padding_idx + 1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V - 1, (3, 20), generator=g)
    ids[:, 0] = eos
    ids[1, 9] = eos  # a sentence end inside the text
    with torch.no_grad():
        want = hf(ids).logits
        got = model(rows[ids])[0]
    assert got.shape == (3, 20, V + 3)
    torch.testing.assert_close(got[..., rows], want, atol=1e-5, rtol=0)
    # <s> <pad> <unk> (absent from GPT-2) start as the mean embedding row: logit = mean GPT-2 logit,
    # so each has probability <= 1/V (Jensen)
    extra = [task.dictionary.bos(), task.dictionary.pad(), task.dictionary.unk()]
    torch.testing.assert_close(got[..., extra], want.mean(-1, keepdim=True).expand(-1, -1, 3), atol=1e-5, rtol=0)
    assert got.log_softmax(-1)[..., extra].exp().max() <= 1.0 / V


def test_incremental_equals_gpt2(converted):
    from helpers import decode_full_and_stepwise

    hf, _, model, task, _ = converted
    rows = rows_of(hf, task)
    ids = torch.randint(0, hf.config.vocab_size - 1, (2, 12), generator=torch.Generator().manual_seed(2))
    ids[:, 0] = hf.config.eos_token_id
    with torch.no_grad():
        want = hf(ids).logits
    _, steps = decode_full_and_stepwise(model, None, rows[ids])
    got = torch.stack([out[0][:, -1] for out in steps], dim=1)
    torch.testing.assert_close(got[..., rows], want, atol=1e-5, rtol=0)


def test_fairseq_gpt2_bpe_ids_line_up(converted):
    """Text through fairseq's GPT-2 BPE (the converted encoder.json/vocab.bpe) and the converted
    dict.txt lands on the rows of the ids HF's tokenizer gives."""
    from argparse import Namespace

    from fairseq.data import encoders
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    hf, tok, _, task, out = converted
    bpe = encoders.build_bpe(
        convert_namespace_to_omegaconf(
            Namespace(bpe="gpt2", gpt2_encoder_json=str(out / "encoder.json"), gpt2_vocab_bpe=str(out / "vocab.bpe"))
        ).bpe
    )
    text = "the dog and a cat run in the park, jump."
    hf_ids = tok(text)["input_ids"]
    assert len(hf_ids) < len(text.split()) + 6  # the merges were applied
    fs = task.dictionary.encode_line(bpe.encode(text), add_if_not_exist=False, append_eos=True)
    assert fs.tolist() == rows_of(hf, task)[hf_ids].tolist() + [task.dictionary.eos()]
    assert bpe.decode(task.dictionary.string(fs)) == text


def test_hub_tokenizer_files(tmp_path):
    """vocab.json / merges.txt (the hub's names) become encoder.json / vocab.bpe."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    from fairseq_knowgen.convert.hf_gpt2 import copy_bpe_files

    _, tok = save_tiny_gpt2(tmp_path, tokenizer_json=False)
    assert copy_bpe_files(str(tmp_path), str(tmp_path)) == ["encoder.json", "vocab.bpe"]
    enc = get_encoder(str(tmp_path / "encoder.json"), str(tmp_path / "vocab.bpe"))
    assert enc.encode(" dog cat. ball") == tok(" dog cat. ball")["input_ids"]


def test_refuses_what_fairseq_cannot_express():
    from transformers import GPT2Config

    from fairseq_knowgen.convert.hf_gpt2 import lm_flags

    with pytest.raises(DataError, match=r"x/config.json: .*layer_norm_epsilon 1e-06"):
        lm_flags(GPT2Config(layer_norm_epsilon=1e-6), "x/config.json")
    with pytest.raises(DataError, match="activation_function 'swish'"):
        lm_flags(GPT2Config(activation_function="swish"))


def test_cocon_on_converted_gpt2(converted, tmp_path):
    """CoCon on the converted GPT-2 (its dict.txt + <sep>/<prompt>): one training step moves only
    CoCon's parameters, and beam search decodes content-conditioned text."""
    import subprocess

    from conftest import BIN

    _, _, _, _, out = converted
    data = tmp_path / "data"
    data.mkdir()
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    enc = get_encoder(str(out / "encoder.json"), str(out / "vocab.bpe"))
    # lines of running text (40 words) that the default 30-token windows are cut from
    sents = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 41)) for i in range(1, 25)]
    (tmp_path / "train.txt").write_text("".join(" ".join(map(str, enc.encode(s))) + "\n" for s in sents))
    subprocess.run(
        [f"{BIN}/fairseq-preprocess", "--only-source", "--srcdict", out / "dict.txt", "--trainpref",
         tmp_path / "train.txt", "--validpref", tmp_path / "train.txt", "--destdir", data, "--workers", "1"],
        check=True, capture_output=True,
    )  # fmt: skip
    src = [" ".join(map(str, enc.encode(" dog"))) + " <sep> " + " ".join(map(str, enc.encode(" park")))]
    (data / "gen.src").write_text("\n".join(src * 3) + "\n")
    assert (data / "dict.txt").read_text() == (out / "dict.txt").read_text()
    run = tmp_path / "run"
    train = subprocess.run(
        [f"{BIN}/fairseq-train", data, "--user-dir", "fairseq_knowgen", "--task", "cocon_generation",
         "--arch", "cocon_lm", "--cocon-lm-path", out / "checkpoint.pt", "--cocon-layer", "1",
         "--criterion", "cocon", "--cocon-cycle-start", "0", "--cocon-adv-start", "0", "--tokens-per-sample", "32",
         "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--max-update", "1", "--cpu",
         "--save-dir", run, "--no-epoch-checkpoints", "--no-progress-bar", "--log-interval", "1", "--seed", "1"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert "loss_cycle" in train.stdout and "loss_adv" in train.stdout
    ck = torch.load(run / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    lm = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
    for k, v in lm.items():  # the frozen GPT-2 inside CoCon: unchanged by the step
        torch.testing.assert_close(ck["model"]["decoder.lm." + k[len("decoder.") :]], v, atol=0, rtol=0)
    gen = subprocess.run(
        [f"{BIN}/fairseq-generate", data, "--user-dir", "fairseq_knowgen", "--task", "cocon_generation",
         "--gen-subset", "gen", "--path", run / "checkpoint_last.pt", "--beam", "3", "--max-len-a", "0",
         "--max-len-b", "6", "--cocon-content-bias", "5", "--cpu", "--batch-size", "2"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr[-3000:]
    # (fairseq's --bpe gpt2 cannot print these sources: its decoder takes every symbol but <unk>/<mask> for an id)
    hyps = [x.split("\t")[2].split() for x in gen.stdout.splitlines() if x.startswith("H-")]
    assert len(hyps) == 3 and all(enc.decode([int(t) for t in h]).strip() for h in hyps)


def test_a_failed_conversion_leaves_the_output_folder_as_it_was(tmp_path):
    """A refusal after the checkpoint is written (encoder.json names an id beyond the model's embeddings) replaces
    nothing: the earlier OUT is byte-identical and no temporary folder is left; a good conversion then replaces
    its own files and keeps the user's."""
    from fairseq_knowgen.convert.hf_gpt2 import convert
    from fairseq_knowgen.textio import DataError

    save_tiny_gpt2(tmp_path / "hf", tokenizer_json=False)
    vocab = json.loads((tmp_path / "hf" / "vocab.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in (tmp_path / "hf").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "vocab.json").write_text(json.dumps({**vocab, "zzz": len(vocab) + 5}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"an earlier conversion")
    (out / "notes.txt").write_text("mine\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(DataError, match="BPE ids outside the model's"):
        convert(str(bad), str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    convert(str(tmp_path / "hf"), str(out))
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "checkpoint.pt").read_bytes() != before["checkpoint.pt"]
    assert {"dict.txt", "encoder.json", "vocab.bpe"} <= {p.name for p in out.iterdir()}
