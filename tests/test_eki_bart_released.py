"""EKI-BART and BART+DimAttn from a checkpoint in the layout of fairseq's released bart.base /
bart.large (argparse ``args``, no ``cfg``, no ``decoder.output_projection.weight``, a
``dict.txt`` of GPT-2 ids without ``<mask>``), with GPT-2 BPE data: the dictionary grown with
``<sep>`` (``<mask>`` keeps its row), concept matches and L_E labels on the words of the BPE,
and the refusals (``<sep>`` on ``<mask>``'s row, a dropped or missing pretrained tensor, a
split ``<sep>``).

:func:`write_tiny_gpt2_bpe` and :func:`write_released_bart` are also used by
``test_commongen_pretrained.py``."""

import argparse
import json
import random
from types import SimpleNamespace

import pytest
import torch
from conftest import TRAIN_COMMON, preprocess, run_cli
from fairseq import checkpoint_utils
from fairseq.data import Dictionary, LanguagePairDataset

from fairseq_knowgen.data.eki_dataset import EKIDataset, SourceAnnotator
from fairseq_knowgen.textio import DataError

WORDS = "the a dog dogs cat ball park run runs running jump play field river boat sit swim fast are in".split()
TINY_DIMS = dict(embed=16, ffn=32, layers=1, heads=2)


def write_tiny_gpt2_bpe(folder, words=WORDS):
    """GPT-2 BPE files of a tiny vocabulary: the 256 byte symbols, and merges that make each
    word of ``words`` one piece with and without its leading space ('Ġ'), except that
    'dogs' and 'running' stay two pieces ('Ġdog' 's', 'Ġrun' 'ning'). Returns the paths of
    encoder.json and vocab.bpe."""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    byte_chars = list(bytes_to_unicode().values())
    encoder = {c: i for i, c in enumerate(byte_chars)}
    merges = []

    def build(word):
        cur = word[0]
        for ch in word[1:]:
            if (cur, ch) not in merges:
                merges.append((cur, ch))
            cur += ch
            encoder.setdefault(cur, len(encoder))

    units = ["ning"] + [w for w in words if w not in ("dogs", "running")]
    for w in units:
        build(w)
    for w in units:  # the space joins a whole word last (the merges apply in their order)
        merges.append(("Ġ", w))
        encoder.setdefault("Ġ" + w, len(encoder))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "encoder.json").write_text(json.dumps(encoder))
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return folder / "encoder.json", folder / "vocab.bpe"


def gpt2_bpe(folder):
    from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig

    cfg = GPT2BPEConfig(gpt2_encoder_json=str(folder / "encoder.json"), gpt2_vocab_bpe=str(folder / "vocab.bpe"))
    return GPT2BPE(cfg)


