"""HuggingFace GPT-2 (``GPT2LMHeadModel``) -> a fairseq ``transformer_lm`` checkpoint.

CoCon (Chan et al., ICLR 2021) sits inside GPT-2; fairseq releases
no GPT-2. This converter writes one that ``fairseq-eval-lm``, ``fairseq-train --task
language_modeling`` and ``--cocon-lm-path`` load::

    python -m fairseq_knowgen.convert.hf_gpt2 HF_DIR OUT_DIR [--allow-vocab-mismatch]

``HF_DIR``: a ``save_pretrained`` folder of ``GPT2LMHeadModel`` (config.json and the weights; read
by ``transformers`` with ``local_files_only``). ``OUT_DIR`` receives:

- ``checkpoint.pt``: fairseq's checkpoint layout with a full ``cfg`` (``--task language_modeling
  --arch transformer_lm``, ``--decoder-learned-pos --no-scale-embedding --activation-fn
  gelu_accurate --share-decoder-input-output-embed``, pre-norm, final LayerNorm,
  ``--tokens-per-sample`` = ``--max-target-positions`` = GPT-2's ``n_positions``);
- ``dict.txt``: the GPT-2 BPE ids as symbols (``"0"``, ``"1"``, ...) in id order, which is how
  fairseq's own GPT-2 BPE pipeline names them (``fairseq.data.encoders.gpt2_bpe`` writes a BPE'd
  text as its ids, ``"1212 318"``). fairseq's :class:`~fairseq.data.Dictionary` puts ``<s> <pad>
  </s> <unk>`` at 0-3, so GPT-2 id i is fairseq id i + 4, except GPT-2's ``<|endoftext|>``
  (``eos_token_id``), which *is* fairseq's ``</s>`` (id 2) and has no line of its own: fairseq
  LMs read ``</s> w_1 .. w_n`` and stop at ``</s>``, as GPT-2 reads ``<|endoftext|> w_1 ..``;
- ``encoder.json`` / ``vocab.bpe`` (fairseq's ``--gpt2-encoder-json`` / ``--gpt2-vocab-bpe``),
  from ``HF_DIR``'s ``encoder.json``/``vocab.bpe``, its tokenizer's ``vocab.json``/``merges.txt``
  (the same contents under other names) or its ``tokenizer.json`` (transformers >= 5 saves only
  that); fairseq skips the first line of ``vocab.bpe``, so a ``#version`` line is put first when
  missing.

The weights (GPT-2's ``Conv1D`` computes ``x W + b``, fairseq's ``Linear`` ``x W^T + b``)::

    wte                  -> decoder.embed_tokens (rows moved to fairseq's ids, see below)
    wpe  (n_positions)   -> decoder.embed_positions rows padding_idx+1 .. (fairseq's
                            LearnedPositionalEmbedding numbers positions from padding_idx + 1;
                            rows 0..padding_idx stay zero)
    h.i.ln_1 / ln_2      -> layers.i.self_attn_layer_norm / final_layer_norm
    h.i.attn.c_attn      -> layers.i.self_attn.{q,k,v}_proj (the fused C x 3C split, transposed)
    h.i.attn.c_proj      -> layers.i.self_attn.out_proj (transposed)
    h.i.mlp.c_fc / c_proj-> layers.i.fc1 / fc2 (transposed)
    ln_f                 -> decoder.layer_norm
    lm_head              -> decoder.output_projection (tied to embed_tokens, as GPT-2's)

The three rows fairseq has and GPT-2 has not (``<s>``, ``<pad>``, ``<unk>``) start as the mean of
GPT-2's embedding rows. With the tied output their logit is then the mean of the real logits,
so by Jensen's inequality each has probability at most 1/|V| (a zero row would get logit 0,
far above GPT-2's typical logits, and take most of the mass). fairseq's search never emits
``<pad>``; the other two are never targets.

Every GPT-2 tensor must be used and every fairseq tensor set: anything else stops with an error
naming the tensors, as does a configuration fairseq's layers cannot express (another LayerNorm
epsilon, attention scaled by layer index, cross-attention, an unknown activation), weights that lack
a tensor (``transformers`` would start it at random), and a BPE vocabulary of another model: an id
beyond the embedding rows, or (unless ``--allow-vocab-mismatch``) fewer tokens than rows. Damaged
downloads (weights cut short, a JSON file that is not JSON) stop with ``error: FILE[:LINE]: ...:
re-download FILE`` (:mod:`fairseq_knowgen.convert.downloads`). Every input is read and checked before
anything is written.
"""

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Tuple

