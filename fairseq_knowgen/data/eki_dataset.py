"""Source-side annotations of EKI's retrieve-and-edit input, computed from token ids.

The source is ``concept tokens <sep> prototype tokens </s>`` as the model sees it (after
BPE). For every source token :class:`SourceAnnotator` computes, from the token ids alone
(so that training, ``fairseq-generate`` and ``fairseq-interactive`` share one definition;
never in the model):

- ``group``: 1 concept part (including ``<sep>``), 2 prototype part (including ``</s>``),
  0 padding (Eq. 3);
- ``distance``: the position indicator D (Eq. 7-8) over *subword* positions of the
  prototype. A prototype word matches a concept when their lemmas (``simplemma``) are
  equal; the word is rebuilt from its BPE pieces by :class:`PieceWords` (subword-nmt's
  ``@@`` marks, or GPT-2's leading spaces: `` dog`` and ``dog`` are one word), and **every
  piece of a matching word is a center**. Concept tokens (and ``<sep>``) get 0; ``</s>`` is
  one past the last prototype piece. Distances are **not clipped** here: a prototype without
  any concept gets :data:`NO_CENTER`, larger than any model's bound. The model clamps them at
  its own ``--eki-max-distance`` (``PositionIndicatorAttention``), which its checkpoint
  saves, so that the one value a model was trained with is the value it decodes with;
- ``label``: the target of L_E (Eq. 6), ``I{s_v in T}`` on words: 1 if the word the token
  belongs to (rebuilt from the BPE as above, lower-cased) occurs among the target's words,
  0 otherwise, for concept and prototype tokens alike (the paper's definition: ``run`` is
  not in ``the dog runs``; the criterion's ``--eki-concept-label always`` turns concept
  tokens to 1). ``<sep>``, ``</s>``, ``<s>`` and padding get -1 and are left out of L_E and
  its accuracy: their labels are trivial (``</s>`` ends every target, ``<sep>`` is in none).

``<sep>`` must be one symbol of the dictionary, exactly once in each source: a source without
it, or with it split into BPE pieces, is refused with the data's path and line.
"""

import json
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.data import BaseWrapperDataset, data_utils
from torch import Tensor

from ..text import lemma
from ..modules.group_embedding import CONCEPT_GROUP, PAD_GROUP, PROTOTYPE_GROUP
from ..modules.position_indicator import prototype_distances
from ..textio import DataError

SEPARATOR = "<sep>"
# distance of every token of a prototype without a concept (and the bound handed to
# prototype_distances): above any --eki-max-distance, so each model clamps it to its own bound
NO_CENTER = 1 << 30
IGNORED_LABEL = -1.0


def encode_source(line: str, encode_fn) -> str:
    """``encode_fn`` (fairseq-interactive's tokenizer + BPE) on each side of ``<sep>``, which
    stays one token."""
    parts: List[List[str]] = [[]]
    for word in line.split():
        if word == SEPARATOR:
            parts.append([])
        else:
            parts[-1].append(word)
    return f" {SEPARATOR} ".join(encode_fn(" ".join(part)) for part in parts)


class SeparatorKeepingBPE:
    """A fairseq BPE (``--bpe``) whose ``decode`` keeps ``<sep>`` whole, each side decoded apart:
    the inverse of :func:`encode_source`. GPT-2's decoder reads only GPT-2 ids, and
    ``fairseq-generate`` decodes the source line too. Everything else is the wrapped BPE's."""

    def __init__(self, bpe):
        self.bpe = bpe

    def decode(self, x: str) -> str:
        parts: List[List[str]] = [[]]
        for tok in x.split():
            if tok == SEPARATOR:
                parts.append([])
            else:
                parts[-1].append(tok)
        return f" {SEPARATOR} ".join(self.bpe.decode(" ".join(p)).strip() for p in parts)

    def __getattr__(self, name):
        return getattr(self.bpe, name)

