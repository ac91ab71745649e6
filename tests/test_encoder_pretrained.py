"""``--encoder-pretrained`` on the real all-MiniLM-L6-v2 (``../shared/released``), converted by ``convert.hf_bert``:
the built encoder against HuggingFace's ``BertModel``, and each sequence-to-sequence arch trained one update and
decoded with the pretrained folder deleted, a partial load refused, ``--freeze-encoder`` keeping BERT's tensors."""

import os
import random
import shutil

import pytest
import torch
from conftest import TRAIN_COMMON, preprocess, run_cli
from helpers import build_task_and_model
from released import released

from fairseq_knowgen.convert import extend_dictionary, hf_bert
from fairseq_knowgen.models.pretrained_encoder import BertSourceEncoder, PretrainedEncoderTransformerModel
from fairseq_knowgen.prep.wordpiece import wordpiece
from fairseq_knowgen.textio import DataError

MINILM = released("all-MiniLM-L6-v2")
WORDS = "dog cat ball park run jump play throw catch field river boat sit swim".split()
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Dogs swim, cats don't!"]
DECODER = ["--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32"]
DECODER += ["--decoder-attention-heads", "2"]
# arch -> (task and criterion flags, which data: concepts or eki)
ARCHS = {
    "transformer_pretrained_encoder": (["--criterion", "label_smoothed_cross_entropy"], "plain"),
    "transformer_dimattn": (["--criterion", "label_smoothed_cross_entropy"], "plain"),
    "copy_transformer": (["--criterion", "force_copy"], "plain"),
    "eki_transformer": (["--task", "eki_generation", "--criterion", "eki_label_smoothed_cross_entropy"], "eki"),
    "kbert_transformer": (["--task", "kbert_translation", "--criterion", "label_smoothed_cross_entropy"], "plain"),
}

