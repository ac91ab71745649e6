"""K-BERT examples: raw TSV rows -> sentence trees -> padded batches.

Each example keeps per token only its id, soft position, branch id and mention id (small ints);
the collater pads them and the encoder builds the boolean B x T x T visible matrix per batch
(:func:`fairseq_knowgen.modules.sentence_tree.visible_matrix`), so no matrix is ever stored.
Injected (branch) tokens, ``<s>`` and ``</s>`` get the tag target ``IGNORE`` (-100): they are
never labelled and never count in the loss or the score. With ``injected_target`` (the
``kbert_tagging`` task's ``--kg-injected-label ent``) injected tokens get that target instead, the
authors' ``[ENT]`` label, and count in the loss (never in the score).

A single sentence is framed by ``framing`` (the tasks' ``--kbert-framing``): ``bos-eos`` reads
``<s> tree </s>``; ``authors`` reads it as the authors' code feeds BERT, ``<s> tree`` for
classification (their ``[CLS]`` + text, ``run_kbert_cls.py``) and the tree alone for tagging (no
``[CLS]``, no ``[SEP]``, ``run_kbert_ner.py``). Sentence pairs are framed alike by both.

Sentence pairs (a ``text_b`` column, K-BERT's XNLI / LCQMC format ``label<TAB>text_a<TAB>text_b``)
become ``<s> a </s> b </s>`` (BERT's ``[CLS] a [SEP] b [SEP]``): each sentence with its own
branches (:func:`~fairseq_knowgen.modules.sentence_tree.build_pair_trees`), the soft positions
running on through the first ``</s>``, branch and mention ids numbered apart so that a branch is
seen only by its own mention, and segment ids 0 up to and including the first ``</s>``, 1 after
(stored as that one boundary per example).
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq.data import FairseqDataset, LanguagePairDataset, ListDataset, data_utils

from ..modules.knowledge_graph import KnowledgeGraph, char_tokenize
from ..modules.sentence_tree import SentenceTree, build_pair_trees, build_sentence_tree
from ..textio import DataError, read_lines

IGNORE = -100
ENT = "[ENT]"  # the authors' tag of injected tokens (kbert_tagging's --kg-injected-label ent)
FRAMINGS = ("bos-eos", "authors")


def framing_tokens(framing: str, tagging: bool) -> Tuple[bool, bool]:
    """(``<s>`` first, ``</s>`` last) around a single sentence's tree (see the module docstring)."""
    if framing not in FRAMINGS:
        raise ValueError(f"--kbert-framing must be one of {', '.join(FRAMINGS)}, got {framing!r}")
    if framing == "bos-eos":
        return True, True
    return not tagging, False  # the authors' [CLS] + text (classification), text alone (tagging)


@dataclass
class TsvExample:
    tokens: List[str]
    label: object  # str (classification) or list of str (tagging)
    line: int
    tokens_b: Optional[List[str]] = None  # the second sentence of a pair (text_b)


def read_tsv(path: str, tagging: bool) -> List[TsvExample]:
    """Rows of a K-BERT TSV: a header naming the columns ``label`` and ``text_a`` (any order), and
    ``text_b`` for sentence pairs (classification only).

    Classification text is unsegmented (one token per non-space character); tagging text and
    labels are space-separated, one tag per character. Wrong column counts, empty texts or labels
    and token/tag length mismatches raise :class:`DataError` naming ``path:line``."""
    lines = read_lines(path, "TSV")
    header = lines[0].split("\t")
    if "label" not in header or "text_a" not in header:
        raise DataError(path, 1, f"header must name the columns 'label' and 'text_a', found {header}")
    if tagging and "text_b" in header:
        raise DataError(path, 1, "tagging reads single sentences: no text_b column")
    li, ti = header.index("label"), header.index("text_a")
    bi = header.index("text_b") if "text_b" in header else None
    out = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(path, n, f"{len(fields)} TAB-separated column(s), the header has {len(header)}")
        text, label = fields[ti], fields[li].strip()
        for column, value in (("text_a", text), ("text_b", fields[bi] if bi is not None else "-")):
            if not value.strip():
                raise DataError(path, n, f"empty {column}")
        if tagging:
            tokens, tags = text.split(), label.split()
            if len(tokens) != len(tags):
                raise DataError(path, n, f"{len(tokens)} tokens but {len(tags)} tags")
            out.append(TsvExample(tokens, tags, n))
        else:
            if not label:
                raise DataError(path, n, "empty label")
            out.append(TsvExample(char_tokenize(text), label, n, char_tokenize(fields[bi]) if bi is not None else None))
    if not out:
        raise DataError(path, 0, "no examples after the header")
    return out


