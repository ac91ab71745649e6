"""``kbert_translation``: fairseq's ``translation`` whose sources become K-BERT sentence trees.

For ``kbert_transformer`` (K-BERT's encoder, Liu et al., 2020, under a transformer decoder;
beyond the paper). Every loaded split's source (binarized, word level) is looked up in the
knowledge graph ``--kg`` (``subject<TAB>predicate<TAB>object``, space-separated tokens as in the
source; for WebNLG ``python -m fairseq_knowgen.prep.kbert webnlg-kg`` builds one from the training
triples), and each mention's first ``--kg-max-entities`` triples are hung after it as branches;
the batches carry the soft positions and branch/mention ids the encoder needs::

    fairseq-train DATA_BIN --user-dir fairseq_knowgen --task kbert_translation --kg raw/kg.spo \\
        --arch kbert_transformer ...
    fairseq-generate DATA_BIN --user-dir fairseq_knowgen --task kbert_translation --kg raw/kg.spo --path ...

Injected words missing from the source dictionary become ``<unk>``. The counts of injected and
dropped tokens are logged per split. Every source counts: the tree datasets are batched with
``--required-batch-size-multiple 1`` whatever the flag says.
"""

import logging
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task

from ..data.kbert_dataset import KBertPairDataset
from ..modules.knowledge_graph import INJECT_CHOICES, load_kg
from .kbert import every_row
from .translation_constrained import TranslationConstrainedConfig, TranslationConstrainedTask

logger = logging.getLogger(__name__)


@dataclass
class KBertTranslationConfig(TranslationConstrainedConfig):
    kg: Optional[str] = field(
        default=None,
        metadata={"help": "knowledge graph (subject<TAB>predicate<TAB>object, space-tokenized); none: no KG"},
    )
    kg_inject: ChoiceEnum(list(INJECT_CHOICES)) = field(
        default="predicate-object", metadata={"help": "branch tokens of a triple: predicate-object or object"}
    )
    kg_max_entities: int = field(default=2, metadata={"help": "at most this many triples per mention, in file order"})
    kg_min_mention: int = field(default=1, metadata={"help": "ignore KG subjects shorter than this (tokens)"})
    kg_keep_source_facts: bool = field(
        default=False,
        metadata={
            "help": "also inject triples the linearized source (<S> s <P> p <O> o) states itself (default: skip)"
        },
    )
    kg_every_mention: bool = field(
        default=False,
        metadata={"help": "hang an entity's facts on every mention of it (default: its first mention only)"},
    )


@register_task("kbert_translation", dataclass=KBertTranslationConfig)
class KBertTranslationTask(TranslationConstrainedTask):
    """Translation with K-BERT sentence trees as sources (see the module docstring); decoding
    rules of ``translation_constrained`` (``--at-most-once``) apply."""

    _kg = None

    @property
    def kg(self):
        if self._kg is None and self.cfg.kg:
            self._kg = load_kg(self.cfg.kg, "word", self.cfg.kg_max_entities, self.cfg.kg_min_mention)
            logger.info(f"knowledge graph {self.cfg.kg}: {len(self._kg)} subjects")
        return self._kg

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch, combine, **kwargs)
        ds = self.kbert_pairs(self.datasets[split])
        logger.info(
            f"{split}: {len(ds)} sources, {ds.injected_tokens} injected tokens kept, {ds.dropped_branches} branches "
            f"and {ds.dropped_trunk} source tokens dropped (--max-source-positions {self.cfg.max_source_positions})"
        )
        self.datasets[split] = ds

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq's, with ``required_batch_size_multiple=1`` for the tree datasets whatever the flag
        says (fairseq drops a last batch that is not a multiple, 8 by default in ``fairseq-generate``:
        inputs would go undecoded)."""
        if isinstance(dataset, KBertPairDataset):
            args, kwargs = every_row(args, kwargs)
        return super().get_batch_iterator(dataset, *args, **kwargs)

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        pair = super().build_dataset_for_inference(src_tokens, src_lengths, constraints)
        return self.kbert_pairs(pair)

    def kbert_pairs(self, pair):
        cfg = self.cfg
        return KBertPairDataset(
            pair,
            self.kg,
            cfg.kg_inject,
            cfg.max_source_positions,
            not cfg.kg_keep_source_facts,
            not cfg.kg_every_mention,
        )