pytestmark = pytest.mark.skipif(MINILM is None, reason="needs ../shared/released/all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The released MiniLM converted by convert.hf_bert (model.pt, dict.txt, the tokenizer files)."""
    out = tmp_path_factory.mktemp("minilm") / "minilm"
    hf_bert.convert(MINILM, str(out))
    return out


@pytest.fixture(scope="module")
def hf_model():
    from transformers import BertModel

    return BertModel.from_pretrained(MINILM, local_files_only=True).eval()


@pytest.fixture(scope="module")
def data(minilm, tmp_path_factory):
    """Tiny data: WordPiece sources (concepts; EKI's concepts <sep> prototype), word targets, one dictionary (the
    BERT's grown with <sep> and the target words), binarized into plain/ and eki/; a KG for kbert_translation."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("encdata")
    tokenize = wordpiece(str(minilm))
    for split, n in (("train", 48), ("valid", 8)):
        src, eki, tgt = [], [], []
        for _ in range(n):
            a, b, c = rng.sample(WORDS, 3)
            src.append(f"{a} {b} {c}")
            eki.append(f"{a} {b} {c} <sep> the {rng.choice(WORDS)} and the {a}")
            tgt.append(f"the {a} and the {b} {c} in the {rng.choice(WORDS)}")
        for kind, lines, cls in (("plain", src, True), ("eki", eki, False)):
            (root / kind).mkdir(exist_ok=True)
            pieces = [" ".join((["<s>"] if cls else []) + tokenize(line)) for line in lines]
            (root / kind / f"{split}.src").write_text("\n".join(pieces) + "\n")
            (root / kind / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
    dictionary = root / "dict.txt"
    extend_dictionary.main(
        [str(minilm), str(dictionary), "--add", "<sep>", "--add-from", str(root / "plain" / "train.tgt")]
    )
    for kind in ("plain", "eki"):
        preprocess(root / kind, root / f"bin-{kind}", "train", "valid", dictionary=dictionary)
    kg = root / "kg.spo"
    kg.write_text("dog\tnear\tpark\ncat\tlikes\tball\nriver\thas\tboat\n")
    return root, kg


def fairseq_ids(tokens, dictionary):
    return torch.tensor([[dictionary.index(t) for t in tokens] + [dictionary.eos()]])


def bert_encoder(minilm, dictionary, **args):
    """BertSourceEncoder built and loaded as the models build it (full width: no projection)."""
    import argparse
    import json

    from fairseq_knowgen.convert.fairseq_legacy import load_checkpoint_state
    from fairseq_knowgen.models.pretrained_encoder import pretrained_config

    state, pretrained_args = load_checkpoint_state(str(minilm / "model.pt"))
    config = pretrained_config(pretrained_args, "minilm")
    ns = argparse.Namespace(pretrained_encoder_config=json.dumps(config), **args)
    encoder = BertSourceEncoder(ns, dictionary, None, config["encoder_embed_dim"])
    encoder.load_pretrained(state, str(minilm / "dict.txt"), str(minilm))
    return encoder.eval()


def minilm_dictionary(minilm, grown=()):
    from fairseq.data import Dictionary

    d = Dictionary.load(str(minilm / "dict.txt"))
    d.add_symbol("<mask>")
    for symbol in grown:
        d.add_symbol(symbol)
    return d


@pytest.mark.parametrize("grown", [(), ("<sep>", "<ent-0>", "zebra@@")], ids=["bert", "grown"])
def test_the_encoder_is_huggingface_s_bert(minilm, hf_model, grown):
    """Last hidden states of the built encoder = BertModel's on the same sentences (a padded batch of two), within
    1e-5; the tokens are prep.wordpiece's, and their fairseq ids name BERT's tokens."""
    from tokenizers import Tokenizer

    dictionary = minilm_dictionary(minilm, grown)
    encoder = bert_encoder(minilm, dictionary)
    tokenize = wordpiece(str(minilm))
    hf_tok = Tokenizer.from_file(os.path.join(MINILM, "tokenizer.json"))
    hf_tok.no_padding()
    rows, hf_rows = [], []
    for sentence in SENTENCES:
        tokens = ["<s>"] + tokenize(sentence)
        rows.append(fairseq_ids(tokens, dictionary)[0])
        hf_rows.append(torch.tensor(hf_tok.encode(sentence).ids))
        assert dictionary.unk() not in rows[-1].tolist()
    n = max(len(r) for r in rows)
    src = torch.full((len(rows), n), dictionary.pad())
    hf_ids, hf_mask = torch.zeros(len(rows), n, dtype=torch.long), torch.zeros(len(rows), n, dtype=torch.long)
    for i, (r, h) in enumerate(zip(rows, hf_rows)):
        assert len(r) == len(h)
        src[i, : len(r)], hf_ids[i, : len(h)], hf_mask[i, : len(h)] = r, h, 1
    with torch.no_grad():
        ours = encoder(src, src_lengths=hf_mask.sum(1))["encoder_out"][0].transpose(0, 1)  # B x T x C
        theirs = hf_model(input_ids=hf_ids, attention_mask=hf_mask).last_hidden_state
    real = hf_mask.bool()
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-5


def train(data_dir, arch, flags, save_dir, *extra):
    return run_cli(
        "fairseq-train",
        data_dir,
        *TRAIN_COMMON,
        "--arch",
        arch,
        *DECODER,
        *flags,
        "--max-update",
        "1",
        "--save-dir",
        save_dir,
        *extra,
    )


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_arch_trains_and_decodes_without_the_pretrained_folder(minilm, data, arch, tmp_path):
    """One fairseq-train update from a copy of the converted folder, the copy deleted, fairseq-generate (beam 3)
    from the checkpoint: the model rebuilds from its args alone."""
    root, kg = data
    flags, kind = ARCHS[arch]
    task = ["--kg", kg] if arch == "kbert_transformer" else []
    copy = tmp_path / "minilm"
    shutil.copytree(minilm, copy, copy_function=os.link)
    proc = train(root / f"bin-{kind}", arch, flags + task, tmp_path / "ckpt", "--encoder-pretrained", copy)
    assert "all 101 tensors loaded" in proc.stdout + proc.stderr
    shutil.rmtree(copy)
    gen_task = flags[:2] if flags[0] == "--task" else []
    proc = run_cli(
        "fairseq-generate",
        root / f"bin-{kind}",
        "--user-dir",
        "fairseq_knowgen",
        *gen_task,
        *task,
        "--path",
        tmp_path / "ckpt" / "checkpoint_last.pt",
        "--beam",
        "3",
        "--batch-size",
        "8",
        "--max-len-b",
        "8",
        "--cpu",
        "--gen-subset",
        "valid",
    )
    assert len([line for line in proc.stdout.splitlines() if line.startswith("H-")]) == 8


def test_freeze_encoder_keeps_bert_s_tensors(minilm, data, tmp_path):
    """--freeze-encoder: after an update every BERT tensor of the encoder is the checkpoint's (grown rows
    included); the projection to the decoder's width has trained."""
    root, _ = data
    flags = ["--criterion", "label_smoothed_cross_entropy", "--encoder-pretrained", minilm, "--freeze-encoder"]
    train(root / "bin-plain", "transformer_pretrained_encoder", flags, tmp_path)
    trained = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    bert = torch.load(minilm / "model.pt", map_location="cpu", weights_only=False)["model"]
    n_bert = bert["encoder.sentence_encoder.embed_tokens.weight"].size(0)
    for key, value in bert.items():
        ours = trained["encoder." + key[len("encoder.sentence_encoder.") :]]
        if key.endswith("embed_tokens.weight"):
            ours = ours[:n_bert]
        assert torch.equal(ours, value), key
    proj = [k for k in trained if k.startswith("encoder.output_projection.")]
    assert proj and trained["encoder.output_projection.weight"].shape == (16, 384)


