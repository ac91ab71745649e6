"""convert.hf_bert on the files users bring (``../shared/released`` where it exists, small stand-ins with the
same odd features where it does not), run as a user runs it: a subprocess started in a temporary folder.

- Google's Chinese ``vocab.txt`` (U+2028 on line 344, ``##`` + U+2028 on line 13,503) under a tiny random
  ``BertModel``: every BERT row lands on the fairseq row of its token, the two unnameable tokens under their
  stand-ins ``<bert-id-N>``, which the character tokenizer never produces;
- the real ``all-MiniLM-L6-v2`` (``tokenizer.json`` only, safetensors): converted, started as
  ``--arch kbert_base --kbert-pretrained`` with no size flag, it gives ``transformers``' last hidden states
  within 1e-4 on several sentences, one of 512 tokens;
- a failed conversion leaves no folder (and an earlier one as it was); a refusal names a dozen tensors
  and a count."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from helpers import build_task_and_model
from released import released

CONVERT = "fairseq_knowgen.convert.hf_bert"
SPECIAL_IDS = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>", "[MASK]": "<mask>"}


def convert_elsewhere(hf_dir, out_dir, cwd):
    """``python -m fairseq_knowgen.convert.hf_bert HF OUT`` started in ``cwd`` (not the repository)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)  # this checkout's package, whatever is installed
    assert os.path.abspath(cwd) != ROOT
    return subprocess.run(
        [sys.executable, "-m", CONVERT, str(hf_dir), str(out_dir)], cwd=cwd, env=env, capture_output=True, text=True
    )


def chinese_vocab(tmp_path):
    """Google's Chinese vocab.txt lines (split at '\\n' only), or a stand-in with its odd lines: the
    specials where BERT has them, U+2028 and '##' + U+2028, an empty token, a fairseq symbol."""
    path = released("bert-base-chinese", "vocab.txt")
    if path is None:
        chars = [chr(0x4E00 + i) for i in range(40)]
        tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 4)] + chars[:5] + ["\u2028"] + chars[5:10]
        tokens += ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "<s>", ""] + chars[10:] + ["##\u2028", "##" + chars[0]]
        path = tmp_path / "vocab.txt"
        path.write_bytes(("\n".join(tokens) + "\n").encode("utf-8"))
    text = open(path, "rb").read().decode("utf-8")
    lines = text.split("\n")
    return path, lines[:-1] if lines[-1] == "" else lines


def expected_rows(dict_txt, tokens):
    """BERT id of each fairseq id, read independently: fairseq's specials, then dict.txt's lines
    (split at '\\n' only) as a token of ``tokens`` or a stand-in ``<bert-id-N>``, then <mask>."""
    index = {}
    for i, t in enumerate(tokens):
        index[t] = i  # a repeated token is BERT's last id
    rows = [index["[CLS]"], index["[PAD]"], index["[SEP]"], index["[UNK]"]]
    for line in open(dict_txt, "rb").read().decode("utf-8").split("\n")[:-1]:
        sym = line.rsplit(" ", 1)[0]
        rows.append(int(sym[len("<bert-id-") : -1]) if sym.startswith("<bert-id-") else index[sym])
    return rows + [index["[MASK]"]]


