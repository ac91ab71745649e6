"""HuggingFace BART (``BartForConditionalGeneration``) -> a fairseq BART folder, as fairseq releases them.

EKI-BART ("An Enhanced Knowledge Injection Model for Commonsense Generation", Fan et al., COLING
2020) and BART+DimAttn fine-tune fairseq's BART; users mostly hold BART as a HuggingFace folder
(``facebook/bart-base``, ``facebook/bart-large``). From any working folder::

    python -m fairseq_knowgen.convert.hf_bart HF_DIR OUT_DIR

``HF_DIR``: a ``save_pretrained`` folder of ``BartForConditionalGeneration``: ``config.json``, the
weights (``model.safetensors`` or ``pytorch_model.bin``, read by ``transformers`` with
``local_files_only``) and the tokenizer, as ``vocab.json`` + ``merges.txt`` or as ``tokenizer.json``
alone (what ``transformers`` 5 may write). ``OUT_DIR`` receives the layout of fairseq's
``bart.base`` / ``bart.large`` with GPT-2's BPE files beside it, which the CommonGen recipe's
``PRETRAINED=OUT_DIR`` takes and fairseq's own ``BARTModel.from_pretrained(OUT_DIR,
checkpoint_file="model.pt", gpt2_encoder_json=..., gpt2_vocab_bpe=...)`` loads:

- ``dict.txt``: HF BART's token ids *are* fairseq's dictionary indices (``<s> <pad> </s> <unk>`` at
  0-3, ``<mask>`` the last row, which fairseq's ``denoising`` task appends and ``dict.txt`` does
  not list). fairseq's dictionary names each row by the token's **GPT-2 BPE id** (fairseq's
  ``--bpe gpt2`` writes text as GPT-2 ids), so line ``i - 3`` of ``dict.txt`` is the GPT-2 id of
  HF id ``i``. GPT-2's id of a token is its place in GPT-2's vocabulary, which its merges define:
  the 256 byte symbols (in ``bytes_to_unicode`` order) are ids 0-255, the token made by merge k
  of ``merges.txt`` is id 256 + k, and ``<|endoftext|>`` follows the last merge (this rebuilds
  OpenAI's ``encoder.json`` exactly from its ``vocab.bpe``). A row whose token GPT-2's BPE cannot
  produce (``madeupword0000`` in fairseq's own dictionaries) keeps the token as its symbol;
- ``encoder.json`` / ``vocab.bpe``: GPT-2's BPE (token -> GPT-2 id, and the merges with the
  ``#version`` line fairseq's reader skips), rebuilt from the tokenizer as above;
- ``model.pt``: a fairseq checkpoint with argparse ``args`` (``--task denoising --arch bart_large``
  with the HF model's sizes, activation, dropouts and positions) like the released ones. HF
  BART's module names are fairseq's (it was ported from fairseq): ``model.encoder.X`` ->
  ``encoder.X``, ``model.decoder.X`` -> ``decoder.X``, ``model.shared`` -> the tied
  ``encoder/decoder.embed_tokens`` and ``decoder.output_projection``; the learned position
  tables have the same ``max_position_embeddings + 2`` rows in both (fairseq numbers positions
  from ``padding_idx + 1 = 2``, HF with an offset of 2).

Refused, naming what is wrong (of many tensors, a dozen and the count of the rest): a
``final_logits_bias`` that is not zero (HF adds it to the logits; fairseq's BART has no such
tensor, and dropping it would change the model), an untied ``lm_head``, a configuration fairseq's
``bart`` layers cannot express (another ``model_type``, an activation fairseq lacks), a tokenizer
of another model (its size is not ``config.json``'s ``vocab_size``: both are named), a tokenizer
whose ids do not fill the embedding rows or do not put fairseq's specials at 0-3, HF tensors the
conversion leaves unused and fairseq tensors it leaves unset (a load that leaves pretrained tensors
untouched is an error, never a log line). Damaged downloads (weights cut short, a JSON file that is
not JSON) stop with ``error: FILE[:LINE]: ...: re-download FILE``
(:mod:`fairseq_knowgen.convert.downloads`). Every input is read and checked before anything is
written; the folder is written under a temporary name and renamed into place at the end
(:func:`fairseq_knowgen.textio.output_folder`): a failed conversion leaves no half-made ``OUT_DIR``,
and an earlier ``OUT_DIR`` is replaced only by a complete one.
"""

import argparse
import json
import os
from types import SimpleNamespace
from typing import Dict, List, Sequence, Tuple

import torch

