"""Source text as a BERT reads it: its own WordPiece, through HuggingFace's ``tokenizers`` library.

For ``--encoder-pretrained`` (:mod:`fairseq_knowgen.models.pretrained_encoder`) the source is tokenized with the
BERT's tokenizer: ``tokenizer.json`` when the folder has one (its normalizer lower-cases and strips accents as the
model was trained), else ``vocab.txt`` read by ``tokenizers``' ``BertWordPieceTokenizer``, lower-cased when
``tokenizer_config.json`` says ``do_lower_case`` (BERT's default: yes). The folder is a HuggingFace BERT folder or
the one ``python -m fairseq_knowgen.convert.hf_bert`` writes (it copies the tokenizer files)::

    python -m fairseq_knowgen.prep.wordpiece BERT_DIR IN OUT [IN OUT ...] [--no-cls]

Each output line is the WordPiece tokens of the input line, separated by spaces, as fairseq's dictionary of the
converted BERT names them: BERT's ``[UNK]`` is ``<unk>``, the other special tokens are fairseq's too
(:data:`fairseq_knowgen.convert.hf_bert.SPECIALS`). A line starts with ``<s>`` (BERT's ``[CLS]``; fairseq appends
``</s>``, BERT's ``[SEP]``), unless ``--no-cls`` (EKI's dataset puts ``<s>`` first itself). The package's symbols
(``<sep>``, ``<ent-K>``, ``<unk-N>``) are kept whole: the text between them is tokenized apart. The target side
keeps the recipe's BPE.
"""

import argparse
import json
import os
import re
from typing import Callable, Dict, List

from ..convert.extend_dictionary import PACKAGE_SYMBOL
from ..convert.hf_bert import special_token_names
from ..textio import DataError, cli_entry
from .common import write_lines

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
SYMBOLS = re.compile(f"({PACKAGE_SYMBOL.pattern})")


def lower_case(bert_dir: str) -> bool:
    """``do_lower_case`` of ``tokenizer_config.json`` (BERT's default when absent: True)."""
    path = os.path.join(bert_dir, "tokenizer_config.json")
    if not os.path.isfile(path):
        return True
    with open(path, encoding="utf-8") as f:
        return bool(json.load(f).get("do_lower_case", True))


def load_tokenizer(bert_dir: str):
    """The ``tokenizers.Tokenizer`` of a BERT folder (``tokenizer.json``, else ``vocab.txt``)."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    tokenizer_json, vocab_txt = os.path.join(bert_dir, "tokenizer.json"), os.path.join(bert_dir, "vocab.txt")
    if os.path.isfile(tokenizer_json):
        tokenizer = Tokenizer.from_file(tokenizer_json)
        # a sentence-transformers tokenizer.json pads and truncates to its own length: one line, as it is
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return tokenizer
    if os.path.isfile(vocab_txt):
        return BertWordPieceTokenizer(vocab_txt, lowercase=lower_case(bert_dir))
    raise DataError(bert_dir, 0, "no tokenizer.json and no vocab.txt (a BERT folder, or one convert.hf_bert wrote)")


def wordpiece(bert_dir: str) -> Callable[[str], List[str]]:
    """A function: text -> the WordPiece tokens, in fairseq's names, package symbols kept whole."""
    tokenizer = load_tokenizer(bert_dir)
    specials: Dict[str, str] = special_token_names(bert_dir)

    def tokenize(text: str) -> List[str]:
        out = []
        for i, part in enumerate(SYMBOLS.split(text)):
            if i % 2:  # a package symbol (the odd parts of a split on a capturing group)
                out.append(part)
            elif part.strip():
                tokens = tokenizer.encode(part, add_special_tokens=False).tokens
                out.extend(specials.get(t, t) for t in tokens)
        return out

    return tokenize


def encode_file(tokenize, src: str, dst: str, cls: bool = True):
    with open(src, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    write_lines(dst, (" ".join((["<s>"] if cls else []) + tokenize(line)) for line in lines))
    return len(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bert_dir", help="a BERT folder (tokenizer.json or vocab.txt), or one convert.hf_bert wrote")
    p.add_argument("files", nargs="+", metavar="IN OUT", help="pairs of input and output text files")
    p.add_argument("--no-cls", action="store_true", help="no <s> ([CLS]) first (EKI's dataset adds it)")
    a = p.parse_args(argv)
    if len(a.files) % 2:
        p.error("give the files as pairs: IN OUT [IN OUT ...]")
    tokenize = wordpiece(a.bert_dir)
    for src, dst in zip(a.files[::2], a.files[1::2]):
        if not os.path.isfile(src):
            raise DataError(src, 0, "no such file")
        n = encode_file(tokenize, src, dst, cls=not a.no_cls)
        print(f"{dst}: {n} lines, WordPiece of {a.bert_dir}")


if __name__ == "__main__":
    cli_entry(main)
