"""Grow a pretrained model's dictionary: new symbols get new rows, the checkpoint's rows stay.

fairseq has no way to add tokens to a pretrained model's dictionary when fine-tuning
(fairseq issues #2632, #3857; #1867 was answered by overwriting unused entries by hand).
HuggingFace's ``resize_token_embeddings`` is the model of what this module does for fairseq
checkpoints, in two steps:

1. **The task dictionary** (:func:`extended_symbols`, the command line below): the
   checkpoint's symbols in the checkpoint's order, then every symbol the task needs beyond
   them (``<sep>``, ``<ent-K>``, ``<unk-N>``...). The checkpoint's symbols are its
   ``dict.txt`` after fairseq's four specials, plus ``<mask>`` when the checkpoint has one row
   more than that: fairseq's ``denoising`` task (BART's pre-training) appends ``<mask>`` to
   ``dict.txt``, which does not list it (:func:`pretrained_symbols`). Appending ``<sep>`` to
   bart's ``dict.txt`` alone would put it on the row of BART's ``<mask>``;
2. **The embedding rows** (:func:`grow_rows`, at load time: :func:`upgrade_pretrained_bart`):
   when a checkpoint's embedding has fewer rows than the task dictionary, rows
   ``0 .. N-1`` are the checkpoint's, bit for bit, and each new row ``i >= N`` is the mean of
   the checkpoint's rows, ``E[i] = (1/N) sum_{j<N} E[j]`` (Hewitt's "average embedding" start;
   deterministic, so every rank grows the same rows). Tied matrices (``--share-all-embeddings``)
   grow once and stay one tensor; an untied output projection grows its own rows the same
   way. The model's parameters have the task dictionary's size from the start (built once,
   as DDP needs); only the checkpoint's tensors grow, before they are copied in.

Refused, naming what is wrong: a checkpoint with more rows than the task dictionary (beyond
fairseq's own case of BART's ``<mask>`` row, which it drops for a dictionary without
``<mask>``); a task dictionary without ``<mask>`` that puts a package symbol
(``<sep>``, ``<ent-K>``, ``<unk-N>``) on the checkpoint's last row, the row of BART's ``<mask>``;
and a pretrained tensor that fairseq's BART upgrade would drop (a classification head). The
command stops with ``error: FILE: ...`` and exit status 2 on a checkpoint or ``dict.txt`` that
cannot be read (cut short, refused by weights-only loading), and replaces an earlier OUT only with
a complete file.

The task dictionary of a released BART folder (``model.pt``, ``dict.txt``), or of a BERT folder that
``python -m fairseq_knowgen.convert.hf_bert`` wrote (``--encoder-pretrained``; ``--add-from`` adds the tokens of
text files, e.g. the target side's BPE when source and target share one dictionary)::

    python -m fairseq_knowgen.convert.extend_dictionary bart.large OUT/dict.txt --add '<sep>'

then ``fairseq-preprocess --srcdict OUT/dict.txt --tgtdict OUT/dict.txt`` and
``fairseq-train --restore-file bart.large/model.pt --reset-optimizer ...``.
"""

import argparse
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence

import torch
from fairseq.data import Dictionary
from torch import Tensor

from ..textio import DataError, atomic_write, check_writable, cli_entry

MASK = "<mask>"
# the embedding matrices of a fairseq encoder-decoder, grown together (tied ones stay tied)
EMBEDDING_KEYS = (
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "encoder.output_projection.weight",
    "decoder.output_projection.weight",
)
# symbols this package adds to a dictionary; none can be a row of a pretrained BART
PACKAGE_SYMBOL = re.compile(r"<sep>|<ent-\d+>|<unk-\d+>")