from ..textio import DataError, cli_entry, output_folder
from .downloads import check_vocab_size, load_config, load_model, read_json, read_text
from .fairseq_legacy import some_names
from .hf_gpt2 import bpe_files_from_tokenizer_json

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary rows 0-3, HF BART's ids 0-3
MASK = "<mask>"
END_OF_TEXT = "<|endoftext|>"
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate", "relu": "relu"}
# fields of older BartConfig versions (mBART's layout) that fairseq's bart_large cannot express when set
UNSUPPORTED_FLAGS = ("normalize_before", "add_final_layer_norm", "add_bias_logits", "static_position_embeddings")


def gpt2_encoder(merges: Sequence[str]) -> Dict[str, int]:
    """GPT-2's ``encoder.json`` from its merges (``"a b"`` lines, no ``#version`` line): the 256 byte
    symbols in ``bytes_to_unicode`` order, one token per merge in merge order, ``<|endoftext|>``."""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    encoder = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for merge in merges:
        a, b = merge.split(" ")
        encoder.setdefault(a + b, len(encoder))
    encoder.setdefault(END_OF_TEXT, len(encoder))
    return encoder


def read_tokenizer(hf_dir: str) -> Tuple[Dict[str, int], List[str], str]:
    """``(token -> HF id, merges, the file of the vocabulary)`` from ``vocab.json`` + ``merges.txt``
    or, without them, ``tokenizer.json`` (its ``added_tokens`` included)."""
    vocab_path, merges_path = os.path.join(hf_dir, "vocab.json"), os.path.join(hf_dir, "merges.txt")
    tok_path = os.path.join(hf_dir, "tokenizer.json")
    if os.path.isfile(vocab_path) and os.path.isfile(merges_path):
        vocab, merges_text = read_json(vocab_path, "BPE vocabulary"), read_text(merges_path)
    elif os.path.isfile(tok_path):
        vocab, merges_text = bpe_files_from_tokenizer_json(tok_path)
        vocab_path = merges_path = tok_path
    else:
        raise DataError(hf_dir, 0, "no tokenizer: neither vocab.json + merges.txt nor tokenizer.json")
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise DataError(vocab_path, 0, "not a BPE vocabulary (a JSON object of token -> integer id)")
    merges = [m for m in merges_text.split("\n") if m.strip() and not m.startswith("#version")]
    bad = [m for m in merges if len(m.split(" ")) != 2]
    if bad:
        raise DataError(merges_path, 0, f"{len(bad)} merges are not two symbols: {some_names(map(repr, bad))}")
    return vocab, merges, vocab_path


def dictionary_symbols(
    vocab: Dict[str, int], num_rows: int, gpt2: Dict[str, int], where: str, config_path: str = "config.json"
) -> Tuple[List[str], bool]:
    """The fairseq symbol of each of the model's ``num_rows`` embedding rows (the HF id's token:
    its GPT-2 id, a special, or the token itself), and whether the last row is ``<mask>``. A
    vocabulary of another size than ``num_rows`` (``vocab_size`` of ``config_path``) is another
    model's and refused, naming both sizes."""
    by_id: Dict[int, str] = {}
    for tok, i in vocab.items():
        if i in by_id:
            raise DataError(where, 0, f"tokens {by_id[i]!r} and {tok!r} share id {i}")
        by_id[i] = tok
    # fairseq's denoising task appends <mask>: a tokenizer may name it one row past the embedding
    beyond_mask = vocab.get(MASK) is not None and vocab[MASK] >= num_rows
    check_vocab_size(where, len(by_id) - int(beyond_mask), config_path, num_rows)
    wrong = [f"{i}: {by_id.get(i)!r} (fairseq: {s!r})" for i, s in enumerate(SPECIALS) if by_id.get(i) != s]
    if wrong:
        raise DataError(where, 0, f"ids 0-3 must be fairseq's {' '.join(SPECIALS)}; {'; '.join(wrong)}")
    mask_id = vocab.get(MASK)
    beyond = sorted(i for i in by_id if i >= num_rows and i != mask_id)
    if beyond:  # a tokenizer id the model has no row for
        raise DataError(
            where, 0, f"{len(beyond)} token ids beyond the {num_rows} embedding rows: {some_names(map(str, beyond))}"
        )
    has_mask = mask_id is not None and mask_id < num_rows
    if has_mask and mask_id != num_rows - 1:
        raise DataError(where, 0, f"{MASK} has id {mask_id}, not the last row {num_rows - 1} (where fairseq puts it)")
    missing = [i for i in range(num_rows) if i not in by_id]
    if missing:
        raise DataError(where, 0, f"{len(missing)} embedding rows have no token: {some_names(map(str, missing))}")
    symbols, refused = list(SPECIALS), []
    for i in range(len(SPECIALS), num_rows - int(has_mask)):
        tok = by_id[i]
        if tok in gpt2:
            symbols.append(str(gpt2[tok]))
        elif tok.strip() == tok and tok and not any(c.isspace() for c in tok) and not tok.isdigit() and tok != MASK:
            symbols.append(tok)  # no GPT-2 token (madeupword0000): its own name, never produced by the BPE
        else:
            refused.append(f"{i}: {tok!r}")
    if len(set(symbols)) != len(symbols):
        refused.append("two ids with one symbol")
    if refused:
        raise DataError(where, 0, f"{len(refused)} tokens cannot be named in dict.txt: {some_names(refused)}")
    return symbols + ([MASK] if has_mask else []), has_mask


