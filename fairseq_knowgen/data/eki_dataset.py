"""Source-side annotations of EKI's retrieve-and-edit input, computed from token ids.

The data holds ``concept tokens <sep> prototype tokens </s>`` (after BPE): ``<sep>`` marks where
the concepts end, one symbol of the dictionary, exactly once in each source (a source without it,
or with it split into BPE pieces, is refused with the data's path and line). What the model reads
is the **input layout** (``--eki-input-layout``):

- ``concat`` (default): the paper's S = [C, O] (Eq. 2), ``<s> C O </s>``, as the authors feed
  BART: their data is ``<s> C </s> O </s>`` and their dataset removes the inner ``</s>`` before the
  model sees it, so that concepts and prototype differ only by their group embeddings (Eq. 3).
  Here ``<sep>`` is removed and ``<s>`` put first; ``<s>`` belongs to the concepts' group;
- ``sep``: ``C <sep> O </s>`` as the data holds it, ``<sep>`` a symbol of its own (checkpoints
  that record no layout were trained with it and load with it).

For every source token :class:`SourceAnnotator` computes, from the token ids alone (so that
training, ``fairseq-generate`` and ``fairseq-interactive`` share one definition; never in the model):

- ``group``: 1 concept part (with ``<sep>``, or ``<s>`` in ``concat``), 2 prototype part (with
  ``</s>``), 0 padding (Eq. 3);
- ``distance``: the position indicator D (Eq. 7-8) over the *subword* positions of the prototype:
  concept tokens 0; a prototype token that matches a concept is a center (1); every other one its
  distance to the nearest center plus one; ``</s>`` one past the last prototype piece. What
  matches (``--eki-center-match``): ``token`` (default, Eq. 7's s_p = c: the prototype token's id
  is one of the concept tokens' ids) or ``lemma`` (the word the piece belongs to, rebuilt from the
  BPE by :class:`PieceWords`, has the lemma of a concept word (``simplemma``): ``dogs`` matches
  ``dog``, and every piece of a matching word is a center). Distances are **not clipped** here: a
  prototype without any center gets :data:`NO_CENTER`, larger than any model's bound; the model
  clamps them at its own ``--eki-max-distance``, which its checkpoint saves;
- ``label``: the target of L_E (Eq. 6), ``I{s_v in T}`` for concept and prototype tokens alike
  (the criterion's ``--eki-concept-label always`` turns concept tokens to 1, as the authors' code
  does). The unit (``--eki-label-unit``): ``token`` (default; Eq. 6 over the tokens s_v of S, as
  the authors' code computes it: 1 when the token's id occurs among the target's ids, so ``dog@@``
  is 0 for the target ``the dog``) or ``word`` (1 when the word the token belongs to, rebuilt from
  the BPE and lower-cased, occurs among the target's words: both pieces of ``run@@ s`` are 1 for
  the target ``he runs``). ``<sep>``, ``<s>``, ``</s>`` and padding get -1 and are left out of L_E
  and its accuracy: they are no tokens of C or O (Eq. 2) and their labels are trivial.

The settings a checkpoint was trained with are in its saved task config (:func:`data_settings`):
``fairseq-generate`` loads the data with them, ``fairseq-interactive`` annotates with the model's.
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
INPUT_LAYOUTS = ("concat", "sep")
CENTER_MATCHES = ("token", "lemma")
LABEL_UNITS = ("token", "word")
# the data settings of checkpoints trained before the options existed (their task config lacks them)
LEGACY_DATA_SETTINGS = {"eki_input_layout": "sep", "eki_center_match": "lemma", "eki_label_unit": "word"}


def _kept_symbol():
    # imported here: ``python -m fairseq_knowgen.convert.extend_dictionary`` runs that module as __main__,
    # and runpy warns when the package import (tasks -> this module) loaded it first
    from ..convert.extend_dictionary import PACKAGE_SYMBOL

    return PACKAGE_SYMBOL


def _runs(tokens: List[str]) -> List[Tuple[bool, str]]:
    """``(kept, text)``: each symbol of the package (``<sep>``, ``<ent-K>``, ``<unk-N>``) alone,
    the words between them joined."""
    kept = _kept_symbol()
    out: List[Tuple[bool, str]] = []
    for tok in tokens:
        if kept.fullmatch(tok):
            out.append((True, tok))
        elif out and not out[-1][0]:
            out[-1] = (False, f"{out[-1][1]} {tok}")
        else:
            out.append((False, tok))
    return out


def encode_source(line: str, encode_fn) -> str:
    """``encode_fn`` (fairseq-interactive's tokenizer + BPE, or GPT-2's encoder) on each run of
    words between the package's symbols (``<sep>``, ``<ent-K>``, ``<unk-N>``), which stay whole:
    one dictionary symbol each, never BPE pieces."""
    pieces = [text if kept else encode_fn(text) for kept, text in _runs(line.split())]
    return " ".join(p for p in pieces if p)


class SeparatorKeepingBPE:
    """A fairseq BPE (``--bpe``) whose ``decode`` keeps ``<sep>`` (and the package's other symbols)
    whole, each run between them decoded apart, and drops ``<s>``: the inverse of
    :func:`encode_source`. GPT-2's decoder reads only GPT-2 ids, and ``fairseq-generate`` decodes
    the source line too. Everything else is the wrapped BPE's."""

    def __init__(self, bpe):
        self.bpe = bpe

    def decode(self, x: str) -> str:
        # fairseq-generate's source line of the concat layout starts with <s>, which is no text
        tokens = [t for t in x.split() if t not in ("<s>", "</s>", "<pad>")]
        pieces = [text if kept else self.bpe.decode(text).strip() for kept, text in _runs(tokens)]
        return " ".join(p for p in pieces if p)

    def __getattr__(self, name):
        return getattr(self.bpe, name)


def _char_class(byte: int) -> str:
    """GPT-2's pre-tokenizer splits text into letters, numbers and other runs: the class of a
    byte (non-ASCII bytes, parts of accented letters, count as letters)."""
    ch = chr(byte)
    return "L" if byte >= 0x80 or ch.isalpha() else "N" if ch.isdigit() else "O"


class PieceWords:
    """The words of a row of dictionary symbols (BPE pieces), for either BPE of the package:

    - subword-nmt: a piece ending in ``@@`` continues into the next (``dog@@ s`` is ``dogs``);
    - GPT-2's byte-level BPE (fairseq's ``--bpe gpt2``, BART's dictionaries): the symbols are
      GPT-2 ids, decoded with ``encoder.json`` to their bytes. A piece starting with a space
      starts a word (`` dog`` and ``dog`` are one word ``dog``, the first without a space as
      the first piece of a part encodes it); a piece without one continues the previous word
      when both are of one kind (letters, digits, other), as GPT-2's pre-tokenizer splits raw
      text: ``Park.`` is `` Park`` ``.``, two words, and `` Fr`` ``isbee`` one.

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

    def text(self, ids: List[int]) -> str:
        """The pieces' text run together (spaces only where GPT-2's pieces hold them)."""
        return b"".join(self.piece(i)[0] for i in ids).decode("utf-8", errors="replace")

    def words(self, ids: List[int]) -> Tuple[List[int], List[str]]:
        """Word index of each id, and the words (lower-cased, stripped)."""
        index: List[int] = []
        parts: List[bytes] = []
        prev = None
        for k, i in enumerate(ids):
            text, glue_prev, glue_next, special = self.piece(i)
            joined = k > 0 and not special and not prev[3] and (prev[2] or glue_prev)
            if joined and self.gpt2 is not None and text and prev[0] and not prev[0].isspace():
                joined = _char_class(prev[0][-1]) == _char_class(text[0])
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


def data_settings(cfg=None, legacy: bool = False) -> Dict[str, str]:
    """``eki_input_layout``, ``eki_center_match``, ``eki_label_unit`` of a task config (an
    ``EKIGenerationConfig``, a checkpoint's saved task config, a model's argparse args). A
    setting the config lacks is the default, or, with ``legacy`` (a checkpoint's config),
    :data:`LEGACY_DATA_SETTINGS`: what the model was trained with before the option existed."""
    defaults = {
        "eki_input_layout": INPUT_LAYOUTS[0],
        "eki_center_match": CENTER_MATCHES[0],
        "eki_label_unit": LABEL_UNITS[0],
    }
    out = {}
    for name, default in defaults.items():
        value = cfg.get(name, None) if hasattr(cfg, "get") else getattr(cfg, name, None)
        out[name] = str(value) if value is not None else LEGACY_DATA_SETTINGS[name] if legacy else default
    return out


class SourceAnnotator:
    """Group ids, distances and L_E labels of ``concepts <sep> prototype`` sources, and the
    tokens the model reads (see the module docstring).

    Args:
        src_dict: the source dictionary (one with ``<sep>``).
        path: names the data in errors.
        gpt2_encoder_json: the dictionary's symbols are GPT-2 ids (:class:`PieceWords`); needed for
            the word-level options (``center_match="lemma"``, ``label_unit="word"``).
        layout: ``concat`` (``<s> C O </s>``) or ``sep`` (``C <sep> O </s>``).
        center_match: ``token`` (Eq. 7: equal ids) or ``lemma`` (equal lemmas of the pieces' words).
        label_unit: ``token`` (the token's id among the target's) or ``word`` (its word among the target's).
    """

    def __init__(
        self,
        src_dict,
        path: str = "?",
        gpt2_encoder_json: Optional[str] = None,
        layout: str = INPUT_LAYOUTS[0],
        center_match: str = CENTER_MATCHES[0],
        label_unit: str = LABEL_UNITS[0],
    ):
        for flag, value, choices in (
            ("--eki-input-layout", layout, INPUT_LAYOUTS),
            ("--eki-center-match", center_match, CENTER_MATCHES),
            ("--eki-label-unit", label_unit, LABEL_UNITS),
        ):
            if value not in choices:
                raise ValueError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
        self.dict = src_dict
        self.path = path
        self.layout, self.center_match, self.label_unit = layout, center_match, label_unit
        self.sep = src_dict.index(SEPARATOR)
        if self.sep == src_dict.unk():
            raise ValueError(
                f"{path}: the source dictionary has no '{SEPARATOR}' symbol; "
                f"make sources as 'concepts {SEPARATOR} prototype' (and keep it out of BPE)"
            )
        need_words = center_match == "lemma" or label_unit == "word"
        self.pieces = None
        if need_words or gpt2_encoder_json or not looks_like_gpt2_ids(src_dict):
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
        if self.pieces is not None and SEPARATOR in self.pieces.text(ids):
            raise DataError(
                self.path,
                line,
                f"'{SEPARATOR}' is split into BPE pieces: encode the concepts and the prototype apart and put "
                f"'{SEPARATOR}' between them (subword-nmt: apply-bpe --glossaries '{SEPARATOR}')",
            )
        raise DataError(self.path, line, f"no '{SEPARATOR}' in the source: expected 'concepts {SEPARATOR} prototype'")

    def _centers(self, ids: List[int], sep: int, end: int) -> List[bool]:
        """Whether each prototype piece ``ids[sep + 1 : end]`` is a position center (Eq. 7)."""
        proto = ids[sep + 1 : end]
        if self.center_match == "token":  # s_p = c: the piece's id is a concept token's
            concept_ids = set(ids[:sep]) - self.unlabelled
            return [i in concept_ids for i in proto]
        concept_lemmas = {self._lemma(w) for w in self.pieces.words(ids[:sep])[1]}
        proto_idx, proto_words = self.pieces.words(proto)
        word_is_concept = [self._lemma(w) in concept_lemmas for w in proto_words]
        return [word_is_concept[w] for w in proto_idx]

    def _labels(self, ids: List[int], sep: int, end: int, target: Optional[Tensor]) -> List[float]:
        """I{s_v in T} (Eq. 6) of each source token; -1 for ``<sep>``, ``<s>``, ``</s>``, padding."""
        n = len(ids)
        if self.label_unit == "token":
            unit = ids
            in_target = set(target.tolist()) - self.unlabelled if target is not None else set()
        else:  # the word each piece belongs to
            concept_idx, concept_words = self.pieces.words(ids[:sep])
            proto_idx, proto_words = self.pieces.words(ids[sep + 1 : end])
            unit = [concept_words[w] for w in concept_idx] + [SEPARATOR] + [proto_words[w] for w in proto_idx]
            unit += [""] * (n - len(unit))
            in_target = set(self.pieces.words(target.tolist())[1]) if target is not None else set()
        return [IGNORED_LABEL if i in self.unlabelled else float(unit[v] in in_target) for v, i in enumerate(ids)]

    def annotate(self, source: Tensor, target: Optional[Tensor] = None, line: int = 0) -> Dict[str, Tensor]:
        """``source`` (the tokens the model reads, in the input layout), ``group``, ``distance`` and
        ``label`` (1-D, like ``source``, without padding); ``line`` (1-based) names the row in errors."""
        ids = source.tolist()
        n = len(ids)
        sep = self.separator_position(ids, line)
        end = n - 1 if ids[-1] == self.dict.eos() else n
        proto = list(range(sep + 1, end))  # prototype pieces
        group = [CONCEPT_GROUP] * (sep + 1) + [PROTOTYPE_GROUP] * (n - sep - 1)
        distance = [0] * n
        if proto:
            for v, d in zip(proto, prototype_distances(self._centers(ids, sep, end), NO_CENTER)):
                distance[v] = d
            if end < n:  # </s>: one past the last prototype piece
                distance[-1] = min(distance[proto[-1]] + 1, NO_CENTER)
        label = self._labels(ids, sep, end, target)
        if self.layout == "concat":  # <s> C O </s>: <sep> out, <s> first, in the concepts' group
            ids = [self.dict.bos()] + ids[:sep] + ids[sep + 1 :]
            group = [CONCEPT_GROUP] + group[:sep] + group[sep + 1 :]
            distance = [0] + distance[:sep] + distance[sep + 1 :]
            label = [IGNORED_LABEL] + label[:sep] + label[sep + 1 :]
        return {
            "source": torch.tensor(ids, dtype=source.dtype),
            "group": torch.tensor(group),
            "distance": torch.tensor(distance),
            "label": torch.tensor(label),
        }

    def annotate_batch(self, src_tokens: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """The model's ``src_tokens``, ``src_group`` and ``src_distance`` of a padded batch ``B x S``
        of ``C <sep> O </s>`` sources (padding on either side), as the collater of :class:`EKIDataset`
        makes them: for batches that carry only ``src_tokens`` (``fairseq-interactive``). The input
        layout keeps each row's length, so the padding stays where it is."""
        real = src_tokens.ne(self.dict.pad())
        tokens = src_tokens.clone()
        group = torch.full_like(src_tokens, PAD_GROUP)
        distance = torch.zeros_like(src_tokens)
        for b in range(src_tokens.size(0)):
            a = self.annotate(src_tokens[b][real[b]].cpu(), line=b + 1)
            tokens[b][real[b]] = a["source"].to(tokens.device)
            group[b][real[b]] = a["group"].to(group.device)
            distance[b][real[b]] = a["distance"].to(distance.device)
        return tokens, group, distance


class EKIDataset(BaseWrapperDataset):
    """Wraps a ``LanguagePairDataset`` whose sources hold ``concepts <sep> prototype``; its items'
    ``source`` becomes the input layout the model reads, and it adds ``src_group`` and
    ``src_distance`` to ``net_input`` and ``src_label`` to the batch. The wrapped dataset's lexical
    constraints (:mod:`fairseq_knowgen.data.constraints`) reach the batch through its own collater,
    sorted with the sources. ``settings``: :class:`SourceAnnotator`'s ``layout``, ``center_match``
    and ``label_unit``."""

    def __init__(self, dataset, src_dict, path: str = "?", gpt2_encoder_json: Optional[str] = None, **settings):
        super().__init__(dataset)
        self.annotator = SourceAnnotator(src_dict, path, gpt2_encoder_json, **settings)
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
        a = self.annotate(item["source"], item.get("target"), line=index + 1)
        item["source"] = a.pop("source")  # same length: the wrapped dataset's sizes still hold
        item.update(a)
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
