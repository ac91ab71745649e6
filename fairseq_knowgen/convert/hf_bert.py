"""HuggingFace BERT (Google's Chinese BERT) -> the encoder checkpoint and dictionary K-BERT starts from.

K-BERT (Liu et al., 2020, "K-BERT: Enabling Language Representation with Knowledge Graph")
fine-tunes Google's Chinese BERT. This converter reads a ``save_pretrained`` folder of ``BertModel``
or ``BertForPreTraining`` (config.json, the weights as safetensors or ``pytorch_model.bin``, read
by ``transformers`` with ``local_files_only``, and the vocabulary) and writes, from any working
folder::

    python -m fairseq_knowgen.convert.hf_bert HF_DIR OUT_DIR [--allow-vocab-mismatch]

The vocabulary is ``HF_DIR/vocab.txt`` or, when the folder has none (``save_pretrained`` of
``transformers`` 5 writes only ``tokenizer.json``), the WordPiece vocabulary of
``HF_DIR/tokenizer.json`` (``model.vocab`` and ``added_tokens``, by id), as ``transformers``
itself reads them. ``vocab.txt`` is read as ``transformers``' ``load_vocab`` reads it: one token
per line, lines ending at ``\n`` (``\r\n`` and ``\r``, as Python's text files); no other
character ends a line and nothing is stripped, so Google's Chinese vocabulary keeps U+2028
(LINE SEPARATOR) as token 343 and ``##`` + U+2028 as token 13,502. The special tokens are
``special_tokens_map.json``'s (else BERT's ``[CLS] [PAD] [SEP] [UNK] [MASK]``).

- ``OUT_DIR/dict.txt``: the vocabulary in BERT's id order, less its five special tokens, which
  become fairseq's: ``[CLS]`` -> ``<s>`` (0), ``[PAD]`` -> ``<pad>`` (1), ``[SEP]`` -> ``</s>`` (2),
  ``[UNK]`` -> ``<unk>`` (3), and ``[MASK]`` -> ``<mask>``, which the K-BERT tasks (like fairseq's
  ``masked_lm``) append after ``dict.txt``: the last row. K-BERT's ``<s> a </s> [b </s>]`` is then
  BERT's ``[CLS] a [SEP] [b [SEP]]``. A token that a ``dict.txt`` line cannot name (empty, holding
  a whitespace character such as U+2028, one of fairseq's own symbols ``<s> <pad> </s> <unk>
  <mask>``, or an earlier copy of a repeated token, which BERT's tokenizer never maps to) keeps
  its row under the stand-in symbol ``<bert-id-N>`` (N its BERT id). No tokenizer of this package
  produces a stand-in (K-BERT reads one character at a time), so those rows stay where BERT has
  them and are never read, as in BERT. Use the file as the K-BERT data folder's ``dict.txt``
  (``prep.kbert --srcdict``, or the recipe's ``PRETRAINED=OUT_DIR``);
- ``OUT_DIR/model.pt``: a fairseq checkpoint (``args`` of ``--arch kbert_base`` with BERT's sizes,
  which ``--kbert-pretrained`` takes) whose model tensors are in fairseq's masked-LM layout::

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
  sizes, LayerNorm epsilon (1e-12) and segment count (2) are in the args, and ``--kbert-pretrained``
  takes them when the flags leave them unset. BERT's pooler, masked-LM and next-sentence heads
  are not converted (K-BERT fine-tunes its own heads). ``--encoder-pretrained`` reads the same file
  (:mod:`fairseq_knowgen.models.pretrained_encoder`);
- ``OUT_DIR/config.json`` and the tokenizer files the folder has (``tokenizer.json``, ``vocab.txt``,
  ``tokenizer_config.json``, ``special_tokens_map.json``), copied as they are: what
  ``python -m fairseq_knowgen.prep.wordpiece OUT_DIR ...`` tokenizes the source with.

A vocabulary whose size is not ``config.json``'s ``vocab_size`` belongs to another model (Chinese
BERT's 21,128 tokens beside an English BERT's 30,522 rows would leave 9,394 rows without a token) and
is refused, naming both sizes, unless ``--allow-vocab-mismatch`` says it is meant: rows beyond the
token list then keep stand-ins ``<bert-id-N>``, tokens beyond the last row are left out, and the
converter says how many. Damaged downloads (a ``model.safetensors`` or ``pytorch_model.bin`` cut
short, a JSON file that is not JSON) stop with ``error: FILE[:LINE]: ...: re-download FILE`` and exit
status 2 (:mod:`fairseq_knowgen.convert.downloads`).

Every encoder tensor of BERT is used and every K-BERT encoder tensor set; anything else stops
with an error naming the tensors (a dozen and the count of the rest), as does a configuration
K-BERT's layers cannot express (relative position embeddings, a decoder or cross-attention, an
unknown activation). The output folder is written beside ``OUT_DIR`` under a temporary name and
swapped in at the end (:func:`fairseq_knowgen.textio.output_folder`): a failed conversion leaves no
folder, and an earlier ``OUT_DIR`` stays as it was until the new one is complete (files there other
than ``model.pt`` and ``dict.txt`` are kept).
"""

