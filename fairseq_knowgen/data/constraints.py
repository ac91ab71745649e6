"""Lexical constraints for ``fairseq-generate``, read from a file beside the binarized data.

fairseq's lexically constrained beam search (``--constraints unordered|ordered``: Post & Vilar
2018, Hu et al. 2019; ``fairseq.search.LexicallyConstrainedBeamSearch``) forces every
constraint into every finished hypothesis. ``fairseq-interactive`` reads constraints from its
input lines; ``fairseq-generate`` takes them from the batch, ``sample["constraints"]``, which
fairseq's ``LanguagePairDataset`` collates from its ``constraints`` argument (one packed row per
example, padded with zeros and put in the batch's source-length order, as it does the sources).
This module fills that argument from a text file, for the tasks ``translation_constrained`` and
``eki_generation`` (``--constraints-from SUFFIX`` reads ``DATA/{split}.{SUFFIX}``).

File format: one line per input of the split, in the order of its source file. A line holds the
constraints of that input separated by TABs; each constraint is one or more tokens separated by
spaces, tokenized and BPE'd exactly as the target side (a constraint is a token sequence of the
target dictionary, encoded without EOS). An empty line means no constraints for that input.
``apply-bpe`` of subword-nmt splits on spaces only and would glue a TAB into a word: protect
it, e.g. ``sed 's/\\t/ <csep> /g' | subword-nmt apply-bpe --glossaries '<csep>' | sed 's/ <csep> /\\t/g'``.

Errors (:class:`~fairseq_knowgen.textio.DataError`, ``path:line: ...``): a line count other than
the split's, an empty constraint (two TABs in a row, a leading or trailing TAB), a constraint
ending in a BPE continuation piece (``...@@``: BPE ran across a TAB), a special symbol
(``<s>``, ``<pad>``, ``</s>``: id 0 ends a constraint in fairseq's packed format), and a token
outside the dictionary (``--constraints-unk error``, the default; ``drop`` leaves such a
constraint out and logs how many were dropped). On word-level data with ``<unk-N>``
placeholders (:mod:`fairseq_knowgen.prep.placeholders`) write each word outside the vocabulary
as the placeholder of that line's source; a placeholder that is not in the input's source is an
error (it names no word, and ``copy_transformer`` gives it probability 0, so no hypothesis could
hold it).
"""

import logging
import os
import re
from typing import List, Sequence

from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.token_generation_constraints import pack_constraints
from torch import Tensor

from ..textio import DataError, read_lines

logger = logging.getLogger(__name__)

SEPARATOR = "\t"
UNK_CHOICES = ("error", "drop")
PLACEHOLDER = re.compile(r"^<unk-\d+>$")  # as fairseq_knowgen.prep.placeholders writes them


def constraints_path(data_dir: str, split: str, suffix: str) -> str:
    """``DATA/{split}.{suffix}``: where ``--constraints-from SUFFIX`` looks for a split's constraints."""
    return os.path.join(data_dir, f"{split}.{suffix}")


def parse_constraints(
    lines: Sequence[str], dictionary: Dictionary, path: str = "?", unk: str = "error"
) -> List[List[Tensor]]:
    """The constraints of each line as token-id tensors (no EOS); see the module docstring for
    the format and the errors. ``path`` names the file in errors."""
    if unk not in UNK_CHOICES:
        raise ValueError(f"unk must be one of {UNK_CHOICES}, not {unk!r}")
    special = {dictionary.bos(), dictionary.pad(), dictionary.eos()}
    out, dropped = [], 0
    for n, line in enumerate(lines, start=1):
        row = []
        if line.strip():
            for k, text in enumerate(line.split(SEPARATOR), start=1):
                words = text.split()
                if not words:
                    raise DataError(path, n, f"constraint {k} is empty (constraints are separated by one TAB)")
                if words[-1].endswith("@@"):
                    raise DataError(
                        path,
                        n,
                        f"constraint {k} ends in the BPE continuation piece {words[-1]!r}: apply BPE to each "
                        "constraint, not across the TABs (see fairseq_knowgen.data.constraints)",
                    )
                ids = dictionary.encode_line(text, add_if_not_exist=False, append_eos=False).long()
                bad = [w for w, i in zip(words, ids.tolist()) if i in special]
                if bad:
                    raise DataError(path, n, f"constraint {k} holds the special symbol {bad[0]!r}")
                unknown = [w for w, i in zip(words, ids.tolist()) if i == dictionary.unk()]
                if unknown:
                    if unk == "drop":
                        dropped += 1
                        continue
                    raise DataError(
                        path,
                        n,
                        f"constraint {k} holds {unknown[0]!r}, which is not in the target dictionary (tokenize and "
                        "BPE constraints as the target; --constraints-unk drop leaves such constraints out)",
                    )
                row.append(ids)
        out.append(row)
    if dropped:
        logger.warning(f"{path}: left out {dropped} constraint(s) with a token outside the target dictionary")
    return out


def pack_example(constraints: List[Tensor]) -> Tensor:
    """One example's row of fairseq's packed format (``pack_constraints``): the number of
    constraints, then each constraint followed by 0; the collater pads rows with zeros."""
    return pack_constraints([constraints])[0]


def token_counts(packed: Tensor) -> Tensor:
    """Constraint tokens of each row of a packed batch ``B x L`` (every id but the separators and
    the padding, which are 0; row[0] is the number of constraints)."""
    return packed[:, 1:].ne(0).sum(dim=1)


def attach_constraints(
    dataset: LanguagePairDataset, path: str, dictionary: Dictionary, split: str = "?", unk: str = "error"
) -> List[List[Tensor]]:
    """Read ``path`` and give ``dataset`` (the split's ``LanguagePairDataset``, indexed by source
    line) the packed constraints of each of its examples, so that its collater puts
    ``sample["constraints"]`` in every batch, row b for the batch's example b. Returns the
    constraints of each line (lists of token-id tensors)."""
    if not isinstance(dataset, LanguagePairDataset):
        raise TypeError(f"constraints go on a LanguagePairDataset, not a {type(dataset).__name__}")
    lines = read_lines(path, "constraints")
    if len(lines) != len(dataset):
        raise DataError(
            path,
            min(len(lines), len(dataset)) + 1,
            f"line-count mismatch: {len(lines)} lines of constraints but {len(dataset)} inputs in split '{split}' "
            "(one line per input, empty for none)",
        )
    constraints = parse_constraints(lines, dictionary, path, unk)
    check_placeholders(constraints, dataset, dictionary, path)
    dataset.constraints = [pack_example(c) for c in constraints]
    n = sum(len(c) for c in constraints)
    logger.info(f"{path}: {n} constraints for {len(lines)} inputs of split '{split}'")
    return constraints


def check_placeholders(constraints: List[List[Tensor]], dataset: LanguagePairDataset, dictionary: Dictionary, path):
    """Every ``<unk-N>`` placeholder of a line's constraints is in that input's source."""
    placeholders = {i for i, w in enumerate(dictionary.symbols) if PLACEHOLDER.match(w)}
    if not placeholders:
        return
    for n, row in enumerate(constraints, start=1):
        for k, c in enumerate(row, start=1):
            wanted = [dictionary[i] for i in c.tolist() if i in placeholders]
            if not wanted:
                continue
            source = {dataset.src_dict[i] for i in dataset.src[n - 1].tolist()}
            missing = [w for w in wanted if w not in source]
            if missing:
                raise DataError(
                    path,
                    n,
                    f"constraint {k} holds the placeholder {missing[0]!r}, which is not in this input's source "
                    "(a placeholder stands for a source word: write the one the source line got)",
                )