def write_released_bart(folder, arch="bart_base", seed=0, train_meters=False, extra_tensors=None, dict_txt=None):
    """``folder/model.pt`` and ``folder/dict.txt`` in the layout of fairseq's released BART
    (a random tiny model): ``dict.txt`` lists GPT-2 ids (those of ``folder/encoder.json``,
    written by :func:`write_tiny_gpt2_bpe`, or a copy of ``dict_txt``, e.g. the released one),
    the model has one row more for ``<mask>`` (fairseq's denoising task adds it), the
    checkpoint holds argparse ``args`` and no ``cfg``, and no ``decoder.output_projection.weight``.
    Returns the saved model state."""
    from fairseq.models.bart import BARTModel
    from fairseq.models.bart.model import bart_base_architecture

    if dict_txt is not None:
        (folder / "dict.txt").write_bytes(open(dict_txt, "rb").read())
    else:
        ids = sorted(json.loads((folder / "encoder.json").read_text()).values())
        (folder / "dict.txt").write_text("".join(f"{i} {1000 - k}\n" for k, i in enumerate(ids)))
    d = Dictionary.load(str(folder / "dict.txt"))
    d.add_symbol("<mask>")
    args = argparse.Namespace(
        arch=arch,
        task="denoising",
        criterion="cross_entropy",
        optimizer="adam",
        lr_scheduler="polynomial_decay",
        lr=[0.0004],
        encoder_embed_dim=TINY_DIMS["embed"],
        decoder_embed_dim=TINY_DIMS["embed"],
        encoder_ffn_embed_dim=TINY_DIMS["ffn"],
        decoder_ffn_embed_dim=TINY_DIMS["ffn"],
        encoder_layers=TINY_DIMS["layers"],
        decoder_layers=TINY_DIMS["layers"],
        encoder_attention_heads=TINY_DIMS["heads"],
        decoder_attention_heads=TINY_DIMS["heads"],
    )
    bart_base_architecture(args)
    torch.manual_seed(seed)
    model = BARTModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    with torch.no_grad():  # BART's init leaves biases and layer norms at 0 / 1: make every tensor distinct
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    state = model.state_dict()
    del state["decoder.output_projection.weight"]  # released BART predates fairseq's output_projection
    state.update(extra_tensors or {})
    extra = {"epoch": 1, "val_loss": None, "train_iterator": {"epoch": 1}}
    from fairseq.logging import meters

    classes = (meters.AverageMeter, meters.TimeMeter, meters.StopwatchMeter)
    if train_meters:  # fairseq <= 0.9 pickled its meters from the module fairseq.meters (pytorch/hub#86)
        extra["train_meters"] = {"train_loss": classes[0](), "wps": classes[1](), "wall": classes[2]()}
    for cls in classes:
        cls.__module__ = "fairseq.meters"
    try:
        torch.save(
            {
                "args": args,
                "model": state,
                "optimizer_history": [
                    {
                        "criterion_name": "CrossEntropyCriterion",
                        "optimizer_name": "FairseqAdam",
                        "lr_scheduler_state": {"best": None},
                        "num_updates": 500000,
                    }
                ],
                "extra_state": extra,
            },
            folder / "model.pt",
            _use_new_zipfile_serialization=False,  # the released files predate torch's zip format
        )
    finally:
        for cls in classes:
            cls.__module__ = "fairseq.logging.meters"
    return {k: v.clone() for k, v in state.items()}