import argparse
import collections
import io
import os
import shutil
import sys
from typing import Dict, List, Optional, Tuple

import torch

from ..textio import DataError, cli_entry, output_folder
from .downloads import check_vocab_size, load_config, load_model, read_json
from .fairseq_legacy import some_names

# BERT's special tokens -> fairseq's (the dictionary's four, then <mask> appended by the task)
SPECIALS = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>", "[MASK]": "<mask>"}
SPECIAL_KEYS = {  # special_tokens_map.json's keys -> BERT's default names
    "cls_token": "[CLS]",
    "pad_token": "[PAD]",
    "sep_token": "[SEP]",
    "unk_token": "[UNK]",
    "mask_token": "[MASK]",
}
FAIRSEQ_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
STAND_IN = "<bert-id-{}>"  # the dict.txt name of a BERT row whose token a dict.txt line cannot name
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate", "relu": "relu"}
PREFIX = "encoder.sentence_encoder."
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
# what a conversion replaces in OUT_DIR (other files there are kept)
OUTPUTS = ("model.pt", "dict.txt", "config.json") + TOKENIZER_FILES


def read_vocab_txt(path: str) -> List[str]:
    """BERT's ``vocab.txt`` as ``transformers``' ``load_vocab`` reads it: the tokens in id order,
    lines ending only at ``\n`` / ``\r\n`` / ``\r`` (Python's text-file newlines, never
    ``str.splitlines``' U+2028 and the like), nothing stripped but the newline (a leading
    byte-order mark excepted). Bytes that are not UTF-8 raise :class:`DataError` naming the line."""
    if not os.path.isfile(path):
        raise DataError(path, 0, "vocabulary file not found")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(path, data[: e.start].count(b"\n") + 1, f"not valid UTF-8 ({e.reason})") from None
    tokens = [line[:-1] if line.endswith("\n") else line for line in io.StringIO(text.lstrip("\ufeff"), newline=None)]
    if not tokens:
        raise DataError(path, 0, "vocabulary file is empty")
    return tokens


def read_tokenizer_json(path: str) -> List[str]:
    """The tokens (in id order) of a WordPiece ``tokenizer.json``: ``model.vocab`` and the
    ``added_tokens`` whose ids it lacks; the ids must be 0 .. N-1, each once."""
    spec = read_json(path, "tokenizer file")
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict):
        raise DataError(path, 0, "no \"model\" object: not a tokenizer.json of the tokenizers library")
    kind, vocab = model.get("type"), model.get("vocab")
    if kind != "WordPiece" or not isinstance(vocab, dict):
        raise DataError(path, 0, f"model type {kind!r}: BERT's tokenizer is WordPiece with a token -> id vocabulary")
    by_id: Dict[int, str] = {}
    for tok, i in vocab.items():
        if not isinstance(i, int) or i in by_id:
            why = f"taken by {by_id[i]!r}" if i in by_id else "not an integer"
            raise DataError(path, 0, f"token {tok!r} has id {i!r}, {why}")
        by_id[i] = tok
    for added in spec.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            by_id.setdefault(added["id"], added.get("content"))
    if not by_id:
        raise DataError(path, 0, "the model vocabulary is empty")
    if sorted(by_id) != list(range(len(by_id))):
        gaps = sorted(set(range(max(by_id) + 1)) - set(by_id))
        raise DataError(path, 0, f"token ids are not 0..{len(by_id) - 1}: none for {some_names(map(str, gaps))}")
    return [by_id[i] for i in range(len(by_id))]