def test_chinese_vocabulary_keeps_every_bert_row(tmp_path):
    from transformers import BertConfig, BertModel

    from fairseq_knowgen.modules.knowledge_graph import char_tokenize

    vocab_path, tokens = chinese_vocab(tmp_path)
    hf_dir = tmp_path / "zh_bert"
    hf_dir.mkdir()
    (hf_dir / "vocab.txt").write_bytes(open(vocab_path, "rb").read())
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tokens), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(str(hf_dir))
    (tmp_path / "work").mkdir()
    proc = convert_elsewhere(hf_dir, tmp_path / "out", tmp_path / "work")
    assert proc.returncode == 0, proc.stderr[-3000:]
    dict_txt = tmp_path / "out" / "dict.txt"
    symbols = [line.rsplit(" ", 1)[0] for line in dict_txt.read_text(encoding="utf-8").split("\n")[:-1]]
    assert len(symbols) + 5 == len(tokens)  # BERT's row count: the 5 specials are fairseq's own symbols
    odd = {i: t for i, t in enumerate(tokens) if t == "" or any(c.isspace() for c in t) or t == "<s>"}
    assert "\u2028" in odd.values() and "##\u2028" in odd.values()
    if released("bert-base-chinese") is not None:
        assert {i + 1 for i in odd} == {344, 13503}  # the lines the README names
    assert [s for s in symbols if s.startswith("<bert-id-")] == [f"<bert-id-{i}>" for i in sorted(odd)]
    rows = expected_rows(dict_txt, tokens)
    assert sorted(rows) == list(range(len(tokens)))  # every BERT row once: the id order and row count kept
    ours = torch.load(tmp_path / "out" / "model.pt")["model"]["encoder.sentence_encoder.embed_tokens.weight"]
    theirs = BertModel.from_pretrained(str(hf_dir), local_files_only=True).embeddings.word_embeddings.weight
    assert ours.shape == theirs.shape and torch.equal(ours, theirs[torch.tensor(rows)])
    # the stand-ins are never produced: K-BERT's tokenizer drops whitespace and yields single characters
    assert char_tokenize("头\u2028痛 ##\u2028") == ["头", "痛", "#", "#"]