def build(data, arch, *flags):
    root, _ = data
    return build_task_and_model(root / "bin-plain", arch, *DECODER, *flags)


@pytest.mark.parametrize("how", ["missing", "unexpected", "shape"])
def test_a_partial_load_is_refused(minilm, data, tmp_path, how):
    """A converted checkpoint missing a tensor, with one the encoder has no place for, or with a tensor of
    another shape stops the build with an error naming it."""
    ckpt = torch.load(minilm / "model.pt", map_location="cpu", weights_only=False)
    key = "encoder.sentence_encoder.layers.5.fc2.bias"
    if how == "missing":
        del ckpt["model"][key]
    elif how == "unexpected":
        ckpt["model"]["encoder.sentence_encoder.pooler.dense.bias"] = torch.zeros(384)
    else:
        ckpt["model"][key] = torch.zeros(383)
    broken = tmp_path / "broken"
    broken.mkdir()
    torch.save(ckpt, broken / "model.pt")
    shutil.copy(minilm / "dict.txt", broken / "dict.txt")
    with pytest.raises(DataError, match="refusing a partial load"):
        build(data, "transformer_pretrained_encoder", "--encoder-pretrained", broken)


def test_a_source_dictionary_that_is_not_bert_s_is_refused(minilm, data, tmp_path):
    shutil.copytree(minilm, tmp_path / "other", copy_function=os.link)
    os.remove(tmp_path / "other" / "dict.txt")
    lines = (minilm / "dict.txt").read_text().splitlines()
    lines[100], lines[101] = lines[101], lines[100]
    (tmp_path / "other" / "dict.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="not the encoder's: row 104"):
        build(data, "copy_transformer", "--encoder-pretrained", tmp_path / "other")


def test_the_built_model_has_bert_s_encoder_and_a_projection(minilm, data):
    """Sizes from the checkpoint (6 x 384, eps 1e-12, segment table, post-LN), the decoder at its own width; the
    args record the configuration (so checkpoints rebuild without the file)."""
    _, model, args = build(data, "transformer_pretrained_encoder", "--encoder-pretrained", minilm)
    assert isinstance(model, PretrainedEncoderTransformerModel)
    enc = model.encoder
    assert isinstance(enc, BertSourceEncoder) and len(enc.layers) == 6 and enc.embed_tokens.embedding_dim == 384
    assert enc.layernorm_embedding.eps == 1e-12 and enc.segment_embeddings.num_embeddings == 2
    assert enc.output_projection.weight.shape == (16, 384) and args.pretrained_encoder_config
    assert enc.max_positions() == 512