class KBertDataset(FairseqDataset):
    """Sentence trees of TSV examples with their targets.

    Args:
        examples: :class:`TsvExample` s
        dictionary: token dictionary (``<s>`` tree ``</s>``)
        label_index: label -> class id (tags for tagging)
        kg: the knowledge graph, or ``None`` (no injection)
        inject: ``predicate-object`` or ``object``
        max_positions: the longest input (``<s>`` and ``</s>`` included); longer trees lose
            branches first (see ``build_sentence_tree``)
        tagging: per-token targets (else one label per example)
        path: the TSV, named in errors
        injected_target: tagging: the target of injected (branch) tokens; ``None``: ``IGNORE``
        framing: ``bos-eos`` or ``authors``: the tokens around a single sentence (module docstring)
    """

    def __init__(
        self,
        examples: Sequence[TsvExample],
        dictionary,
        label_index: dict,
        kg: Optional[KnowledgeGraph],
        inject: str,
        max_positions: int,
        tagging: bool,
        path: str = "",
        injected_target: Optional[int] = None,
        framing: str = "bos-eos",
    ):
        self.dictionary, self.tagging = dictionary, tagging
        bos, eos = framing_tokens(framing, tagging)
        self.items: List[Tuple[np.ndarray, ...]] = []
        self.targets = []
        self.trunk_index: List[np.ndarray] = []
        self.n_tokens: List[int] = []  # original token count (predictions map back to it)
        self.segment_start: List[int] = []  # first token of segment 1 (b); the length for a single sentence
        self.dropped_branches = self.dropped_trunk = self.injected_tokens = 0
        for ex in examples:
            if ex.tokens_b is None:
                trees = [build_sentence_tree(ex.tokens, kg, inject, max_len=max_positions - bos - eos)]
            else:
                trees = list(build_pair_trees(ex.tokens, ex.tokens_b, kg, inject, max_len=max_positions - 3))
            ids, soft, branch, mention, trunk, segment_start = flatten_trees(trees, dictionary, bos, eos)
            self.items.append((ids, soft, branch, mention))
            self.trunk_index.append(trunk)
            self.segment_start.append(segment_start)
            self.n_tokens.append(len(ex.tokens))
            for tree in trees:
                self.dropped_branches += tree.dropped_branches
                self.dropped_trunk += tree.dropped_trunk
                self.injected_tokens += len(tree) - len(tree.trunk_index)
            if tagging:
                tags = [label_index.get(t) for t in ex.label[: len(trunk)]]
                if any(t is None for t in tags):
                    bad = next(t for t, i in zip(ex.label, tags) if i is None)
                    raise DataError(path, ex.line, f"tag {bad!r} not among the training tags")
                target = np.full(len(ids), IGNORE, dtype=np.int64)
                if injected_target is not None:
                    target[branch > 0] = injected_target  # the authors' [ENT] on every injected token
                target[trunk] = tags
                self.targets.append(target)
            else:
                if ex.label not in label_index:
                    raise DataError(path, ex.line, f"label {ex.label!r} not among the training labels")
                self.targets.append(label_index[ex.label])
        self.sizes = np.array([len(x[0]) for x in self.items], dtype=np.int64)

    def __getitem__(self, index):
        ids, soft, branch, mention = self.items[index]
        segment = torch.zeros(len(ids), dtype=torch.long)
        segment[self.segment_start[index] :] = 1
        return {
            "id": index,
            "source": torch.from_numpy(ids),
            "soft": torch.from_numpy(soft.astype(np.int64)),
            "branch": torch.from_numpy(branch.astype(np.int64)),
            "mention": torch.from_numpy(mention.astype(np.int64)),
            "segment": segment,
            "target": self.targets[index],
        }

    def __len__(self):
        return len(self.items)

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.argsort(self.sizes, kind="mergesort")

    def collater(self, samples):
        if not samples:
            return {}
        pad = self.dictionary.pad()

        def merge(key, value):
            return data_utils.collate_tokens([s[key] for s in samples], value, left_pad=False)

        src = merge("source", pad)
        if self.tagging:
            target = data_utils.collate_tokens([torch.from_numpy(s["target"]) for s in samples], IGNORE)
        else:
            target = torch.tensor([s["target"] for s in samples], dtype=torch.long)
        return {
            "id": torch.tensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": int(src.ne(pad).sum()),
            "net_input": {
                "src_tokens": src,
                "soft_positions": merge("soft", 0),
                "branch_ids": merge("branch", 0),
                "mention_ids": merge("mention", 0),
                "segment_ids": merge("segment", 0),
                "src_lengths": torch.tensor([s["source"].numel() for s in samples]),
            },
            "target": target,
        }


