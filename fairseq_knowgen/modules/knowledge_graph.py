"""K-BERT's knowledge layer, part 1: the knowledge graph and the mention lookup.

K-BERT (Liu et al., 2020, "K-BERT: Enabling Language Representation with Knowledge Graph",
section 02, "知識層"): the knowledge layer finds the entities of a sentence, looks up the triples
whose subject (head entity) they are, and hangs each triple's predicate (relation) and object
(tail entity) on the entity as a branch of depth 1.

The KG file (``--kg PATH`` of the ``kbert_*`` tasks and of ``prep.kbert``; ``kgs/*.spo`` in the
K-BERT data) is UTF-8 text with one triple per line::

    subject<TAB>predicate<TAB>object
    头痛<TAB>类别<TAB>症状
    Beijing<TAB>capital<TAB>China

* exactly three TAB-separated fields, none empty; spaces around a field are removed, and a field
  may hold spaces (for the word-level tasks, whose tokens are space-separated);
* empty lines are skipped; there are no comment lines; a byte-order mark at the start is ignored;
* the subject is matched against the input's tokens: characters for the Chinese tasks
  (``kbert_classification``, ``kbert_tagging``: spaces in a field are dropped), space-separated
  words for ``kbert_translation``;
* a subject's triples are used **in file order**: the first ``--kg-max-entities`` (default 2) of
  them become branches, so put the most useful first (the original code took ``list(set(...))[:2]``,
  whose order depends on Python's hash seed); a repeated triple counts once;
* a branch is the predicate's and the object's tokens (``--kg-inject predicate-object``, the
  classification default) or the object's alone (``--kg-inject object``, the tagging default).

A line that breaks these rules (not three fields, an empty field, bytes that are not UTF-8) stops
the run with :class:`~fairseq_knowgen.textio.DataError` naming ``file:line`` (``error: file:line:
...`` and exit status 2 from ``python -m fairseq_knowgen.prep.kbert``).

How the entities are found (``--kg-matching``; the paper says only that the knowledge layer picks
the sentence's entities):

* ``pkuseg`` (the default of the character-level tasks): the authors' rule. Their code
  (autoliuweijie/K-BERT, ``brain/knowgraph.py``) cuts the sentence with pkuseg, the KG's subjects
  given as its user dictionary, and a word is a mention iff it equals a subject. pkuseg applies a
  user dictionary *before* its statistical model: left to right, at each position it walks a trie
  of the dictionary's words; where the walk reaches a word the longest such word is forced as a
  word and the scan goes on after it, else it moves one character on; the model only cuts the
  text between forced words, where no subject starts, so it never makes or breaks a mention and is
  not needed here. One quirk of pkuseg's walk is kept, because it decides the authors' trees:
  when the walk passes the end of a subject along a longer subject and then leaves the trie in
  the middle of the text, the forced word runs to where the walk stopped (``丙型肝炎病`` in
  ``丙型肝炎病史``, the subjects being ``丙型肝炎`` and ``丙型肝炎病毒感染...``); that word is no
  subject, so the mention is lost (3 of the 939 medical_ner dev sentences);
* ``longest``: the longest subject starting at each position, left to right, without overlap
  (the same walk without the quirk); the word-level ``kbert_translation`` and the dictionary
  floor use it.
"""

import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..textio import DataError, atomic_write, read_lines

Tokens = Tuple[str, ...]
INJECT_CHOICES = ("predicate-object", "object")
MATCHING_CHOICES = ("pkuseg", "longest")


def char_tokenize(text: str) -> List[str]:
    """Character-level tokens without spaces (Chinese K-BERT tasks)."""
    return [c for c in text if not c.isspace()]


def word_tokenize(text: str) -> List[str]:
    """Space-separated tokens (English, already tokenized text such as WebNLG's)."""
    return text.split()


TOKENIZERS: Dict[str, Callable[[str], List[str]]] = {"char": char_tokenize, "word": word_tokenize}


def read_triples(path: str) -> List[Tuple[str, str, str]]:
    """The triples of a KG file in file order; a line without three non-empty TAB-separated
    fields (or not UTF-8) raises :class:`DataError` naming ``path:line``."""
    triples = []
    for n, line in enumerate(read_lines(path, "knowledge graph"), start=1):
        line = line.lstrip("\ufeff") if n == 1 else line
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 3:
            raise DataError(
                path, n, f"expected subject<TAB>predicate<TAB>object, found {len(fields)} field(s): {line[:60]!r}"
            )
        empty = [name for name, f in zip(("subject", "predicate", "object"), fields) if not f]
        if empty:
            raise DataError(path, n, f"empty {' and '.join(empty)} in subject<TAB>predicate<TAB>object: {line[:60]!r}")
        triples.append(tuple(fields))
    return triples