def special_token_names(hf_dir: str) -> Dict[str, str]:
    """BERT's special-token names as the folder's ``special_tokens_map.json`` (or
    ``tokenizer_config.json``) gives them -> fairseq's symbols."""
    names = dict(SPECIAL_KEYS)
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = os.path.join(hf_dir, name)
        if not os.path.isfile(path):
            continue
        spec = read_json(path)
        for key in SPECIAL_KEYS:
            value = spec.get(key) if isinstance(spec, dict) else None
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str) and value:
                names[key] = value
        break
    return {names[key]: SPECIALS[bert] for key, bert in SPECIAL_KEYS.items()}


def read_vocabulary(hf_dir: str) -> Tuple[List[str], str]:
    """``(tokens in BERT's id order, the file they came from)``: ``vocab.txt``, else ``tokenizer.json``."""
    vocab_txt, tokenizer_json = os.path.join(hf_dir, "vocab.txt"), os.path.join(hf_dir, "tokenizer.json")
    if os.path.isfile(vocab_txt):
        return read_vocab_txt(vocab_txt), vocab_txt
    if os.path.isfile(tokenizer_json):
        return read_tokenizer_json(tokenizer_json), tokenizer_json
    raise DataError(hf_dir, 0, "no vocab.txt and no tokenizer.json (a save_pretrained BERT folder has one of them)")


def dict_symbols(
    tokens: List[str], vocab_size: int, where: str, specials: Optional[Dict[str, str]] = None
) -> List[str]:
    """The fairseq symbol of each BERT row (``vocab_size`` of them): the special tokens' fairseq
    names, the token itself, or its stand-in ``<bert-id-N>`` (see the module docstring)."""
    specials = SPECIALS if specials is None else specials
    if len(tokens) > vocab_size:
        raise DataError(where, 0, f"{len(tokens)} tokens, more than config.json's vocab_size {vocab_size}")
    last = {tok: i for i, tok in enumerate(tokens)}  # BERT's tokenizer maps a repeated token to its last id
    missing = [t for t in specials if t not in last]
    if missing:
        raise DataError(where, 0, f"no {', '.join(missing)} (BERT's special tokens)")
    symbols = []
    for i in range(vocab_size):
        tok = tokens[i] if i < len(tokens) else None
        if tok in specials and last[tok] == i:
            symbols.append(specials[tok])
        elif (
            tok is None
            or last[tok] != i
            or tok == ""
            or any(ch.isspace() for ch in tok)
            or tok in FAIRSEQ_SYMBOLS
            or tok.startswith("madeupword")
        ):
            symbols.append(STAND_IN.format(i))
        else:
            symbols.append(tok)
    clash = sorted(sym for sym, n in collections.Counter(symbols).items() if n > 1)
    if clash:  # only a vocabulary that itself holds a token spelled <bert-id-N> can get here
        raise DataError(where, 0, f"the vocabulary itself holds the stand-in symbol(s) {some_names(clash)}")
    return symbols


def bert_dictionary(tokens: List[str], vocab_size: int, where: str = "vocabulary", specials=None):
    """``(fairseq Dictionary with <mask> appended, rows)``: ``rows[i]`` is the BERT id of fairseq id
    i; ``len(rows) == vocab_size`` (every BERT row, in BERT's order after the specials)."""
    from fairseq.data import Dictionary

    symbols = dict_symbols(tokens, vocab_size, where, specials)
    d = Dictionary()  # <s> <pad> </s> <unk> = [CLS] [PAD] [SEP] [UNK]
    for sym in symbols:
        if sym not in FAIRSEQ_SYMBOLS:
            d.add_symbol(sym, n=1)
    d.add_symbol("<mask>")  # as the K-BERT tasks do after loading dict.txt
    bert_id = {sym: i for i, sym in enumerate(symbols)}
    rows = [bert_id[d[i]] for i in range(len(d))]
    assert sorted(rows) == list(range(vocab_size)), "not a permutation of BERT's rows"
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
        raise DataError("model weights", 0, f"{len(left)} BERT tensor(s) not converted: {some_names(left)}")
    return out