def flatten_trees(trees: Sequence[SentenceTree], dictionary, bos: bool = True, eos: bool = True):
    """``<s> tree_1 </s> [tree_2 </s>]`` as arrays: ids, soft positions, branch ids, mention ids
    (int16), the indices of the first tree's trunk tokens, and the first index of segment 1.
    ``bos``/``eos`` False: a single tree without ``<s>`` / ``</s>`` (a pair keeps both).

    ``<s>`` has soft position 0 (without it the first tree starts at 0); each tree's positions
    continue from the ``</s>`` before it, and each ``</s>`` takes the position after its tree's
    last trunk token; branch and mention ids of a later tree are numbered after the earlier ones'
    (so its branches are invisible to the earlier tree's mentions)."""
    eos = eos or len(trees) > 1
    ids, soft, branch, mention = ([dictionary.bos()], [0], [0], [0]) if bos else ([], [], [], [])
    trunk, segment_start, position = None, None, int(bos)
    for tree in trees:
        b0, m0 = max(branch, default=0), max(mention, default=0)
        if trunk is None:
            trunk = np.array(tree.trunk_index, dtype=np.int64) + len(ids)
        end = [0] if eos else []
        ids += [dictionary.index(t) for t in tree.tokens] + ([dictionary.eos()] if eos else [])
        soft += [position + p for p in tree.soft_positions] + ([position + len(tree.trunk_index)] if eos else [])
        branch += [b + b0 if b else 0 for b in tree.branch_ids] + end
        mention += [m + m0 if m else 0 for m in tree.mention_ids] + end
        position += len(tree.trunk_index) + 1
        segment_start = len(ids) if segment_start is None else segment_start
    small = (np.array(x, dtype=np.int16) for x in (soft, branch, mention))
    return (np.array(ids, dtype=np.int64), *small, trunk, segment_start if len(trees) > 1 else len(ids))


class KBertPairDataset(LanguagePairDataset):
    """fairseq's ``LanguagePairDataset`` whose sources are K-BERT sentence trees (for
    ``kbert_transformer``): ``net_input`` also carries ``soft_positions``, ``branch_ids`` and
    ``mention_ids``, padded on the same side as ``src_tokens``.

    Args:
        pair: the binarized ``LanguagePairDataset`` (sources end with ``</s>``)
        kg: the knowledge graph (word level), or ``None``
        inject: ``predicate-object`` or ``object``
        max_positions: the longest source tree (``</s>`` included)
        skip_source_facts: do not inject a triple the source states itself (linearized
            ``<S> s <P> p <O> o`` sources)
        once: inject an entity's facts at its first mention only
    """

    def __init__(
        self,
        pair: LanguagePairDataset,
        kg: Optional[KnowledgeGraph],
        inject: str,
        max_positions: int,
        skip_source_facts: bool = True,
        once: bool = True,
    ):
        d = pair.src_dict
        sources, self.extra = [], []
        self.dropped_branches = self.dropped_trunk = self.injected_tokens = 0
        for i in range(len(pair.src)):
            ids = pair.src[i].tolist()
            eos = ids[-1] == d.eos()
            words = [d[t] for t in (ids[:-1] if eos else ids)]
            exclude = source_facts(words) if skip_source_facts else frozenset()
            tree = build_sentence_tree(words, kg, inject, max_len=max_positions - 1, exclude=exclude, once=once)
            sources.append(
                torch.tensor([d.index(t) for t in tree.tokens] + ([d.eos()] if eos else []), dtype=torch.long)
            )
            soft = tree.soft_positions + ([len(tree.trunk_index)] if eos else [])
            pad0 = [0] if eos else []
            self.extra.append(
                (
                    np.array(soft, dtype=np.int16),
                    np.array(tree.branch_ids + pad0, np.int16),
                    np.array(tree.mention_ids + pad0, np.int16),
                )
            )
            self.dropped_branches += tree.dropped_branches
            self.dropped_trunk += tree.dropped_trunk
            self.injected_tokens += len(tree) - len(tree.trunk_index)
        sizes = np.array([len(s) for s in sources])
        super().__init__(
            ListDataset(sources, sizes),
            sizes,
            d,
            pair.tgt,
            pair.tgt_sizes,
            pair.tgt_dict,
            left_pad_source=pair.left_pad_source,
            left_pad_target=pair.left_pad_target,
            shuffle=pair.shuffle,
            input_feeding=pair.input_feeding,
            remove_eos_from_source=False,
            append_eos_to_target=False,
            constraints=pair.constraints,  # --constraints-from: the trees keep their inputs' constraints
            eos=pair.eos,
        )

    def collater(self, samples, pad_to_length=None):
        batch = super().collater(samples, pad_to_length)
        if not batch:
            return batch
        ids = batch["id"].tolist()
        for k, key in enumerate(("soft_positions", "branch_ids", "mention_ids")):
            values = [torch.from_numpy(self.extra[i][k].astype(np.int64)) for i in ids]
            batch["net_input"][key] = data_utils.collate_tokens(values, 0, left_pad=self.left_pad_source)
        return batch


def source_facts(words: Sequence[str]) -> frozenset:
    """The ``(subject, predicate, object)`` token tuples of a linearized source
    ``<S> s ... <P> p ... <O> o ...`` (empty for other sources)."""
    facts, part, fields = set(), None, {}
    for w in list(words) + ["<S>"]:
        if w in ("<S>", "<P>", "<O>"):
            if w == "<S>" and len(fields) == 3:
                facts.add((tuple(fields["<S>"]), tuple(fields["<P>"]), tuple(fields["<O>"])))
            if w == "<S>":
                fields = {}
            part = w
            fields[part] = []
        elif part is not None:
            fields[part].append(w)
    return frozenset(facts)