def bart_args(hf_cfg, data: str, where: str = "config.json") -> argparse.Namespace:
    """fairseq's ``--task denoising --arch bart_large`` args with the sizes of the BartConfig ``hf_cfg``."""
    from fairseq import options

    problems = []
    if getattr(hf_cfg, "model_type", "bart") != "bart":
        problems.append(f"model_type {hf_cfg.model_type!r}")
    act = ACTIVATIONS.get(hf_cfg.activation_function)
    if act is None:
        problems.append(f"activation_function {hf_cfg.activation_function!r} (fairseq has {sorted(ACTIVATIONS)})")
    problems += [f"{k} = {getattr(hf_cfg, k)!r}" for k in UNSUPPORTED_FLAGS if getattr(hf_cfg, k, False)]
    if not getattr(hf_cfg, "tie_word_embeddings", True):
        problems.append("an lm_head not tied to the embeddings (tie_word_embeddings false)")
    for side in ("encoder", "decoder"):
        if hf_cfg.d_model % getattr(hf_cfg, f"{side}_attention_heads"):
            problems.append(f"d_model not divisible by {side}_attention_heads")
    if problems:
        raise DataError(where, 0, "fairseq's BART cannot express " + "; ".join(problems))
    P = str(hf_cfg.max_position_embeddings)
    # fmt: off
    flags = [
        data, "--task", "denoising", "--arch", "bart_large", "--bpe", "gpt2",
        "--encoder-layers", str(hf_cfg.encoder_layers), "--decoder-layers", str(hf_cfg.decoder_layers),
        "--encoder-embed-dim", str(hf_cfg.d_model), "--decoder-embed-dim", str(hf_cfg.d_model),
        "--encoder-ffn-embed-dim", str(hf_cfg.encoder_ffn_dim), "--decoder-ffn-embed-dim", str(hf_cfg.decoder_ffn_dim),
        "--encoder-attention-heads", str(hf_cfg.encoder_attention_heads),
        "--decoder-attention-heads", str(hf_cfg.decoder_attention_heads),
        "--activation-fn", act, "--dropout", str(hf_cfg.dropout),
        "--attention-dropout", str(hf_cfg.attention_dropout), "--activation-dropout", str(hf_cfg.activation_dropout),
        "--max-source-positions", P, "--max-target-positions", P,
        "--encoder-layerdrop", str(hf_cfg.encoder_layerdrop), "--decoder-layerdrop", str(hf_cfg.decoder_layerdrop),
    ]
    # fmt: on
    args = options.parse_args_and_arch(options.get_training_parser(), flags)
    args.no_scale_embedding = not hf_cfg.scale_embedding  # bart_large: no scaling, as HF's scale_embedding false
    return args