import torch

from ..textio import DataError, cli_entry, output_folder
from .downloads import check_vocab_size, load_config, load_model, read_json, read_text
from .fairseq_legacy import some_names

# GPT-2's activation names -> fairseq's (gelu_new: GPT-2's tanh approximation = fairseq's gelu_accurate)
ACTIVATIONS = {"gelu_new": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate", "gelu": "gelu", "relu": "relu"}
BPE_FILES = {"encoder.json": ("encoder.json", "vocab.json"), "vocab.bpe": ("vocab.bpe", "merges.txt")}


def gpt2_dictionary(vocab_size: int, eos_id: int):
    """fairseq's dictionary of GPT-2 BPE ids: ``<s> <pad> </s> <unk>``, then ``"0" .. "V-1"`` in
    id order without ``eos_id`` (which is ``</s>``)."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(vocab_size):
        if i != eos_id:
            d.add_symbol(str(i), n=1)
    return d


def gpt2_rows(dictionary, vocab_size: int, eos_id: int) -> torch.Tensor:
    """``rows[i]``: the fairseq id of GPT-2 id i (``vocab_size``)."""
    return torch.tensor([dictionary.eos() if i == eos_id else dictionary.index(str(i)) for i in range(vocab_size)])


def lm_flags(hf_cfg, where: str = "config.json") -> List[str]:
    """fairseq ``transformer_lm`` flags that reproduce the GPT-2 of ``hf_cfg`` (a GPT2Config read
    from ``where``)."""
    act = ACTIVATIONS.get(hf_cfg.activation_function)
    problems = []
    if act is None:
        problems.append(f"activation_function {hf_cfg.activation_function!r} (fairseq has {sorted(ACTIVATIONS)})")
    if abs(hf_cfg.layer_norm_epsilon - 1e-5) > 1e-12:
        problems.append(f"layer_norm_epsilon {hf_cfg.layer_norm_epsilon} (fairseq's LayerNorm uses 1e-5)")
    if not getattr(hf_cfg, "scale_attn_weights", True) or getattr(hf_cfg, "scale_attn_by_inverse_layer_idx", False):
        problems.append("attention not scaled by 1/sqrt(head dim) alone (scale_attn_weights/_by_inverse_layer_idx)")
    if getattr(hf_cfg, "add_cross_attention", False):
        problems.append("add_cross_attention")
    if hf_cfg.eos_token_id is None:
        problems.append("no eos_token_id (GPT-2's <|endoftext|> becomes fairseq's </s>)")
    if problems:
        raise DataError(where, 0, "this GPT-2 cannot be a fairseq transformer_lm: " + "; ".join(problems))
    C = hf_cfg.n_embd
    tied = ["--share-decoder-input-output-embed"] if hf_cfg.tie_word_embeddings else []
    # fmt: off
    return tied + [
        "--decoder-layers", str(hf_cfg.n_layer),
        # fairseq 0.12's transformer_lm defaults input/output dims to 512 whatever the width (then projects)
        "--decoder-embed-dim", str(C), "--decoder-input-dim", str(C), "--decoder-output-dim", str(C),
        "--decoder-ffn-embed-dim", str(hf_cfg.n_inner or 4 * C),
        "--decoder-attention-heads", str(hf_cfg.n_head),
        "--decoder-learned-pos", "--no-scale-embedding", "--decoder-normalize-before",
        "--activation-fn", act,
        "--dropout", str(hf_cfg.resid_pdrop), "--attention-dropout", str(hf_cfg.attn_pdrop),
        "--tokens-per-sample", str(hf_cfg.n_positions), "--max-target-positions", str(hf_cfg.n_positions),
    ]
    # fmt: on


def lm_config(data: str, flags: List[str]):
    """The full fairseq config of ``fairseq-train DATA --task language_modeling --arch transformer_lm FLAGS``."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [data, "--task", "language_modeling", "--arch", "transformer_lm", "--cpu", *flags]
    )
    return convert_namespace_to_omegaconf(args)