def pretrained_symbols(dict_path: str, num_rows: int) -> List[str]:
    """The symbol of each of a checkpoint's ``num_rows`` embedding rows: fairseq's specials,
    ``dict_path``'s symbols, and ``<mask>`` when there is one row more (fairseq's denoising
    task appends it)."""
    symbols = list(Dictionary.load(dict_path).symbols)
    if num_rows == len(symbols) + 1 and MASK not in symbols:
        symbols.append(MASK)
    if num_rows != len(symbols):
        raise DataError(
            dict_path,
            0,
            f"{len(symbols)} symbols (with fairseq's 4 specials) for a checkpoint embedding of {num_rows} rows: "
            "not the checkpoint's dictionary",
        )
    return symbols


def extended_symbols(pretrained: Sequence[str], needed: Iterable[str]) -> List[str]:
    """``pretrained`` in its order, then each symbol of ``needed`` it lacks (first seen first)."""
    out = list(pretrained)
    seen = set(out)
    for s in needed:
        if s not in seen:
            out.append(s)
            seen.add(s)
    return out


def write_dictionary(path: str, symbols: Sequence[str], counts: Optional[Dict[str, int]] = None) -> None:
    """A fairseq ``dict.txt`` of ``symbols`` after fairseq's four specials (which it leaves out,
    as fairseq does); ``counts`` default to 1 (fairseq-preprocess ``--srcdict`` keeps them)."""
    specials = Dictionary().symbols
    if list(symbols[: len(specials)]) != specials:
        raise ValueError(f"the symbols must start with fairseq's specials {specials}")
    counts = counts or {}
    with atomic_write(path) as f:  # an earlier file stays until the new one is complete
        for s in symbols[len(specials) :]:
            f.write(f"{s} {counts.get(s, 1)}\n")


def grow_rows(weight: Tensor, num_rows: int) -> Tensor:
    """``weight`` (``N x C``) with rows added up to ``num_rows``: the first N bit-identical, each
    new one the mean of the N (computed in float32, stored in ``weight``'s dtype)."""
    n = weight.size(0)
    if num_rows < n:
        raise ValueError(f"cannot grow {n} rows to {num_rows}")
    if num_rows == n:
        return weight
    mean = weight.float().mean(0, keepdim=True).to(weight.dtype)  # 1 x C
    return torch.cat([weight, mean.expand(num_rows - n, -1)], 0)


def check_mask_row(dictionary, num_rows: int) -> None:
    """Refuse a dictionary without ``<mask>`` whose symbol on the checkpoint's last row is one
    this package adds: in a BART checkpoint that row is ``<mask>``'s (see the module docstring)."""
    if MASK in dictionary.indices or not 0 < num_rows <= len(dictionary):
        return
    symbol = dictionary[num_rows - 1]
    if PACKAGE_SYMBOL.fullmatch(symbol):
        raise ValueError(
            f"the task dictionary puts '{symbol}' on row {num_rows - 1}, the last row of the checkpoint, which "
            f"in a BART checkpoint is '{MASK}' (fairseq's denoising task appends it to dict.txt): write the task "
            "dictionary with python -m fairseq_knowgen.convert.extend_dictionary CHECKPOINT_DIR OUT --add "
            f"'{symbol}', which keeps '{MASK}' on its row and gives '{symbol}' a new one"
        )


def grow_embeddings(state_dict: Dict[str, Tensor], dictionary, keys: Sequence[str] = EMBEDDING_KEYS) -> int:
    """Grow the embedding matrices ``keys`` of ``state_dict`` (in place) to ``len(dictionary)``
    rows (:func:`grow_rows`); tensors shared by several keys grow once. Returns the number of
    rows added (0 when the sizes already agree)."""
    present = [k for k in keys if k in state_dict]
    if not present:
        return 0
    num_rows = state_dict[present[0]].size(0)
    check_mask_row(dictionary, num_rows)
    if num_rows > len(dictionary):
        raise ValueError(
            f"the checkpoint's {present[0]} has {num_rows} rows, more than the {len(dictionary)} symbols of the task "
            "dictionary: binarize with the checkpoint's dictionary "
            "(python -m fairseq_knowgen.convert.extend_dictionary)"
        )
    grown: Dict[int, Tensor] = {}
    for k in present:
        w = state_dict[k]
        if w.size(0) != num_rows:
            raise ValueError(f"{k} has {w.size(0)} rows, {present[0]} {num_rows}: not one dictionary")
        if id(w) not in grown:
            grown[id(w)] = grow_rows(w, len(dictionary))
        state_dict[k] = grown[id(w)]
    return len(dictionary) - num_rows


