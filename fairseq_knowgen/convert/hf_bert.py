"""HuggingFace BERT (Google's Chinese BERT) -> the encoder checkpoint and dictionary K-BERT starts from.

K-BERT (Liu et al., 2020; ``shared/seeds/k_bert.zh.txt``) fine-tunes Google's Chinese BERT. This
converter reads a ``save_pretrained`` folder of ``BertModel`` or ``BertForPreTraining`` (config.json,
the weights and ``vocab.txt``; read by ``transformers`` with ``local_files_only``) and writes::

    python -m fairseq_knowgen.convert.hf_bert HF_DIR OUT_DIR

- ``OUT_DIR/dict.txt``: BERT's ``vocab.txt`` in BERT's id order, less its five special tokens,
  which become fairseq's: ``[CLS]`` -> ``<s>`` (0), ``[PAD]`` -> ``<pad>`` (1), ``[SEP]`` ->
  ``</s>`` (2), ``[UNK]`` -> ``<unk>`` (3), and ``[MASK]`` -> ``<mask>``, which the K-BERT tasks
  (like fairseq's ``masked_lm``) append after ``dict.txt``: the last row. K-BERT's
  ``<s> a </s> [b </s>]`` is then BERT's ``[CLS] a [SEP] [b [SEP]]``. Use it as the K-BERT data
  folder's ``dict.txt`` (``prep.kbert --srcdict``, or the recipe's ``PRETRAINED=OUT_DIR``);
- ``OUT_DIR/model.pt``: a fairseq checkpoint (``args`` of ``--arch kbert_base`` with BERT's sizes)
  whose model tensors are in fairseq's masked-LM layout, which ``--kbert-pretrained`` loads::

    embeddings.word_embeddings          -> encoder.sentence_encoder.embed_tokens (rows in fairseq's order)
    embeddings.position_embeddings (P)  -> embed_positions, rows 2 .. P+1: fairseq's learned positions
                                           number position p as p + padding_idx + 1; rows 0 and 1 (the
                                           padding row) are zero and never read for a token
    embeddings.token_type_embeddings    -> segment_embeddings (fairseq's TransformerSentenceEncoder
                                           name): K-BERT's segment ids 0 (a) and 1 (b)
    embeddings.LayerNorm                -> layernorm_embedding
    layer.i.attention.self.query/key/value -> layers.i.self_attn.q_proj / k_proj / v_proj
    layer.i.attention.output.dense / LayerNorm -> layers.i.self_attn.out_proj / self_attn_layer_norm
    layer.i.intermediate.dense / output.dense / output.LayerNorm -> layers.i.fc1 / fc2 / final_layer_norm

  BERT is post-LN with an embedding LayerNorm and GELU (erf), which is K-BERT's layout
  (``encoder_normalize_before`` off, ``layernorm_embedding`` on, ``--activation-fn gelu``); its
  LayerNorm epsilon (1e-12) and segment count (2) are in the args, and ``--kbert-pretrained``
  takes them when the flags leave them unset. BERT's pooler, masked-LM and next-sentence heads
  are not converted (K-BERT fine-tunes its own heads).

Every encoder tensor of BERT is used and every K-BERT encoder tensor set; anything else stops
with an error naming the tensors, as does a configuration K-BERT's layers cannot express
(relative position embeddings, a decoder or cross-attention, an unknown activation).
"""

import argparse
import os
from typing import Dict, List

import torch

from ..textio import DataError, cli_entry, read_lines

# BERT's special tokens -> fairseq's (the dictionary's four, then <mask> appended by the task)
SPECIALS = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>", "[MASK]": "<mask>"}
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate", "relu": "relu"}
PREFIX = "encoder.sentence_encoder."