def save_lm_checkpoint(cfg, model, path: str):
    """``model`` saved as fairseq's trainer saves a checkpoint (``cfg`` a plain container, which
    torch's weights-only loader reads), loadable by ``fairseq-eval-lm --path`` and ``--restore-file``."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    state = {
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "args": None,
        "optimizer_history": [
            {"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {"best": None}}
        ],
        "extra_state": {"train_iterator": {"epoch": 0, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }
    checkpoint_utils.torch_persistent_save(state, path)


def convert_state(hf: Dict[str, torch.Tensor], hf_cfg, rows: torch.Tensor, n_rows: int, padding_idx: int):
    """fairseq ``transformer_lm`` tensors from a ``GPT2LMHeadModel`` state dict (see the module
    docstring). Raises :class:`DataError` naming GPT-2 tensors left unused."""
    used = set()

    def take(name):
        if name not in hf:
            raise DataError("model weights", 0, f"GPT-2 tensor {name} is missing")
        used.add(name)
        return hf[name].float()

    def move_rows(w):  # V x C (GPT-2 ids) -> n_rows x C (fairseq ids); fairseq's extra rows: the mean row
        out = w.mean(0, keepdim=True).repeat(n_rows, 1)
        out[rows] = w
        return out

    def linear(prefix, conv):  # GPT-2 Conv1D (x W + b, W: in x out) -> fairseq Linear (x W^T + b)
        return {f"{prefix}.weight": take(f"{conv}.weight").t().contiguous(), f"{prefix}.bias": take(f"{conv}.bias")}

    def norm(prefix, ln):
        return {f"{prefix}.weight": take(f"{ln}.weight"), f"{prefix}.bias": take(f"{ln}.bias")}

    wte, wpe = take("transformer.wte.weight"), take("transformer.wpe.weight")
    out = {
        "decoder.embed_tokens.weight": move_rows(wte),
        # fairseq's first position is padding_idx + 1
        "decoder.embed_positions.weight": torch.cat([wpe.new_zeros(padding_idx + 1, wpe.size(1)), wpe]),
        **norm("decoder.layer_norm", "transformer.ln_f"),
    }
    for i in range(hf_cfg.n_layer):
        h, f = f"transformer.h.{i}", f"decoder.layers.{i}"
        w, b = take(f"{h}.attn.c_attn.weight"), take(f"{h}.attn.c_attn.bias")  # C x 3C, 3C: q | k | v
        for name, wi, bi in zip("qkv", w.chunk(3, dim=1), b.chunk(3)):
            out[f"{f}.self_attn.{name}_proj.weight"] = wi.t().contiguous()
            out[f"{f}.self_attn.{name}_proj.bias"] = bi.clone()
        out.update(linear(f"{f}.self_attn.out_proj", f"{h}.attn.c_proj"))
        out.update(linear(f"{f}.fc1", f"{h}.mlp.c_fc"))
        out.update(linear(f"{f}.fc2", f"{h}.mlp.c_proj"))
        out.update(norm(f"{f}.self_attn_layer_norm", f"{h}.ln_1"))
        out.update(norm(f"{f}.final_layer_norm", f"{h}.ln_2"))
    if hf_cfg.tie_word_embeddings:
        out["decoder.output_projection.weight"] = out["decoder.embed_tokens.weight"]
        used.add("lm_head.weight")
    else:
        out["decoder.output_projection.weight"] = move_rows(take("lm_head.weight"))
    # causal-mask buffers of older transformers versions are not weights
    unused = sorted(k for k in hf if k not in used and not k.endswith((".attn.bias", ".attn.masked_bias")))
    if unused:
        raise DataError("model weights", 0, f"GPT-2 tensors this converter does not know: {some_names(unused)}")
    return out


def bpe_files_from_tokenizer_json(path: str):
    """``(encoder dict, merges text)`` of a ``tokenizers`` BPE file (what transformers >= 5 saves
    instead of ``vocab.json`` / ``merges.txt``)."""
    tok = read_json(path, "tokenizer file")
    model = tok.get("model") if isinstance(tok, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "BPE":
        raise DataError(path, 0, f"not a BPE tokenizer (model type {kind!r})")
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise DataError(path, 0, "a BPE model without its vocab (token -> id) and merges: re-download tokenizer.json")
    encoder = dict(vocab)
    for added in tok.get("added_tokens") or []:  # <|endoftext|>
        if isinstance(added, dict) and "content" in added and "id" in added:
            encoder.setdefault(added["content"], added["id"])
    merges = [m if isinstance(m, str) else " ".join(map(str, m)) for m in merges]
    return encoder, "".join(m + "\n" for m in merges)


def read_bpe_files(hf_dir: str) -> Optional[Tuple[Dict[str, int], str, str]]:
    """``(encoder, merges text, the file the encoder came from)`` of ``hf_dir``: fairseq's
    ``encoder.json`` / ``vocab.bpe``, the HF tokenizer's ``vocab.json`` / ``merges.txt``, or its
    ``tokenizer.json``; None when the folder has none of them. The merges start with fairseq's
    ``#version`` line and end with a newline."""

    def first(*names):
        return next((os.path.join(hf_dir, n) for n in names if os.path.isfile(os.path.join(hf_dir, n))), None)

    enc_path, merges_path = first(*BPE_FILES["encoder.json"]), first(*BPE_FILES["vocab.bpe"])
    if enc_path and merges_path:
        encoder, merges = read_json(enc_path, "BPE vocabulary"), read_text(merges_path)
    elif first("tokenizer.json"):
        enc_path = first("tokenizer.json")
        encoder, merges = bpe_files_from_tokenizer_json(enc_path)
    else:
        return None
    if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
        raise DataError(enc_path, 0, "not a BPE vocabulary (a JSON object of token -> integer id)")
    if not merges.startswith("#version"):  # fairseq's get_encoder drops the first line ...
        merges = "#version: 0.2\n" + merges
    if not merges.endswith("\n"):  # ... and the last one
        merges += "\n"
    return encoder, merges, enc_path