class PieceWords:
    """The words of a row of dictionary symbols (BPE pieces), for either BPE of the package:

    - subword-nmt: a piece ending in ``@@`` continues into the next (``dog@@ s`` is ``dogs``);
    - GPT-2's byte-level BPE (fairseq's ``--bpe gpt2``, BART's dictionaries): the symbols are
      GPT-2 ids, decoded with ``encoder.json`` to their bytes; a piece starting with a space
      starts a word (`` dog`` and ``dog`` are one word ``dog``, the first without a space as
      the first piece of a part encodes it), any other continues the previous word.

    A piece that is no BPE piece (``<sep>``, ``</s>``, ``<unk>``, ``<mask>``...) is a word of
    its own. The first piece of a row starts a word. Words are stripped of the space.

    Args:
        dictionary: the fairseq dictionary of the ids.
        gpt2_encoder_json: GPT-2's ``encoder.json``: the dictionary's symbols are GPT-2 ids.
            Without it a dictionary whose symbols are mostly integers is refused (matching
            GPT-2 ids as words would silently match nothing).
        path: names the data in errors.
    """

    def __init__(self, dictionary, gpt2_encoder_json: Optional[str] = None, path: str = "?"):
        self.dict = dictionary
        self.gpt2: Optional[Dict[int, bytes]] = None
        if gpt2_encoder_json:
            from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

            byte_of = {c: b for b, c in bytes_to_unicode().items()}
            with open(gpt2_encoder_json, encoding="utf-8") as f:
                self.gpt2 = {i: bytes(byte_of[c] for c in tok) for tok, i in json.load(f).items()}
        elif looks_like_gpt2_ids(dictionary):
            raise ValueError(
                f"{path}: the dictionary's symbols are GPT-2 BPE ids (a BART dictionary): give GPT-2's encoder.json "
                "(--eki-gpt2-encoder-json) so that concepts and labels are matched on words"
            )
        self._pieces: Dict[int, Tuple[bytes, bool, bool, bool]] = {}

    def piece(self, idx: int) -> Tuple[bytes, bool, bool, bool]:
        """(text, glued to the previous piece, glued to the next, special) of symbol ``idx``."""
        if idx not in self._pieces:
            sym = self.dict[idx]
            if idx < self.dict.nspecial:
                out = (sym.encode(), False, False, True)
            elif self.gpt2 is not None:
                text = self.gpt2.get(int(sym)) if sym.isdigit() else None
                if text is None:  # not a GPT-2 id: a word of its own
                    out = (sym.encode(), False, False, True)
                else:
                    out = (text, not text[:1].isspace(), False, False)
            elif sym.endswith("@@"):
                out = (sym[:-2].encode(), False, True, False)
            else:
                out = (sym.encode(), False, False, sym.startswith("<") and sym.endswith(">"))
            self._pieces[idx] = out
        return self._pieces[idx]

    def words(self, ids: List[int]) -> Tuple[List[int], List[str]]:
        """Word index of each id, and the words (lower-cased, stripped)."""
        index: List[int] = []
        parts: List[bytes] = []
        prev = None
        for k, i in enumerate(ids):
            text, glue_prev, glue_next, special = self.piece(i)
            joined = k > 0 and not special and not prev[3] and (prev[2] or glue_prev)
            if joined:
                parts[-1] += text
            else:
                parts.append(text)
            index.append(len(parts) - 1)
            prev = (text, glue_prev, glue_next, special)
        return index, [p.decode("utf-8", errors="replace").strip().lower() for p in parts]


def looks_like_gpt2_ids(dictionary) -> bool:
    """Whether most of the dictionary's symbols (past the specials) are integers, as in
    BART's GPT-2 dictionaries."""
    symbols = dictionary.symbols[dictionary.nspecial :]
    return len(symbols) > 0 and sum(s.isdigit() for s in symbols) > 0.9 * len(symbols)