def upgrade_pretrained_bart(model, state_dict: Dict[str, Tensor], name: str, parent_upgrade) -> None:
    """``upgrade_state_dict_named`` of the BART-derived models: fairseq's upgrade
    (``parent_upgrade``: renames, BART's ``<mask>`` row dropped for a dictionary without it),
    refusing any pretrained tensor it would drop, then the embeddings grown to the task
    dictionary (:func:`grow_embeddings`)."""
    before = set(state_dict)
    parent_upgrade(state_dict, name)
    prefix = f"{name}." if name else ""
    # the decoder's upgrade renames an untied embed_out to output_projection
    dropped = sorted(
        k
        for k in before - set(state_dict)
        if not (k == f"{prefix}decoder.embed_out" and f"{prefix}decoder.output_projection.weight" in state_dict)
    )
    if dropped:
        raise ValueError(
            f"the checkpoint's tensors {dropped} have no place in this model (fairseq would drop them with a "
            "warning): start from a checkpoint without them (e.g. bart.large, not a model with classification heads)"
        )
    grow_embeddings(state_dict, model.encoder.dictionary, [prefix + k for k in EMBEDDING_KEYS])


# the source embedding of a fairseq encoder-decoder (BART) and of a converted BERT (convert.hf_bert)
EMBEDDING_TABLES = ("encoder.embed_tokens.weight", "encoder.sentence_encoder.embed_tokens.weight")


def text_tokens(path: str) -> List[str]:
    """The space-separated tokens of a text file, each once, in first-seen order."""
    if not os.path.isfile(path):
        raise DataError(path, 0, "no such file")
    seen = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            for token in line.split():
                seen.setdefault(token, None)
    return list(seen)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint_dir", help="folder with the checkpoint's model.pt and dict.txt (a released bart.*)")
    p.add_argument("out", help="the task dictionary to write (fairseq dict.txt format)")
    p.add_argument("--add", nargs="+", default=[], metavar="SYMBOL", help="symbols the task needs, e.g. '<sep>'")
    p.add_argument(
        "--add-from",
        nargs="+",
        default=[],
        metavar="TEXT",
        help="also every token of these text files (split on spaces) that the checkpoint lacks, in first-seen order "
        "(e.g. the target side's BPE, for one dictionary shared by a BERT source and the target)",
    )
    p.add_argument("--checkpoint", default="model.pt", help="checkpoint file name in CHECKPOINT_DIR (model.pt)")
    a = p.parse_args(argv)
    from .downloads import read_fairseq_checkpoint, read_fairseq_dictionary
    from .fairseq_legacy import some_names

    ckpt, dict_path = os.path.join(a.checkpoint_dir, a.checkpoint), os.path.join(a.checkpoint_dir, "dict.txt")
    for path in (ckpt, dict_path):
        if not os.path.isfile(path):
            raise DataError(path, 0, "no such file")
    check_writable(a.out)
    d = read_fairseq_dictionary(dict_path)
    model = read_fairseq_checkpoint(ckpt)["model"]
    key = next((k for k in EMBEDDING_TABLES if k in model), None)
    if key is None:
        raise DataError(ckpt, 0, f"no {' or '.join(EMBEDDING_TABLES)}: not a fairseq encoder-decoder or converted BERT")
    old = pretrained_symbols(dict_path, model[key].size(0))
    new = extended_symbols(old, list(a.add) + [t for path in a.add_from for t in text_tokens(path)])
    write_dictionary(a.out, new, dict(zip(d.symbols, d.count)))
    added = some_names(new[len(old) :])
    print(f"{a.out}: {len(old)} symbols of the checkpoint (rows kept), {len(new) - len(old)} new: {added}")


if __name__ == "__main__":
    cli_entry(main)
