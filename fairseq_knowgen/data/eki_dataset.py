"""Source-side annotations of EKI's retrieve-and-edit input, computed from token ids.

The source is ``concept tokens <sep> prototype tokens </s>`` as the model sees it (after
BPE). For every source token this dataset adds, in ``__getitem__`` and the collater (never
in the model):

- ``group``: 1 concept part (including ``<sep>``), 2 prototype part (including ``</s>``),
  0 padding (Eq. 3);
- ``distance``: the position indicator D (Eq. 7-8) over *subword* positions of the
  prototype. A prototype word matches a concept when their lemmas (``simplemma``) are
  equal; the word is rebuilt from its BPE pieces (``@@`` continuation marks), and **every
  piece of a matching word is a center**. Concept tokens (and ``<sep>``) get 0;
- ``label``: the target of L_E (Eq. 6): 1 if the token id occurs in the target, 1 for all
  concept tokens, 0 otherwise (padding is ignored by the loss).
"""

from functools import lru_cache
from typing import Dict, List

import torch
from fairseq.data import BaseWrapperDataset, data_utils

from ..evaluation.metrics import lemma
from ..modules.group_embedding import CONCEPT_GROUP, PAD_GROUP, PROTOTYPE_GROUP
from ..modules.position_indicator import prototype_distances

SEPARATOR = "<sep>"


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


class EKIDataset(BaseWrapperDataset):
    """Wraps a ``LanguagePairDataset`` whose sources hold ``concepts <sep> prototype``."""

    def __init__(self, dataset, src_dict, max_distance: int = 64, path: str = "?"):
        super().__init__(dataset)
        self.dict = src_dict
        self.sep = src_dict.index(SEPARATOR)
        if self.sep == src_dict.unk():
            raise ValueError(
                f"{path}: the source dictionary has no '{SEPARATOR}' symbol; "
                f"make sources as 'concepts {SEPARATOR} prototype' (and keep it out of BPE)"
            )
        self.max_distance = max_distance
        self.left_pad_source = getattr(dataset, "left_pad_source", True)

    @lru_cache(maxsize=100_000)
    def _lemma(self, word: str) -> str:
        return lemma(word.lower())

    def annotate(self, source: torch.Tensor, target) -> Dict[str, torch.Tensor]:
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
            for v, d in zip(proto, prototype_distances(is_center, self.max_distance)):
                distance[v] = d
            if n - 1 > sep and ids[-1] == self.dict.eos():  # </s>: one past the last prototype piece
                distance[-1] = min(distance[proto[-1]] + 1, self.max_distance)
        in_target = set(target.tolist()) if target is not None else set()
        label = [1.0 if (k < sep or ids[k] in in_target) else 0.0 for k in range(n)]
        return {"group": torch.tensor(group), "distance": torch.tensor(distance), "label": torch.tensor(label)}

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
        batch["src_label"] = pad("label", -1.0)
        return batch