class SourceAnnotator:
    """Group ids, distances and L_E labels of ``concepts <sep> prototype`` sources (see the
    module docstring); ``path`` names the data in errors, ``gpt2_encoder_json`` makes the
    dictionary's symbols GPT-2 ids (:class:`PieceWords`)."""

    def __init__(self, src_dict, path: str = "?", gpt2_encoder_json: Optional[str] = None):
        self.dict = src_dict
        self.path = path
        self.sep = src_dict.index(SEPARATOR)
        if self.sep == src_dict.unk():
            raise ValueError(
                f"{path}: the source dictionary has no '{SEPARATOR}' symbol; "
                f"make sources as 'concepts {SEPARATOR} prototype' (and keep it out of BPE)"
            )
        self.pieces = PieceWords(src_dict, gpt2_encoder_json, path)
        self.unlabelled = {self.sep, src_dict.eos(), src_dict.bos(), src_dict.pad()}

    @lru_cache(maxsize=100_000)
    def _lemma(self, word: str) -> str:
        return lemma(word)

    def separator_position(self, ids: List[int], line: int = 0) -> int:
        """The index of the one ``<sep>`` of a source; a source without it, with it split by the
        BPE, or with two is refused (:class:`~fairseq_knowgen.textio.DataError` at ``line``)."""
        n = ids.count(self.sep)
        if n == 1:
            return ids.index(self.sep)
        if n > 1:
            raise DataError(
                self.path, line, f"{n} '{SEPARATOR}' in the source: expected 'concepts {SEPARATOR} prototype'"
            )
        if SEPARATOR in self.pieces.words(ids)[1]:
            raise DataError(
                self.path,
                line,
                f"'{SEPARATOR}' is split into BPE pieces: encode the concepts and the prototype apart and put "
                f"'{SEPARATOR}' between them (subword-nmt: apply-bpe --glossaries '{SEPARATOR}')",
            )
        raise DataError(self.path, line, f"no '{SEPARATOR}' in the source: expected 'concepts {SEPARATOR} prototype'")

    def annotate(self, source: Tensor, target: Optional[Tensor] = None, line: int = 0) -> Dict[str, Tensor]:
        """``group``, ``distance`` and ``label`` (1-D, like ``source``, without padding); ``line``
        (1-based) names the row in errors."""
        ids = source.tolist()
        n = len(ids)
        sep = self.separator_position(ids, line)
        end = n - 1 if ids[-1] == self.dict.eos() else n
        proto = list(range(sep + 1, end))  # prototype pieces
        group = [CONCEPT_GROUP] * (sep + 1) + [PROTOTYPE_GROUP] * (n - sep - 1)
        concept_idx, concept_words = self.pieces.words(ids[:sep])
        proto_idx, proto_words = self.pieces.words(ids[sep + 1 : end])
        distance = [0] * n
        if proto:
            concept_lemmas = {self._lemma(w) for w in concept_words}
            word_is_concept = [self._lemma(w) in concept_lemmas for w in proto_words]
            is_center = [word_is_concept[w] for w in proto_idx]
            for v, d in zip(proto, prototype_distances(is_center, NO_CENTER)):
                distance[v] = d
            if end < n:  # </s>: one past the last prototype piece
                distance[-1] = min(distance[proto[-1]] + 1, NO_CENTER)
        # I{s_v in T} on words: a piece is labelled by whether its word occurs in the target
        in_target = set(self.pieces.words(target.tolist())[1]) if target is not None else set()
        word_of = [concept_words[w] for w in concept_idx] + [SEPARATOR] + [proto_words[w] for w in proto_idx]
        word_of += [""] * (n - len(word_of))
        label = [
            IGNORED_LABEL if i in self.unlabelled else float(word_of[v] in in_target) for v, i in enumerate(ids)
        ]
        return {"group": torch.tensor(group), "distance": torch.tensor(distance), "label": torch.tensor(label)}

    def annotate_batch(self, src_tokens: Tensor) -> Tuple[Tensor, Tensor]:
        """``src_group`` and ``src_distance`` of a padded batch ``B x S`` (padding on either
        side), as the collater of :class:`EKIDataset` makes them: for batches that carry only
        ``src_tokens`` (``fairseq-interactive``)."""
        real = src_tokens.ne(self.dict.pad())
        group = torch.full_like(src_tokens, PAD_GROUP)
        distance = torch.zeros_like(src_tokens)
        for b in range(src_tokens.size(0)):
            a = self.annotate(src_tokens[b][real[b]].cpu(), line=b + 1)
            group[b][real[b]] = a["group"].to(group.device)
            distance[b][real[b]] = a["distance"].to(distance.device)
        return group, distance


class EKIDataset(BaseWrapperDataset):
    """Wraps a ``LanguagePairDataset`` whose sources hold ``concepts <sep> prototype``; adds
    ``src_group`` and ``src_distance`` to ``net_input`` and ``src_label`` to the batch. The
    wrapped dataset's lexical constraints (:mod:`fairseq_knowgen.data.constraints`) reach the
    batch through its own collater, sorted with the sources."""

    def __init__(self, dataset, src_dict, path: str = "?", gpt2_encoder_json: Optional[str] = None):
        super().__init__(dataset)
        self.annotator = SourceAnnotator(src_dict, path, gpt2_encoder_json)
        self.left_pad_source = getattr(dataset, "left_pad_source", True)

    def annotate(self, source: Tensor, target: Optional[Tensor] = None, line: int = 0) -> Dict[str, Tensor]:
        return self.annotator.annotate(source, target, line)

    def check_sources(self) -> None:
        """Every source has exactly one ``<sep>``; else the first row without is refused
        (:class:`~fairseq_knowgen.textio.DataError` naming its line), before any training."""
        sep = self.annotator.sep
        src = self.dataset.src
        for i in range(len(src)):
            row = src[i]
            if int(row.eq(sep).sum()) != 1:
                self.annotator.separator_position(row.tolist(), line=i + 1)

    def __getitem__(self, index):
        item = self.dataset[index]
        # index i is line i + 1 of the binarized split
        item.update(self.annotate(item["source"], item.get("target"), line=index + 1))
        return item

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if not batch:
            return batch
        by_id = {s["id"]: s for s in samples}
        ordered = [by_id[i] for i in batch["id"].tolist()]  # the collater sorted by source length

        def pad(key, value):
            return data_utils.collate_tokens([s[key] for s in ordered], value, left_pad=self.left_pad_source)

        batch["net_input"]["src_group"] = pad("group", PAD_GROUP)
        batch["net_input"]["src_distance"] = pad("distance", 0)
        batch["src_label"] = pad("label", IGNORED_LABEL)
        return batch