def write_bpe_files(encoder: Dict[str, int], merges: str, out_dir: str) -> List[str]:
    """``OUT_DIR/encoder.json`` and ``OUT_DIR/vocab.bpe``; the names written."""
    with open(os.path.join(out_dir, "encoder.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "vocab.bpe"), "w", encoding="utf-8") as f:
        f.write(merges)
    return ["encoder.json", "vocab.bpe"]


def copy_bpe_files(hf_dir: str, out_dir: str) -> List[str]:
    """``encoder.json`` / ``vocab.bpe`` for fairseq's GPT-2 BPE from ``hf_dir`` (:func:`read_bpe_files`).
    The names written."""
    bpe = read_bpe_files(hf_dir)
    return write_bpe_files(*bpe[:2], out_dir) if bpe else []


def check_encoder(encoder: Dict[str, int], where: str, config_path: str, vocab_size: int, allow_mismatch: bool):
    """Refuse BPE ids beyond the model's ``vocab_size`` embedding rows, and (unless ``allow_mismatch``)
    a BPE vocabulary of another size than the model's."""
    bad = sorted(i for i in encoder.values() if not 0 <= i < vocab_size)
    if bad:
        raise DataError(
            where,
            0,
            f"BPE ids outside the model's {vocab_size} embeddings, e.g. {bad[:5]} ({len(encoder)} tokens for "
            f"{vocab_size} rows): not this model's tokenizer; use the one released with this model",
        )
    if not allow_mismatch:
        unused = vocab_size - len(set(encoder.values()))
        allowed = f"the {unused} rows without a token are never produced by the BPE"
        check_vocab_size(where, len(encoder), config_path, vocab_size, allowed=allowed)


def convert(hf_dir: str, out_dir: str, allow_vocab_mismatch: bool = False) -> str:
    """Convert ``hf_dir`` into ``out_dir`` (see the module docstring); returns the checkpoint's path. A
    BPE vocabulary whose size is not the model's is refused unless ``allow_vocab_mismatch``."""
    from fairseq.models.transformer_lm import TransformerLanguageModel
    from fairseq.tasks.language_modeling import LanguageModelingTask
    from transformers import GPT2Config, GPT2LMHeadModel

    config_path = os.path.join(hf_dir, "config.json")
    hf_cfg = load_config(GPT2Config, hf_dir, "GPT-2")
    flags = lm_flags(hf_cfg, config_path)
    V, eos = hf_cfg.vocab_size, hf_cfg.eos_token_id
    bpe = read_bpe_files(hf_dir)
    if bpe:
        check_encoder(bpe[0], bpe[2], config_path, V, allow_vocab_mismatch)
    hf_model = load_model(GPT2LMHeadModel, hf_dir)
    # the outputs go to a temporary folder that replaces OUT_DIR's own files only when all are written (a failed
    # conversion leaves OUT_DIR as it was, or absent); other files there are kept
    with output_folder(out_dir, owned=["dict.txt", "checkpoint.pt", "encoder.json", "vocab.bpe"]) as tmp:
        d = gpt2_dictionary(V, eos)
        d.save(os.path.join(tmp, "dict.txt"))
        cfg = lm_config(os.path.abspath(out_dir), flags)
        model = LanguageModelingTask(cfg.task, d).build_model(cfg.model)
        assert isinstance(model, TransformerLanguageModel)
        target = model.state_dict()
        state = convert_state(hf_model.state_dict(), hf_cfg, gpt2_rows(d, V, eos), len(d), d.pad())
        # fairseq's own bookkeeping buffers (decoder.version) keep their values
        missing = sorted(k for k in target if k not in state and not k.endswith(".version"))
        wrong = sorted(k for k in state if k in target and state[k].shape != target[k].shape)
        if missing or wrong or set(state) - set(target):
            raise DataError(
                hf_dir,
                0,
                f"conversion does not fit fairseq's model: not set [{some_names(missing)}], wrong shapes "
                f"[{some_names(wrong)}], unknown [{some_names(sorted(set(state) - set(target)))}]",
            )
        target.update(state)
        model.load_state_dict(target, strict=True)
        path = os.path.join(out_dir, "checkpoint.pt")
        save_lm_checkpoint(cfg, model, os.path.join(tmp, "checkpoint.pt"))
        written = write_bpe_files(*bpe[:2], tmp) if bpe else []
    n = sum(p.numel() for p in model.parameters())
    print(
        f"{hf_dir} -> {path}: {hf_cfg.n_layer} layers x {hf_cfg.n_embd}, {n} parameters, dict.txt {len(d)} "
        f"symbols (GPT-2 id i = fairseq id {d.index('0')}+i, <|endoftext|> {eos} = </s>), BPE files: "
        f"{', '.join(written) or 'none'}"
    )
    if bpe and len(bpe[0]) != V:
        print(f"warning: {bpe[2]}: {len(bpe[0])} BPE tokens for {V} embedding rows", file=sys.stderr)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hf_dir", help="HuggingFace GPT2LMHeadModel folder (config.json, weights, tokenizer files)")
    p.add_argument("out_dir", help="folder for checkpoint.pt, dict.txt, encoder.json, vocab.bpe")
    p.add_argument(
        "--allow-vocab-mismatch",
        action="store_true",
        help="convert a BPE vocabulary with fewer tokens than the model's vocab_size (its rows without a token are "
        "never produced; refused without this flag)",
    )
    a = p.parse_args(argv)
    convert(a.hf_dir, a.out_dir, a.allow_vocab_mismatch)


if __name__ == "__main__":
    cli_entry(main)