def eki_lines(n, seed):
    rng = random.Random(seed)
    nouns = "dog cat ball park field river boat".split()
    src, tgt = [], []
    for _ in range(n):
        a, b, c = rng.sample(nouns, 3)
        src.append(f"{a} {b} run <sep> the {a} are running in the {rng.choice(nouns)}")
        tgt.append(f"the {a} runs in the {b} and the {c}")
    return src, tgt


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A released-layout tiny BART folder (model.pt, dict.txt, encoder.json, vocab.bpe) and
    EKI data encoded with its GPT-2 BPE, binarized with its dictionary grown by '<sep>'
    (python -m fairseq_knowgen.convert.extend_dictionary)."""
    from fairseq_knowgen.prep.commongen import gpt2_bpe as encode_files

    root = tmp_path_factory.mktemp("released")
    bart = root / "bart.base"
    write_tiny_gpt2_bpe(bart)
    state = write_released_bart(bart, train_meters=True)
    raw = root / "raw"
    raw.mkdir()
    for split, n, seed in (("train", 24, 0), ("valid", 8, 1)):
        src, tgt = eki_lines(n, seed)
        (raw / f"{split}.src").write_text("\n".join(src) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
    names = [f"{s}.{side}" for s in ("train", "valid") for side in ("src", "tgt")]
    encode_files(str(bart / "encoder.json"), str(bart / "vocab.bpe"), str(raw), str(root / "bpe"), names)
    run_cli("-m", "fairseq_knowgen.convert.extend_dictionary", bart, root / "dict.txt", "--add", "<sep>")
    preprocess(root / "bpe", root / "bin", "train", "valid", dictionary=root / "dict.txt")
    return SimpleNamespace(bart=bart, state=state, bin=root / "bin", root=root)


# --- GPT-2 BPE: words, concept matches and L_E labels


def test_gpt2_annotations_hand_built(tmp_path):
    """Concepts 'dog run', prototype 'the dogs are running fast', target 'the dog runs': the
    concept 'dog' (GPT-2 piece 'dog', no space) matches the target's ' dog' on words, the
    prototype's 'dogs' and 'running' (two pieces each) match the concepts by lemma."""
    write_tiny_gpt2_bpe(tmp_path)
    bpe = gpt2_bpe(tmp_path)
    pieces = {w: bpe.encode(w).split() for w in ("dog", " dog", " dogs", " running")}
    assert pieces["dog"] != pieces[" dog"] and len(pieces[" dogs"]) == 2 and len(pieces[" running"]) == 2
    from fairseq_knowgen.data.eki_dataset import encode_source

    d = Dictionary()
    for i in sorted(json.loads((tmp_path / "encoder.json").read_text()).values()):
        d.add_symbol(str(i))
    d.add_symbol("<sep>")
    src = d.encode_line(encode_source("dog run <sep> the dogs are running fast", bpe.encode), add_if_not_exist=False)
    tgt = d.encode_line(bpe.encode("the dog runs"), add_if_not_exist=False)
    # the word-level options (this package's data settings before the faithful defaults)
    words = dict(layout="sep", center_match="lemma", label_unit="word")
    a = SourceAnnotator(d, "data", gpt2_encoder_json=str(tmp_path / "encoder.json"), **words).annotate(src, tgt)
    # source pieces: dog | Ġrun | <sep> | the Ġdog s Ġare Ġrun ning Ġfast | </s>
    assert [d[i] for i in src.tolist()][2] == "<sep>" and len(src) == 11
    # centers: both pieces of 'dogs' (lemma dog) and of 'running' (lemma run)
    assert a["distance"].tolist() == [0, 0, 0, 2, 1, 1, 2, 1, 1, 2, 3]
    assert a["group"].tolist() == [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    # words of the target: the, dog, runs: 'dog' (concept, no space) 1; 'run' 0; 'the' 1;
    # the pieces of 'dogs' and 'running' 0 (their words are not in the target)
    assert a["label"].tolist() == [1, 0, -1, 1, 0, 0, 0, 0, 0, 0, -1]


def test_split_or_missing_separator_refused_with_line(tmp_path):
    write_tiny_gpt2_bpe(tmp_path)
    bpe = gpt2_bpe(tmp_path)
    d = Dictionary()
    for i in sorted(json.loads((tmp_path / "encoder.json").read_text()).values()):
        d.add_symbol(str(i))
    d.add_symbol("<sep>")
    from fairseq_knowgen.data.eki_dataset import encode_source

    good = d.encode_line(encode_source("dog <sep> the dog", bpe.encode), add_if_not_exist=False)
    split = d.encode_line(bpe.encode("dog <sep> the dog"), add_if_not_exist=False)  # BPE over '<sep>'
    missing = d.encode_line(bpe.encode("dog the dog"), add_if_not_exist=False)
    enc = str(tmp_path / "encoder.json")
    for bad, what in ((split, "split into BPE pieces"), (missing, "no '<sep>'")):
        srcs = [good, bad]
        ds = EKIDataset(LanguagePairDataset(srcs, [len(s) for s in srcs], d), d, "bin:train", enc)
        with pytest.raises(DataError, match=f"^bin:train:2: .*{what}"):
            ds.check_sources()
    # a GPT-2 dictionary read without encoder.json would match ids, not words: refused where words are needed
    for words in (dict(center_match="lemma"), dict(label_unit="word")):
        with pytest.raises(ValueError, match="GPT-2 BPE ids"):
            SourceAnnotator(d, "bin:train", **words)
    SourceAnnotator(d, "bin:train")  # token ids need no words


# --- released BART checkpoints


def build(data, arch, *extra):
    from helpers import build_task_and_model

    task_args = ("--eki-gpt2-encoder-json", data.bart / "encoder.json") if arch.startswith("eki") else ()
    dims = ["--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32]
    dims += ["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 16, "--decoder-embed-dim", 16]
    dims += ["--encoder-attention-heads", 2, "--decoder-attention-heads", 2]
    task = "eki_generation" if arch.startswith("eki") else "translation"
    return build_task_and_model(data.bin, arch, *dims, *task_args, *extra, task=task)


def load_released(model, args, path):
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    model.load_state_dict(state["model"], strict=True, model_cfg=args)


@pytest.mark.parametrize("arch", ["eki_bart_base", "bart_dimattn_base"])
def test_released_bart_loads_with_grown_dictionary(released, arch):
    task, model, args = build(released, arch)
    d = task.source_dictionary
    n = released.state["encoder.embed_tokens.weight"].size(0)
    assert d.index("<mask>") == n - 1 and d.index("<sep>") == n  # '<sep>' appended after '<mask>'
    params = {k: (p.data_ptr(), p.shape) for k, p in model.named_parameters()}
    start = {k: v.clone() for k, v in model.state_dict().items()}
    load_released(model, args, released.bart / "model.pt")
    # parameters built once (DDP): same tensors, same shapes; the embedding tie kept
    assert {k: (p.data_ptr(), p.shape) for k, p in model.named_parameters()} == params
    assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight
    own = model.state_dict()
    emb = own["encoder.embed_tokens.weight"]
    pre = released.state["encoder.embed_tokens.weight"]
    assert torch.equal(emb[:n], pre)  # every pretrained row bit-identical, '<mask>' on its row
    torch.testing.assert_close(emb[n], pre.double().mean(0).float(), rtol=0, atol=1e-6)  # '<sep>': the mean
    for k, v in released.state.items():
        if "embed_tokens" not in k:
            assert torch.equal(own[k], v), k
    new = sorted(k for k in own if k not in released.state and "output_projection" not in k)
    assert bool(new) == arch.startswith("eki")
    for k in new:  # the EKI parts keep their start (small random values) through the load
        assert torch.equal(own[k], start[k]), k
        if "group_embedding" in k or "distance_embed" in k:
            assert 0 < own[k].abs().max() < 0.1, k


def test_sep_on_the_mask_row_is_refused(released, tmp_path):
    """bart's dict.txt + '<sep>' (no '<mask>'): '<sep>' would take the checkpoint's '<mask>' row."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dict.txt").write_text((released.bart / "dict.txt").read_text() + "<sep> 1\n")
    for split in ("train", "valid"):
        for side in ("src", "tgt"):
            (bad / f"{split}.{side}").write_text((released.root / "bpe" / f"valid.{side}").read_text())
    preprocess(bad, bad / "bin", "train", "valid", dictionary=bad / "dict.txt")
    data = SimpleNamespace(bin=bad / "bin", bart=released.bart)
    task, model, args = build(data, "eki_bart_base")
    with pytest.raises(ValueError, match="'<sep>' on row .*'<mask>'"):
        load_released(model, args, released.bart / "model.pt")


def test_dropped_or_missing_pretrained_tensor_is_refused(released, tmp_path):
    task, model, args = build(released, "eki_bart_base")
    ckpt = torch.load(released.bart / "model.pt")
    heads = {
        "classification_heads.mnli.dense.weight": torch.zeros(16, 16),
        "classification_heads.mnli.dense.bias": torch.zeros(16),
        "classification_heads.mnli.out_proj.weight": torch.zeros(3, 16),
        "classification_heads.mnli.out_proj.bias": torch.zeros(3),
    }
    with_head = dict(ckpt["model"], **heads)
    with pytest.raises(ValueError, match="classification_heads.mnli.dense.weight"):
        model.load_state_dict(with_head, strict=True, model_cfg=args)
    missing = {k: v for k, v in ckpt["model"].items() if k != "decoder.layers.0.fc1.weight"}
    with pytest.raises(RuntimeError, match="decoder.layers.0.fc1.weight"):
        model.load_state_dict(missing, strict=True, model_cfg=args)


def test_eki_bart_restore_file_cli(released, tmp_path):
    """The user's command: fairseq-train --restore-file model.pt --reset-*; the fine-tuned
    checkpoint holds the released weights (lr 1e-12) and '<sep>''s new row."""
    ft = tmp_path / "ft"
    run_cli(
        "fairseq-train",
        released.bin,
        *TRAIN_COMMON,
        "--task",
        "eki_generation",
        "--eki-gpt2-encoder-json",
        released.bart / "encoder.json",
        "--arch",
        "eki_bart_base",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--eki-scaling-dim", "8",
        "--criterion", "eki_label_smoothed_cross_entropy",
        "--restore-file", released.bart / "model.pt",
        "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler",
        "--lr", "1e-12", "--max-update", "1", "--save-dir", ft,
    )
    tuned = torch.load(ft / "checkpoint_last.pt")["model"]
    n = released.state["encoder.embed_tokens.weight"].size(0)
    for k, v in released.state.items():
        t = tuned[k][:n] if "embed_tokens" in k else tuned[k]
        torch.testing.assert_close(t, v, atol=1e-6, rtol=0)