def bert_dictionary(vocab_path: str, vocab_size: int):
    """``(fairseq Dictionary with <mask> appended, rows)``: ``rows[i]`` is the BERT id of fairseq id
    i. Raises :class:`DataError` for a vocabulary that fairseq's ``dict.txt`` cannot hold."""
    from fairseq.data import Dictionary

    vocab = read_lines(vocab_path, "vocabulary", allow_empty_lines=False)
    if len(vocab) != vocab_size:
        raise DataError(vocab_path, 0, f"{len(vocab)} tokens, config.json says vocab_size {vocab_size}")
    seen = {}
    for n, tok in enumerate(vocab, start=1):
        if tok != tok.strip() or " " in tok:
            raise DataError(vocab_path, n, f"token {tok!r} has spaces (dict.txt cannot hold it)")
        if tok in seen:
            raise DataError(vocab_path, n, f"token {tok!r} again (first on line {seen[tok]})")
        if tok in SPECIALS.values() or tok.startswith("madeupword"):
            raise DataError(vocab_path, n, f"token {tok!r} is one of fairseq's own symbols")
        seen[tok] = n
    missing = [t for t in SPECIALS if t not in seen]
    if missing:
        raise DataError(vocab_path, 0, f"no {', '.join(missing)} (BERT's special tokens)")
    d = Dictionary()  # <s> <pad> </s> <unk> = [CLS] [PAD] [SEP] [UNK]
    for tok in vocab:
        if tok not in SPECIALS:
            d.add_symbol(tok, n=1)
    d.add_symbol("<mask>")  # as the K-BERT tasks do after loading dict.txt
    bert_id = {tok: i for i, tok in enumerate(vocab)}
    by_fairseq = {fs: bert for bert, fs in SPECIALS.items()}
    rows = [bert_id[by_fairseq.get(d[i], d[i])] for i in range(len(d))]
    assert sorted(rows) == list(range(vocab_size))  # a permutation of BERT's rows
    return d, torch.tensor(rows)


def kbert_flags(hf_cfg, where: str) -> List[str]:
    """The ``--arch kbert_base`` flags of a ``BertConfig``; :class:`DataError` for what K-BERT
    cannot express."""
    act = hf_cfg.hidden_act if isinstance(hf_cfg.hidden_act, str) else None
    problems = []
    if act not in ACTIVATIONS:
        problems.append(f"activation {hf_cfg.hidden_act!r}")
    if getattr(hf_cfg, "position_embedding_type", "absolute") not in (None, "absolute"):
        problems.append(f"position_embedding_type {hf_cfg.position_embedding_type!r}")
    if getattr(hf_cfg, "is_decoder", False) or getattr(hf_cfg, "add_cross_attention", False):
        problems.append("a decoder / cross-attention")
    if hf_cfg.hidden_size % hf_cfg.num_attention_heads:
        problems.append("hidden_size not divisible by num_attention_heads")
    if problems:
        raise DataError(where, 0, f"K-BERT cannot express {', '.join(problems)}")
    return [
        *("--encoder-layers", str(hf_cfg.num_hidden_layers), "--encoder-embed-dim", str(hf_cfg.hidden_size)),
        *("--encoder-ffn-embed-dim", str(hf_cfg.intermediate_size)),
        *("--encoder-attention-heads", str(hf_cfg.num_attention_heads), "--activation-fn", ACTIVATIONS[act]),
        *("--num-segments", str(hf_cfg.type_vocab_size), "--layer-norm-eps", repr(float(hf_cfg.layer_norm_eps))),
        *("--max-positions", str(hf_cfg.max_position_embeddings), "--dropout", str(hf_cfg.hidden_dropout_prob)),
        *("--attention-dropout", str(hf_cfg.attention_probs_dropout_prob)),
    ]