def minilm_folder(tmp_path):
    """The real all-MiniLM-L6-v2 folder, or a tiny random stand-in in the same form (config.json,
    model.safetensors, tokenizer.json only: no vocab.txt)."""
    path = released("all-MiniLM-L6-v2")
    if path is not None:
        return path
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    words = "the a cat dog sat on mat and ran to park ##s ##ed quick brown fox jumps over lazy".split()
    vocab = {t: i for i, t in enumerate(["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    folder = tmp_path / "minilm"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=40, max_position_embeddings=512)
    model = BertModel(cfg)
    with torch.no_grad():  # HF starts LayerNorms at 1 / 0 and biases at 0: make every tensor matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(str(folder))
    assert not (folder / "vocab.txt").exists()
    return str(folder)


def test_minilm_tokenizer_json_only_matches_transformers(tmp_path):
    from tokenizers import Tokenizer
    from transformers import BertModel

    src = minilm_folder(tmp_path)
    assert not os.path.exists(os.path.join(src, "vocab.txt"))
    (tmp_path / "work").mkdir()
    out = tmp_path / "out"
    proc = convert_elsewhere(src, out, tmp_path / "work")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a task folder on the converted dictionary; the arch's sizes come from the checkpoint (no size flag)
    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.txt").write_bytes((out / "dict.txt").read_bytes())
    for split in ("train", "valid"):
        (data / f"{split}.tsv").write_text("label\ttext_a\n0\tcat\n1\tdog\n", encoding="utf-8")
    task, model, args = build_task_and_model(
        data, "kbert_base", "--kbert-pretrained", out / "model.pt", "--max-positions", "512",
        task="kbert_classification",
    )
    cfg = json.load(open(os.path.join(src, "config.json")))
    assert (args.encoder_layers, args.encoder_embed_dim) == (cfg["num_hidden_layers"], cfg["hidden_size"])
    assert (args.encoder_attention_heads, args.encoder_ffn_embed_dim) == (cfg["num_attention_heads"],
                                                                          cfg["intermediate_size"])
    model.eval()
    hf = BertModel.from_pretrained(src, local_files_only=True).eval()
    tokenizer = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    rows = expected_rows(out / "dict.txt", [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda x: x[1])])
    fairseq_id = {bert: i for i, bert in enumerate(rows)}
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 80)
    sentences = ["A cat sat on the mat.", "The dog ran to the park and sat", "quick brown foxes", long]
    lengths = []
    for text in sentences:
        ids = tokenizer.encode(text).ids  # [CLS] ... [SEP]
        ids = ids if len(ids) <= 512 else ids[:511] + ids[-1:]
        lengths.append(len(ids))
        bert_ids = torch.tensor([ids])
        ours_ids = torch.tensor([[fairseq_id[i] for i in ids]])
        with torch.no_grad():
            expected = hf(input_ids=bert_ids).last_hidden_state
            ours = model.encoder(ours_ids)["encoder_out"][0].transpose(0, 1)
        assert (ours - expected).abs().max().item() < 1e-4, (text[:40], (ours - expected).abs().max().item())
    assert max(lengths) == 512


def test_failed_conversion_leaves_no_folder_and_keeps_the_old_one(tmp_path, monkeypatch):
    from fairseq import checkpoint_utils
    from transformers import BertConfig, BertModel

    from fairseq_knowgen.convert import hf_bert

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "甲", "乙"]
    (hf_dir / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    cfg = BertConfig(vocab_size=len(tokens) + 1, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16)
    BertModel(cfg).save_pretrained(str(hf_dir))
    (tmp_path / "work").mkdir()
    # a refusal: no folder at all
    (hf_dir / "vocab.txt").write_text("\n".join(tokens + ["丙", "丁"]) + "\n", encoding="utf-8")  # 9 > vocab_size 8
    proc = convert_elsewhere(hf_dir, tmp_path / "new", tmp_path / "work")
    assert proc.returncode == 2 and "vocab.txt: 9 tokens" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["hf", "work"]
    # a failure while writing: the earlier output stays byte for byte, no temporary folder is left
    (hf_dir / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")  # 7 tokens: row 8 a stand-in
    hf_bert.convert(str(hf_dir), str(tmp_path / "out"), allow_vocab_mismatch=True)
    assert "<bert-id-7> 1" in (tmp_path / "out" / "dict.txt").read_text(encoding="utf-8")
    before = {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")}

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_utils, "torch_persistent_save", fail)
    (hf_dir / "vocab.txt").write_text("\n".join(tokens[:5] + ["乙", "甲"]) + "\n", encoding="utf-8")  # another dict
    with pytest.raises(OSError, match="disk full"):
        hf_bert.convert(str(hf_dir), str(tmp_path / "out"), allow_vocab_mismatch=True)
    assert {f: (tmp_path / "out" / f).read_bytes() for f in os.listdir(tmp_path / "out")} == before
    assert sorted(os.listdir(tmp_path)) == ["hf", "out", "work"]


def test_a_refusal_names_a_dozen_tensors_and_a_count():
    from torch import nn

    from fairseq_knowgen.convert.fairseq_legacy import load_pretrained_part
    from fairseq_knowgen.textio import DataError

    module = nn.Sequential(*[nn.Linear(2, 2) for _ in range(20)])  # 40 tensors
    state = {"enc.0.weight": torch.zeros(2, 2)}
    with pytest.raises(DataError) as e:
        load_pretrained_part(module, state, "enc.", "ckpt.pt")
    msg = str(e.value)
    assert msg.startswith("ckpt.pt: refusing a partial load: 39 tensor(s) of the model not in the checkpoint")
    assert msg.count(".weight") + msg.count(".bias") == 12 and msg.endswith("... and 27 more")


def test_a_vocabulary_of_another_size_is_refused_unless_meant(tmp_path, capsys):
    """Google's Chinese vocab.txt beside a BERT of more rows (a padded embedding, or another model): refused,
    naming both sizes, and nothing written; with --allow-vocab-mismatch converted, the extra rows stand-ins,
    and the difference said on stderr."""
    from transformers import BertConfig, BertModel

    from fairseq_knowgen.convert import hf_bert
    from fairseq_knowgen.textio import DataError

    vocab_path, tokens = chinese_vocab(tmp_path)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "vocab.txt").write_bytes(open(vocab_path, "rb").read())
    cfg = BertConfig(vocab_size=len(tokens) + 10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=16)
    BertModel(cfg).save_pretrained(str(hf_dir))
    with pytest.raises(DataError, match=rf"vocab.txt: {len(tokens)} tokens for the {len(tokens) + 10} embedding rows"):
        hf_bert.main([str(hf_dir), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    hf_bert.main([str(hf_dir), str(tmp_path / "out"), "--allow-vocab-mismatch"])
    symbols = [line.rsplit(" ", 1)[0] for line in (tmp_path / "out" / "dict.txt").read_text("utf-8").split("\n")[:-1]]
    assert symbols[-10:] == [f"<bert-id-{len(tokens) + i}>" for i in range(10)]
    assert f"{len(tokens)} tokens for {len(tokens) + 10} rows: the 10 rows without a token" in capsys.readouterr().err