def convert(hf_dir: str, out_dir: str, allow_vocab_mismatch: bool = False) -> str:
    """Write ``out_dir/model.pt`` and ``out_dir/dict.txt`` from the BERT folder ``hf_dir``; a vocabulary
    whose size is not the model's is refused unless ``allow_vocab_mismatch``."""
    from fairseq import checkpoint_utils, options
    from transformers import BertConfig, BertModel

    import fairseq_knowgen  # noqa: F401  (registers --task kbert_classification and --arch kbert_base)

    config_path = os.path.join(hf_dir, "config.json")
    hf_cfg = load_config(BertConfig, hf_dir, "BERT")
    flags = kbert_flags(hf_cfg, config_path)
    tokens, vocab_path = read_vocabulary(hf_dir)
    specials = special_token_names(hf_dir)
    n_rows = hf_cfg.vocab_size
    mismatch = (
        f"the {n_rows - len(tokens)} rows without a token keep stand-in symbols <bert-id-N>"
        if len(tokens) < n_rows
        else f"the {len(tokens) - n_rows} tokens beyond the last row are left out"
    )
    if not allow_vocab_mismatch:
        check_vocab_size(vocab_path, len(tokens), config_path, n_rows, allowed=mismatch)
    dictionary, rows = bert_dictionary(tokens[:n_rows], n_rows, vocab_path, specials)
    model = load_model(BertModel, hf_dir, missing_ok=("pooler.",))
    state = convert_state(model.state_dict(), hf_cfg.num_hidden_layers, rows, dictionary.pad())
    # the args of the package's registered task and arch (imported above): no --user-dir, which would name a path
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [os.path.abspath(out_dir), "--task", "kbert_classification", "--arch", "kbert_base", *flags],
    )
    with output_folder(out_dir, owned=OUTPUTS) as tmp:  # a temporary folder beside OUT, swapped in when complete
        with open(os.path.join(tmp, "dict.txt"), "w", encoding="utf-8") as f:
            for i in range(dictionary.nspecial, len(dictionary) - 1):  # not the specials, not <mask> (the task adds it)
                f.write(f"{dictionary[i]} 1\n")
        ckpt = {  # fairseq's checkpoint layout, no training state (--restore-file needs the --reset-* flags)
            "args": args,
            "model": state,
            "optimizer_history": [{"criterion_name": "none", "optimizer_name": "none", "lr_scheduler_state": {}}],
            "extra_state": {"train_iterator": {"epoch": 0, "iterations_in_epoch": 0}},
            "last_optimizer_state": None,
        }
        checkpoint_utils.torch_persistent_save(ckpt, os.path.join(tmp, "model.pt"))
        for name in ("config.json",) + TOKENIZER_FILES:  # the tokenizer, for prep.wordpiece; the model's config
            if os.path.isfile(os.path.join(hf_dir, name)):
                shutil.copyfile(os.path.join(hf_dir, name), os.path.join(tmp, name))
    path = os.path.join(out_dir, "model.pt")
    standins = sum(dictionary[i].startswith("<bert-id-") for i in range(len(dictionary)))
    print(
        f"{path}: {len(state)} tensors ({' '.join(flags)}); {out_dir}/dict.txt: {len(dictionary)} rows with <mask> "
        f"(vocabulary {os.path.basename(vocab_path)}, {standins} stand-in symbol(s) <bert-id-N>)"
    )
    if len(tokens) != n_rows:
        print(f"warning: {vocab_path}: {len(tokens)} tokens for {n_rows} rows: {mismatch}", file=sys.stderr)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "hf_dir", help="save_pretrained folder of BertModel / BertForPreTraining (config.json, weights, vocab.txt or "
        "tokenizer.json)"
    )
    p.add_argument("out_dir", help="writes model.pt (--kbert-pretrained) and dict.txt (the K-BERT data's dict.txt)")
    p.add_argument(
        "--allow-vocab-mismatch",
        action="store_true",
        help="convert a vocabulary whose size is not the model's vocab_size: rows without a token keep stand-in "
        "symbols <bert-id-N>, tokens beyond the last row are left out (refused without this flag)",
    )
    a = p.parse_args(argv)
    convert(a.hf_dir, a.out_dir, a.allow_vocab_mismatch)


if __name__ == "__main__":
    cli_entry(main)