class KnowledgeGraph:
    """Triples indexed by their tokenized subject, with a trie for longest-match lookup.

    Args:
        triples: ``(subject, predicate, object)`` strings in file order
        tokenize: splits each field into tokens (:func:`char_tokenize` or :func:`word_tokenize`)
        max_entities: at most this many triples per subject, the first ones in file order
            (``--kg-max-entities``, the paper's and original code's 2)
        min_mention: subjects shorter than this many tokens are never matched
        matching: ``pkuseg`` (the authors' rule) or ``longest`` (see the module docstring)
    """

    def __init__(
        self,
        triples: Sequence[Tuple[str, str, str]],
        tokenize: Callable[[str], List[str]] = char_tokenize,
        max_entities: int = 2,
        min_mention: int = 1,
        matching: str = "longest",
    ):
        if matching not in MATCHING_CHOICES:
            raise ValueError(f"--kg-matching must be one of {MATCHING_CHOICES}, not {matching!r}")
        self.matching = matching
        self.max_entities = max_entities
        self.table: Dict[Tokens, List[Tuple[Tokens, Tokens]]] = {}
        for s, p, o in triples:
            subj = tuple(tokenize(s))
            if len(subj) < min_mention:
                continue
            entry = self.table.setdefault(subj, [])
            branch = (tuple(tokenize(p)), tuple(tokenize(o)))
            if branch not in entry:  # a repeated triple would only repeat a branch
                entry.append(branch)
        self.trie: dict = {}
        for subj in self.table:
            node = self.trie
            for tok in subj:
                node = node.setdefault(tok, {})
            node[None] = subj  # end of a subject

    @classmethod
    def from_file(
        cls, path: str, tokenize: str = "char", max_entities: int = 2, min_mention: int = 1, matching: str = "longest"
    ):
        return cls(read_triples(path), TOKENIZERS[tokenize], max_entities, min_mention, matching)

    def __len__(self) -> int:
        return len(self.table)

    def triples_of(self, subject: Tokens, exclude=frozenset()) -> List[Tuple[Tokens, Tokens]]:
        """The first ``max_entities`` (predicate, object) pairs of ``subject`` in file order,
        leaving out the ``(subject, predicate, object)`` token tuples in ``exclude``."""
        subject = tuple(subject)
        pairs = [po for po in self.table.get(subject, []) if (subject,) + po not in exclude]
        return pairs[: self.max_entities]

    def mentions(self, tokens: Sequence[str]) -> List[Tuple[int, int]]:
        """Non-overlapping ``(start, end)`` spans (end exclusive) of KG subjects in ``tokens``:
        left to right, the longest subject starting at each position; a position without one
        is skipped. With ``matching="pkuseg"`` a walk that leaves the trie past a subject's end
        in the middle of ``tokens`` forces the longer, subject-less word (pkuseg's user
        dictionary, see the module docstring): no mention there, and the scan goes on after it."""
        spans, i, n = [], 0, len(tokens)
        while i < n:
            node, end, stop = self.trie, None, n
            for j in range(i, n):
                node = node.get(tokens[j])
                if node is None:
                    stop = j
                    break
                if None in node:
                    end = j + 1
            if end is None:
                i += 1
            elif self.matching == "pkuseg" and stop < n and stop > end:
                i = stop  # pkuseg forces tokens[i:stop], which is no subject
            else:
                spans.append((i, end))
                i = end
        return spans


def branch_tokens(predicate: Tokens, obj: Tokens, inject: str) -> List[str]:
    """The tokens a triple hangs on its mention: predicate + object (the paper's choice for
    classification) or the object alone (its choice for NER)."""
    if inject not in INJECT_CHOICES:
        raise ValueError(f"--kg-inject must be one of {INJECT_CHOICES}, not {inject!r}")
    return list(predicate) + list(obj) if inject == "predicate-object" else list(obj)


def control_triples(triples: Sequence[Tuple[str, str, str]], seed: int = 1) -> List[Tuple[str, str, str]]:
    """A control KG: the same subjects and predicates, the objects shuffled among all triples
    with a fixed seed (same sizes and token budget as the real KG, knowledge destroyed)."""
    objects = [o for _, _, o in triples]
    random.Random(seed).shuffle(objects)
    return [(s, p, o) for (s, p, _), o in zip(triples, objects)]


def write_triples(path: str, triples: Sequence[Tuple[str, str, str]]):
    with atomic_write(path) as f:
        for t in triples:
            f.write("\t".join(t) + "\n")


def load_kg(
    path: Optional[str], tokenize: str = "char", max_entities: int = 2, min_mention: int = 1, matching: str = "longest"
):
    """``KnowledgeGraph`` of ``path``, or ``None`` when no path is given (no knowledge injected)."""
    if not path:
        return None
    return KnowledgeGraph.from_file(path, tokenize, max_entities, min_mention, matching)