def convert_state(hf: Dict[str, torch.Tensor], num_layers: int, rows: torch.Tensor, padding_idx: int):
    """K-BERT encoder tensors (fairseq's masked-LM layout) from a ``BertModel`` state dict (see
    the module docstring). Raises :class:`DataError` naming BERT tensors left unused."""
    used = set()

    def take(name):
        if name not in hf:
            raise DataError("model weights", 0, f"BERT tensor {name} is missing")
        used.add(name)
        return hf[name].float()

    def linear(ours, theirs):
        return {f"{PREFIX}{ours}.weight": take(f"{theirs}.weight"), f"{PREFIX}{ours}.bias": take(f"{theirs}.bias")}

    ln = linear  # a LayerNorm has weight and bias too
    pos = take("embeddings.position_embeddings.weight")  # P x C
    out = {
        PREFIX + "embed_tokens.weight": take("embeddings.word_embeddings.weight")[rows],  # V x C, fairseq's order
        PREFIX + "embed_positions.weight": torch.cat([pos.new_zeros(padding_idx + 1, pos.size(1)), pos]),
        PREFIX + "segment_embeddings.weight": take("embeddings.token_type_embeddings.weight"),
        **ln("layernorm_embedding", "embeddings.LayerNorm"),
    }
    for i in range(num_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        for ours, theirs in (
            ("self_attn.q_proj", "attention.self.query"),
            ("self_attn.k_proj", "attention.self.key"),
            ("self_attn.v_proj", "attention.self.value"),
            ("self_attn.out_proj", "attention.output.dense"),
            ("fc1", "intermediate.dense"),
            ("fc2", "output.dense"),
        ):
            out.update(linear(dst + ours, src + theirs))
        out.update(ln(dst + "self_attn_layer_norm", src + "attention.output.LayerNorm"))
        out.update(ln(dst + "final_layer_norm", src + "output.LayerNorm"))
    left = sorted(k for k in hf if k not in used and not k.startswith("pooler.") and not k.endswith("position_ids"))
    if left:
        raise DataError("model weights", 0, f"BERT tensors not converted: {', '.join(left)}")
    return out


def convert(hf_dir: str, out_dir: str) -> str:
    """Write ``out_dir/model.pt`` and ``out_dir/dict.txt`` from the BERT folder ``hf_dir``."""
    from fairseq import checkpoint_utils, options
    from transformers import BertConfig, BertModel

    import fairseq_knowgen  # noqa: F401  (registers --arch kbert_base)

    config_path, vocab_path = os.path.join(hf_dir, "config.json"), os.path.join(hf_dir, "vocab.txt")
    for path in (config_path, vocab_path):
        if not os.path.isfile(path):
            raise DataError(path, 0, "not found (a save_pretrained BERT folder has config.json and vocab.txt)")
    hf_cfg = BertConfig.from_pretrained(hf_dir, local_files_only=True)
    flags = kbert_flags(hf_cfg, config_path)
    model, info = BertModel.from_pretrained(hf_dir, local_files_only=True, output_loading_info=True)
    missing = [k for k in info.get("missing_keys", []) if not k.startswith("pooler.")]
    if missing:
        missing = ", ".join(sorted(missing))
        raise DataError(hf_dir, 0, f"the weights lack {missing} (transformers would start them at random)")
    dictionary, rows = bert_dictionary(vocab_path, hf_cfg.vocab_size)
    state = convert_state(model.state_dict(), hf_cfg.num_hidden_layers, rows, dictionary.pad())
    os.makedirs(out_dir, exist_ok=True)
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [out_dir, "--user-dir", "fairseq_knowgen", "--task", "kbert_classification", "--arch", "kbert_base", *flags],
    )
    with open(os.path.join(out_dir, "dict.txt"), "w", encoding="utf-8") as f:
        for i in range(dictionary.nspecial, len(dictionary) - 1):  # not the specials, not <mask> (the task adds it)
            f.write(f"{dictionary[i]} 1\n")
    path = os.path.join(out_dir, "model.pt")
    ckpt = {  # fairseq's checkpoint layout, no training state (--restore-file needs the --reset-* flags)
        "args": args,
        "model": state,
        "optimizer_history": [{"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}}],
        "extra_state": {"train_iterator": {"epoch": 0, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }
    checkpoint_utils.torch_persistent_save(ckpt, path)
    print(f"{path}: {len(state)} tensors ({' '.join(flags)}); {out_dir}/dict.txt: {len(dictionary)} rows with <mask>")
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("hf_dir", help="save_pretrained folder of BertModel / BertForPreTraining (config.json, vocab.txt)")
    p.add_argument("out_dir", help="writes model.pt (--kbert-pretrained) and dict.txt (the K-BERT data's dict.txt)")
    a = p.parse_args(argv)
    convert(a.hf_dir, a.out_dir)


if __name__ == "__main__":
    cli_entry(main)
