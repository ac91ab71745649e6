"""HuggingFace BART -> fairseq BART (``python -m fairseq_knowgen.convert.hf_bart``), checked against
``transformers`` on the real released files where ``../shared/released`` exists (GPT-2's BPE, BART's
``dict.txt`` order) and on small stand-ins where it does not: the GPT-2 ids rebuilt from the merges,
one row per HF id, the same token ids for a cased sentence and the same logits (1e-4) through
fairseq's own ``BARTModel.from_pretrained``, the ``tokenizer.json``-only folder, and the refusals
(non-zero ``final_logits_bias``, a dozen names and a count, tensors left unset, no half-made folder)."""

import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, run_cli
from released import released

from fairseq_knowgen.convert import hf_bart
from fairseq_knowgen.textio import DataError

TEXT = "A Dog catches the Frisbee in Central Park."


def stand_in_bpe(folder):
    """Small GPT-2 BPE files and a BART-like dict.txt over them (GPT-2 ids in a shuffled order,
    then fairseq's three madeupwords): for a clone without ../shared/released."""
    from test_eki_bart_released import write_tiny_gpt2_bpe

    words = "A Dog catches the Frisbee in Central Park dog park Two Kids throw ball then run".split()
    write_tiny_gpt2_bpe(folder, words)
    encoder = json.loads((folder / "encoder.json").read_text())
    encoder["<|endoftext|>"] = len(encoder)  # as in GPT-2's: after the last merge's token
    (folder / "encoder.json").write_text(json.dumps(encoder))
    ids = sorted(encoder.values())
    random.Random(0).shuffle(ids)
    madeup = "".join(f"madeupword000{k} 0\n" for k in range(3))
    (folder / "dict.txt").write_text("".join(f"{i} {len(ids) - k}\n" for k, i in enumerate(ids)) + madeup)
    return folder / "encoder.json", folder / "vocab.bpe", folder / "dict.txt"


def released_or_stand_in(folder):
    """(encoder.json, vocab.bpe, dict.txt): the released GPT-2 BPE and BART dictionary where
    ../shared/released exists, else stand-ins written into ``folder``."""
    files = (released("gpt2", "encoder.json"), released("gpt2", "vocab.bpe"), released("bart", "dict.txt"))
    return files if all(files) else stand_in_bpe(folder)


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory):
    return released_or_stand_in(tmp_path_factory.mktemp("bpe"))


def write_hf_bart(folder, encoder_json, vocab_bpe, dict_txt, seed=0, bias=None):
    """A tiny random ``BartForConditionalGeneration`` whose HF ids are ``dict_txt``'s rows (the
    ``vocab.json`` of facebook/bart-*: fairseq's specials, the dictionary's tokens, ``<mask>``), saved
    with its tokenizer; returns (model, tokenizer)."""
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizer

    by_id = {v: k for k, v in json.load(open(encoder_json, encoding="utf-8")).items()}
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for line in open(dict_txt, encoding="utf-8"):
        sym = line.rsplit(" ", 1)[0]
        vocab[by_id[int(sym)] if sym.isdigit() else sym] = len(vocab)
    vocab["<mask>"] = len(vocab)
    folder.mkdir(parents=True)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    shutil.copy(vocab_bpe, folder / "merges.txt")
    tokenizer = BartTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(seed)
    cfg = BartConfig(vocab_size=len(vocab), d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=24, max_position_embeddings=64)
    model = BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # HF's init leaves biases and layer norms at 0 / 1: make every tensor distinct
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        if bias is not None:
            model.final_logits_bias.fill_(bias)
    model.save_pretrained(str(folder))
    return model, tokenizer


@pytest.fixture(scope="module")
def converted(tmp_path_factory, bpe_files):
    root = tmp_path_factory.mktemp("hf_bart")
    hf, tokenizer = write_hf_bart(root / "hf", *bpe_files)
    elsewhere = root / "user"
    elsewhere.mkdir()
    # from the user's own folder, not the repository root (the package installed or on PYTHONPATH)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "fairseq_knowgen.convert.hf_bart", str(root / "hf"), "out"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dict.txt" in proc.stdout
    return hf, tokenizer, root / "hf", elsewhere / "out"