def convert_state(hf: Dict[str, torch.Tensor], where: str = "model weights") -> Dict[str, torch.Tensor]:
    """fairseq BART tensors from a ``BartForConditionalGeneration`` state dict (see the module
    docstring); the HF tensors left unused and a non-zero ``final_logits_bias`` are refused."""
    if "model.shared.weight" not in hf:
        raise DataError(where, 0, "no model.shared.weight: not a BartForConditionalGeneration")
    shared = hf["model.shared.weight"]
    used = {"model.shared.weight"}
    out = {k: shared for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")}
    out["decoder.output_projection.weight"] = shared
    for k in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        if k in hf:
            if not torch.equal(hf[k], shared):
                raise DataError(where, 0, f"{k} differs from model.shared.weight: fairseq's BART ties them")
            used.add(k)
    if "final_logits_bias" in hf:
        bias = hf["final_logits_bias"]
        if bias.abs().max().item() != 0:
            raise DataError(
                where,
                0,
                f"final_logits_bias is not zero (max |b| = {bias.abs().max().item():.3g}): fairseq's BART has no "
                "logit bias, so the converted model would differ from this one",
            )
        used.add("final_logits_bias")
    for k, v in hf.items():
        for theirs, ours in (("model.encoder.", "encoder."), ("model.decoder.", "decoder.")):
            if k.startswith(theirs) and k not in used:
                out[ours + k[len(theirs) :]] = v
                used.add(k)
    left = sorted(set(hf) - used)
    if left:
        raise DataError(where, 0, f"{len(left)} HF tensors not converted: {some_names(left)}")
    return out


def load_hf_bart(hf_dir: str):
    """``BartForConditionalGeneration`` from ``hf_dir``; refused when ``transformers`` would start
    some of its tensors at random or drop some of the folder's."""
    from transformers import BartForConditionalGeneration

    return load_model(BartForConditionalGeneration, hf_dir, unexpected_ok=False)


def convert(hf_dir: str, out_dir: str) -> str:
    """Write ``model.pt``, ``dict.txt``, ``encoder.json`` and ``vocab.bpe`` of ``hf_dir`` into ``out_dir``."""
    from fairseq import checkpoint_utils
    from fairseq.data import Dictionary
    from fairseq.models.bart import BARTModel
    from transformers import BartConfig

    config_path = os.path.join(hf_dir, "config.json")
    hf_cfg = load_config(BartConfig, hf_dir, "BART")
    final = os.path.abspath(out_dir)
    args = bart_args(hf_cfg, final, config_path)
    vocab, merges, vocab_path = read_tokenizer(hf_dir)
    gpt2 = gpt2_encoder(merges)
    symbols, has_mask = dictionary_symbols(vocab, hf_cfg.vocab_size, gpt2, vocab_path, config_path)
    hf_model = load_hf_bart(hf_dir)  # its embedding has config.json's vocab_size rows (else: shapes differ)
    state = convert_state(hf_model.state_dict())
    with output_folder(final) as tmp:
        with open(os.path.join(tmp, "dict.txt"), "w", encoding="utf-8") as f:
            for s in symbols[len(SPECIALS) : len(symbols) - int(has_mask)]:
                f.write(f"{s} 1\n")
        d = Dictionary.load(os.path.join(tmp, "dict.txt"))
        if has_mask:
            d.add_symbol(MASK)  # as fairseq's denoising task does
        assert d.symbols == symbols, "dict.txt does not give each HF id its row"
        model = BARTModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
        target = model.state_dict()
        unset = sorted(k for k in target if k not in state and not k.endswith(".version"))
        unknown = sorted(set(state) - set(target))
        shapes = sorted(
            f"{k} {tuple(v.shape)} -> {tuple(target[k].shape)}"
            for k, v in state.items()
            if k in target and v.shape != target[k].shape
        )
        problems = [
            f"{len(names)} {what}: {some_names(names)}"
            for names, what in (
                (unset, "fairseq tensors left unset"),
                (unknown, "tensors fairseq's BART has no place for"),
                (shapes, "shapes differ"),
            )
            if names
        ]
        if problems:
            raise DataError(hf_dir, 0, "the conversion does not fit fairseq's BART: " + " | ".join(problems))
        torch.nn.Module.load_state_dict(model, {**target, **state}, strict=True)
        ckpt = {  # the released checkpoints' layout: argparse args, no training state
            "args": args,
            "model": model.state_dict(),
            "optimizer_history": [{"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}}],
            "extra_state": {"train_iterator": {"epoch": 0, "iterations_in_epoch": 0}},
            "last_optimizer_state": None,
        }
        checkpoint_utils.torch_persistent_save(ckpt, os.path.join(tmp, "model.pt"))
        with open(os.path.join(tmp, "encoder.json"), "w", encoding="utf-8") as f:
            json.dump(gpt2, f, ensure_ascii=False)
        with open(os.path.join(tmp, "vocab.bpe"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(m + "\n" for m in merges))  # fairseq drops the first and last line
    n = sum(p.numel() for p in model.parameters())
    print(
        f"{hf_dir} -> {final}/model.pt: {hf_cfg.encoder_layers}+{hf_cfg.decoder_layers} layers x {hf_cfg.d_model}, "
        f"{n} parameters; dict.txt {len(symbols)} rows{' with <mask>' if has_mask else ''} (HF id = fairseq id, "
        f"symbols GPT-2 ids); encoder.json / vocab.bpe: {len(gpt2)} GPT-2 tokens, {len(merges)} merges"
    )
    return os.path.join(final, "model.pt")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "hf_dir", help="save_pretrained folder of BartForConditionalGeneration (config.json, weights, tokenizer)"
    )
    p.add_argument(
        "out_dir", help="writes model.pt, dict.txt, encoder.json, vocab.bpe (the recipe's PRETRAINED folder)"
    )
    a = p.parse_args(argv)
    convert(a.hf_dir, a.out_dir)


if __name__ == "__main__":
    cli_entry(main)
