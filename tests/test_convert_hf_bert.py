"""convert.hf_bert: a tiny random HuggingFace BERT, converted, computes the same hidden states in K-BERT
(no KG) for single sentences and sentence pairs with token types; its vocabulary becomes the
dictionary in BERT's id order; bad vocabularies are refused naming the line."""

import os
import random
import shutil

import pytest
import torch
from conftest import run_cli
from helpers import build_task_and_model, first_batch

CHARS = list("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出")  # 30
SPECIALS = ["[PAD]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "64"]
TINY += ["--encoder-attention-heads", "2", "--max-positions", "40"]


def tiny_bert(path, seed=0):
    """A random 2-layer, 16-wide BertModel over CHARS (+ specials, a word piece, a Latin letter),
    saved with save_pretrained."""
    from transformers import BertConfig, BertModel

    vocab = SPECIALS[:3] + CHARS[:10] + SPECIALS[3:] + CHARS[10:] + ["##的", "a"]  # specials not at the front only
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=48,
    )
    model = BertModel(cfg).eval()
    with torch.no_grad():  # make the LayerNorms and token types matter (they start at 1 / 0 / small)
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "token_type" in name:
                p.add_(torch.randn_like(p) * 0.5)
    model.save_pretrained(path)
    return path, vocab


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_bert")
    hf_dir, vocab = tiny_bert(str(root / "hf"))
    run_cli("-m", "fairseq_knowgen.convert.hf_bert", hf_dir, root / "out")
    return hf_dir, vocab, root / "out"


def task_folder(path, out_dir, pairs, n=10, seed=1):
    """A classification folder on the converted dictionary (one character outside it: [UNK])."""
    rng = random.Random(seed)
    os.makedirs(path, exist_ok=True)
    shutil.copy(out_dir / "dict.txt", os.path.join(path, "dict.txt"))
    for split in ("train", "valid"):
        with open(os.path.join(path, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("label\ttext_a\ttext_b\n" if pairs else "label\ttext_a\n")
            for i in range(n):
                a = "".join(rng.choice(CHARS) for _ in range(rng.randint(3, 12))) + ("龘a" if i == 0 else "")
                b = "".join(rng.choice(CHARS) for _ in range(rng.randint(2, 9)))
                f.write(f"{i % 2}\t{a}\t{b}\n" if pairs else f"{i % 2}\t{a}\n")
    return path


def test_dictionary_is_bert_vocab_in_id_order_with_specials_mapped(converted):
    from fairseq.data import Dictionary

    _, vocab, out = converted
    d = Dictionary.load(str(out / "dict.txt"))
    d.add_symbol("<mask>")  # as the K-BERT tasks do
    assert len(d) == len(vocab)
    assert [d[i] for i in range(d.nspecial, len(d) - 1)] == [t for t in vocab if t not in SPECIALS or t == "[unused1]"]
    state = torch.load(out / "model.pt")["model"]
    from transformers import BertModel

    hf_dir = converted[0]
    emb = BertModel.from_pretrained(hf_dir, local_files_only=True).embeddings.word_embeddings.weight
    ours = state["encoder.sentence_encoder.embed_tokens.weight"]
    for fairseq_sym, bert_sym in [("<s>", "[CLS]"), ("<pad>", "[PAD]"), ("</s>", "[SEP]"), ("<unk>", "[UNK]")]:
        assert torch.equal(ours[d.index(fairseq_sym)], emb[vocab.index(bert_sym)]), fairseq_sym
    assert torch.equal(ours[d.index("<mask>")], emb[vocab.index("[MASK]")])
    assert torch.equal(ours[d.index("人")], emb[vocab.index("人")])


@pytest.mark.parametrize("pairs", [False, True])
def test_kbert_hidden_states_equal_bert(converted, tmp_path, pairs):
    """K-BERT started with --kbert-pretrained from the converted checkpoint, without a KG (each sentence
    tree is the bare sentence), gives BERT's last hidden states within 1e-5: <s> a </s> [b </s>] with
    segment ids 0 / 1 against [CLS] a [SEP] [b [SEP]] with token_type_ids, padding masked."""
    from transformers import BertModel

    from fairseq_knowgen.convert.hf_bert import bert_dictionary, read_vocab_txt

    hf_dir, vocab, out = converted
    data = task_folder(str(tmp_path / "data"), out, pairs)
    task, model, args = build_task_and_model(
        data, "kbert_base", *TINY, "--kbert-pretrained", out / "model.pt", task="kbert_classification"
    )
    assert args.num_segments == 2 and args.layer_norm_eps == 1e-12  # taken from the checkpoint
    model.eval()
    batch = first_batch(task, max_sentences=10)
    net = batch["net_input"]
    tokens, segments = net["src_tokens"], net["segment_ids"]
    pad = tokens.eq(task.source_dictionary.pad())
    assert pad.any() and tokens.eq(task.source_dictionary.unk()).any()
    assert bool(segments.bool().any()) == pairs
    with torch.no_grad():
        ours = model(**net, features_only=True)[0]
        _, rows = bert_dictionary(read_vocab_txt(os.path.join(hf_dir, "vocab.txt")), len(vocab))
        bert = BertModel.from_pretrained(hf_dir, local_files_only=True).eval()
        expected = bert(input_ids=rows[tokens], token_type_ids=segments, attention_mask=(~pad).long()).last_hidden_state
    assert torch.allclose(ours[~pad], expected[~pad], atol=1e-5), (ours[~pad] - expected[~pad]).abs().max()
    if pairs:  # the token types matter: b read as segment 0 is not BERT's
        with torch.no_grad():
            wrong = model(**{**net, "segment_ids": torch.zeros_like(segments)}, features_only=True)[0]
        assert not torch.allclose(wrong[~pad], expected[~pad], atol=1e-3)


def test_bad_vocabulary_is_refused_naming_the_line(tmp_path):
    hf_dir, vocab = tiny_bert(str(tmp_path / "hf"))
    with open(os.path.join(hf_dir, "vocab.txt"), "wb") as f:
        f.write(("\n".join(vocab[:-1]) + "\n").encode("utf-8") + b"\xff\xfe\n")  # the last line is not UTF-8
    proc = run_cli("-m", "fairseq_knowgen.convert.hf_bert", hf_dir, tmp_path / "out", check=False)
    assert proc.returncode == 2 and f"vocab.txt:{len(vocab)}: not valid UTF-8" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_repeated_token_keeps_bert_s_last_id(tmp_path):
    """BERT's tokenizer maps a repeated token to its last line (transformers' load_vocab fills a dict):
    that row keeps the name, the earlier one becomes a stand-in."""
    from fairseq_knowgen.convert.hf_bert import bert_dictionary

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "甲", "乙", "甲"]
    d, rows = bert_dictionary(tokens, len(tokens))
    assert rows[d.index("甲")] == 7 and rows[d.index("<bert-id-5>")] == 5 and len(d) == len(tokens)