def test_gpt2_ids_rebuilt_from_the_merges(bpe_files):
    encoder_json, vocab_bpe, _ = bpe_files
    merges = [m for m in open(vocab_bpe, encoding="utf-8").read().split("\n")[1:] if m]
    assert hf_bart.gpt2_encoder(merges) == json.load(open(encoder_json, encoding="utf-8"))


def test_converted_bart_is_the_hf_one(converted, bpe_files):
    import fairseq_knowgen  # noqa: F401  (its allow-list lets torch load the checkpoint's args)
    from fairseq.models.bart import BARTModel

    hf, tokenizer, _, out = converted
    assert sorted(os.listdir(out)) == ["dict.txt", "encoder.json", "model.pt", "vocab.bpe"]
    encoder_json, vocab_bpe, dict_txt = bpe_files
    # dict.txt: each HF id's GPT-2 id, in the released order
    assert [x.split()[0] for x in open(out / "dict.txt")] == [x.split()[0] for x in open(dict_txt)]
    assert json.load(open(out / "encoder.json")) == json.load(open(encoder_json))
    assert open(out / "vocab.bpe").read().split("\n")[1:] == open(vocab_bpe).read().split("\n")[1:]
    bart = BARTModel.from_pretrained(str(out), checkpoint_file="model.pt", bpe="gpt2",
                                     gpt2_encoder_json=str(out / "encoder.json"),
                                     gpt2_vocab_bpe=str(out / "vocab.bpe")).eval()
    ids = bart.encode(TEXT)
    hf_ids = tokenizer(TEXT, return_tensors="pt").input_ids[0]
    assert ids.tolist() == hf_ids.tolist() and len(ids) > 5
    assert bart.decode(ids) == TEXT
    prev = torch.cat([hf_ids[-1:], hf_ids[:-1]]).unsqueeze(0)  # </s> then the text, as BART's decoder reads it
    with torch.no_grad():
        ours = bart.model(ids.unsqueeze(0), torch.tensor([len(ids)]), prev)[0]
        theirs = hf(input_ids=hf_ids.unsqueeze(0), decoder_input_ids=prev).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < 1e-4
    assert theirs.std().item() > 0.1  # not a trivially flat output


def test_tokenizer_json_alone_gives_the_same_folder(converted, tmp_path):
    _, _, hf_dir, out = converted
    only = tmp_path / "hf"
    shutil.copytree(hf_dir, only)
    for name in ("vocab.json", "merges.txt"):
        os.remove(only / name)
    hf_bart.convert(str(only), str(tmp_path / "out"))
    for name in ("dict.txt", "encoder.json", "vocab.bpe"):
        assert (tmp_path / "out" / name).read_bytes() == (out / name).read_bytes(), name


def test_final_logits_bias_is_refused_and_no_folder_is_left(tmp_path, bpe_files):
    write_hf_bart(tmp_path / "hf", *bpe_files, bias=0.5)
    proc = run_cli("-m", "fairseq_knowgen.convert.hf_bart", tmp_path / "hf", tmp_path / "out", check=False)
    assert proc.returncode == 2 and "final_logits_bias is not zero" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["hf"]  # neither out/ nor its temporary folder


def test_unused_tensors_named_a_dozen_and_a_count():
    hf = {"model.shared.weight": torch.zeros(8, 4), **{f"model.extra.{i:02d}": torch.zeros(1) for i in range(20)}}
    with pytest.raises(DataError, match=r"20 HF tensors not converted: model\.extra\.00, .*model\.extra\.11, "
                                        r"\.\.\. and 8 more$"):
        hf_bart.convert_state(hf)


def test_a_fairseq_tensor_left_unset_is_refused(converted, tmp_path, monkeypatch):
    _, _, hf_dir, _ = converted
    convert_state = hf_bart.convert_state

    def drop_one(hf):
        out = convert_state(hf)
        del out["decoder.layers.0.fc1.bias"]
        return out

    monkeypatch.setattr(hf_bart, "convert_state", drop_one)
    with pytest.raises(DataError, match="1 fairseq tensors left unset: decoder.layers.0.fc1.bias"):
        hf_bart.convert(str(hf_dir), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
