"""Source-side annotations of EKI's retrieve-and-edit input, computed from token ids.

The source is ``concept tokens <sep> prototype tokens </s>`` as the model sees it (after
BPE). For every source token :class:`SourceAnnotator` computes, from the token ids alone
(so that training, ``fairseq-generate`` and ``fairseq-interactive`` share one definition;
never in the model):

- ``group``: 1 concept part (including ``<sep>``), 2 prototype part (including ``</s>``),
  0 padding (Eq. 3);
- ``distance``: the position indicator D (Eq. 7-8) over *subword* positions of the
  prototype. A prototype word matches a concept when their lemmas (``simplemma``) are
  equal; the word is rebuilt from its BPE pieces (``@@`` continuation marks), and **every
  piece of a matching word is a center**. Concept tokens (and ``<sep>``) get 0; ``</s>`` is
  one past the last prototype piece. Distances are **not clipped** here: a prototype without
  any concept gets :data:`NO_CENTER`, larger than any model's bound. The model clamps them at
  its own ``--eki-max-distance`` (``PositionIndicatorAttention``), which its checkpoint
  saves, so that the one value a model was trained with is the value it decodes with;
- ``label``: the target of L_E (Eq. 6), ``I{s_v in T}``: 1 if the token id occurs in the
  target's ids, 0 otherwise, for concept and prototype tokens alike (the paper's definition;
  the criterion's ``--eki-concept-label always`` turns concept tokens to 1). ``<sep>``,
  ``</s>``, ``<s>`` and padding get -1 and are left out of L_E and its accuracy: their labels
  are trivial (``</s>`` ends every target, ``<sep>`` is in none).
"""

from functools import lru_cache
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.data import BaseWrapperDataset, data_utils
from torch import Tensor

from ..text import lemma
from ..modules.group_embedding import CONCEPT_GROUP, PAD_GROUP, PROTOTYPE_GROUP
from ..modules.position_indicator import prototype_distances

SEPARATOR = "<sep>"
# distance of every token of a prototype without a concept (and the bound handed to
# prototype_distances): above any --eki-max-distance, so each model clamps it to its own bound
NO_CENTER = 1 << 30
IGNORED_LABEL = -1.0


def words_of_pieces(pieces: List[str]) -> List[int]:
    """Word index of each BPE piece (``ab@@ c`` -> one word)."""
    out, w = [], 0
    for p in pieces:
        out.append(w)
        if not p.endswith("@@"):
            w += 1
    return out


def join_words(pieces: List[str]) -> List[str]:
    words, cur = [], ""
    for p in pieces:
        if p.endswith("@@"):
            cur += p[:-2]
        else:
            words.append(cur + p)
            cur = ""
    if cur:
        words.append(cur)
    return words


class SourceAnnotator:
    """Group ids, distances and L_E labels of ``concepts <sep> prototype`` sources (see the
    module docstring); ``path`` names the data in errors."""

    def __init__(self, src_dict, path: str = "?"):
        self.dict = src_dict
        self.sep = src_dict.index(SEPARATOR)
        if self.sep == src_dict.unk():
            raise ValueError(
                f"{path}: the source dictionary has no '{SEPARATOR}' symbol; "
                f"make sources as 'concepts {SEPARATOR} prototype' (and keep it out of BPE)"
            )
        self.unlabelled = {self.sep, src_dict.eos(), src_dict.bos(), src_dict.pad()}

    @lru_cache(maxsize=100_000)
    def _lemma(self, word: str) -> str:
        return lemma(word.lower())

    def annotate(self, source: Tensor, target: Optional[Tensor] = None) -> Dict[str, Tensor]:
        """``group``, ``distance`` and ``label`` (1-D, like ``source``, without padding)."""
        ids = source.tolist()
        n = len(ids)
        sep = ids.index(self.sep) if self.sep in ids else -1
        proto = list(range(sep + 1, n - 1 if ids[-1] == self.dict.eos() else n))  # prototype pieces
        group = [CONCEPT_GROUP] * (sep + 1) + [PROTOTYPE_GROUP] * (n - sep - 1)
        distance = [0] * n
        if proto:
            concept_lemmas = {self._lemma(w) for w in join_words([self.dict[i] for i in ids[: max(sep, 0)]])}
            pieces = [self.dict[ids[v]] for v in proto]
            word_idx = words_of_pieces(pieces)
            word_is_concept = [self._lemma(w) in concept_lemmas for w in join_words(pieces)]
            is_center = [
                word_is_concept[word_idx[k]] if word_idx[k] < len(word_is_concept) else False for k in range(len(proto))
            ]
            for v, d in zip(proto, prototype_distances(is_center, NO_CENTER)):
                distance[v] = d
            if n - 1 > sep and ids[-1] == self.dict.eos():  # </s>: one past the last prototype piece
                distance[-1] = min(distance[proto[-1]] + 1, NO_CENTER)
        in_target = set(target.tolist()) if target is not None else set()
        label = [IGNORED_LABEL if i in self.unlabelled else float(i in in_target) for i in ids]
        return {"group": torch.tensor(group), "distance": torch.tensor(distance), "label": torch.tensor(label)}

    def annotate_batch(self, src_tokens: Tensor) -> Tuple[Tensor, Tensor]:
        """``src_group`` and ``src_distance`` of a padded batch ``B x S`` (padding on either
        side), as the collater of :class:`EKIDataset` makes them: for batches that carry only
        ``src_tokens`` (``fairseq-interactive``)."""
        real = src_tokens.ne(self.dict.pad())
        group = torch.full_like(src_tokens, PAD_GROUP)
        distance = torch.zeros_like(src_tokens)
        for b in range(src_tokens.size(0)):
            a = self.annotate(src_tokens[b][real[b]].cpu())
            group[b][real[b]] = a["group"].to(group.device)
            distance[b][real[b]] = a["distance"].to(distance.device)
        return group, distance


class EKIDataset(BaseWrapperDataset):
    """Wraps a ``LanguagePairDataset`` whose sources hold ``concepts <sep> prototype``; adds
    ``src_group`` and ``src_distance`` to ``net_input`` and ``src_label`` to the batch. The
    wrapped dataset's lexical constraints (:mod:`fairseq_knowgen.data.constraints`) reach the
    batch through its own collater, sorted with the sources."""

    def __init__(self, dataset, src_dict, path: str = "?"):
        super().__init__(dataset)
        self.annotator = SourceAnnotator(src_dict, path)
        self.left_pad_source = getattr(dataset, "left_pad_source", True)

    def annotate(self, source: Tensor, target: Optional[Tensor] = None) -> Dict[str, Tensor]:
        return self.annotator.annotate(source, target)

    def __getitem__(self, index):
        item = self.dataset[index]
        item.update(self.annotate(item["source"], item.get("target")))
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
