"""K-BERT tasks: sentence classification and character-level tagging read from raw TSVs.

``kbert_classification`` reads ``DATA/{split}.tsv`` with a header naming ``label`` and ``text_a``
(book_review: ``label<TAB>text_a``, unsegmented Chinese, one token per character), or ``label``,
``text_a`` and ``text_b`` for sentence pairs (XNLI, LCQMC: ``<s> a </s> b </s>`` with segment ids
0/1; see ``data.kbert_dataset``), and trains with fairseq's ``sentence_prediction`` criterion;
``kbert_tagging`` reads space-separated characters and BIO tags (medical_ner: ``text_a<TAB>label``)
and trains with ``kbert_tagging``. Both read
``DATA/dict.txt`` (the dictionary of the pretrained model when there is one, e.g. Google's BERT
vocabulary from ``convert.hf_bert``; else the characters ``prep.kbert`` collected; ``<mask>`` is
appended as fairseq's ``masked_lm`` task does, so a masked LM pretrained on the same dictionary
loads) and ``DATA/labels.txt`` (one label or tag per
line; made from ``train.tsv`` when absent), and inject the knowledge graph ``--kg`` into every
sentence (K-BERT's knowledge layer; no ``--kg``: plain BERT input; mentions found as the authors'
code finds them, ``--kg-matching pkuseg``, see ``modules.knowledge_graph``). The counts of dropped
branches and trunk tokens are logged per split.

    fairseq-train DATA --user-dir fairseq_knowgen --task kbert_classification --kg kgs/HowNet.spo \\
        --arch kbert_small --criterion sentence_prediction ...

Every row of every split counts: the tasks batch their datasets with
``--required-batch-size-multiple 1`` whatever the flag says (fairseq drops a last batch that is not
a multiple). Bad input (a TSV or KG row, ``dict.txt``, a label that training never has, a
``--kbert-pretrained`` that is missing or does not fit) ends ``fairseq-train`` / ``fairseq-validate``
with ``error: path:line: ...`` and exit status 2.
"""

import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task

from ..data.kbert_dataset import ENT, FRAMINGS, KBertDataset, read_tsv
from ..modules.knowledge_graph import INJECT_CHOICES, MATCHING_CHOICES, load_kg
from ..optim import kbert_adam  # noqa: F401  (registers --optimizer kbert_adam, the authors' fine-tuning settings)
from ..textio import DataError, read_lines

logger = logging.getLogger(__name__)
INJECT = ChoiceEnum(list(INJECT_CHOICES))
MATCHING = ChoiceEnum(list(MATCHING_CHOICES))


@contextlib.contextmanager
def exit_on_data_error():
    """Bad input found by a fairseq entry point (``fairseq-train``, ``-validate``): ``error: path:line:
    ...`` and exit status 2, as the package's own commands end, instead of a traceback."""
    try:
        yield
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


@dataclass
class KBertClassificationConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "folder with dict.txt, labels.txt and {split}.tsv"})
    kg: Optional[str] = field(
        default=None, metadata={"help": "knowledge graph (subject<TAB>predicate<TAB>object per line); none: no KG"}
    )
    kg_inject: INJECT = field(
        default="predicate-object",
        metadata={"help": "branch tokens of a triple: predicate-object (the paper, classification) or object (NER)"},
    )
    kg_max_entities: int = field(
        default=2, metadata={"help": "at most this many triples per mention, the first ones in the KG file's order"}
    )
    kg_min_mention: int = field(default=1, metadata={"help": "ignore KG subjects shorter than this (tokens)"})
    kg_matching: MATCHING = field(
        default="pkuseg",
        metadata={
            "help": "how mentions are found: pkuseg (the authors' code: pkuseg with the KG's subjects as its user "
            "dictionary, which forces the longest subject left to right, with pkuseg's overshoot quirk) or longest "
            "(the longest subject at each position, without the quirk)"
        },
    )
    max_positions: int = field(
        default=256,
        metadata={
            "help": "longest input, <s> and </s> included; longer trees lose branches (last first), then trunk tail"
        },
    )
    kbert_framing: ChoiceEnum(list(FRAMINGS)) = field(
        default="bos-eos",
        metadata={
            "help": "the tokens around a sentence's tree: bos-eos (default): <s> tree </s>; authors: as the authors' "
            "code feeds BERT, <s> tree for classification (their [CLS] + text, no [SEP]) and the tree alone for "
            "tagging (no [CLS], no [SEP]); sentence pairs are <s> a </s> b </s> with either"
        },
    )
    regression_target: bool = field(default=False, metadata={"help": "(read by sentence_prediction; unused)"})


@dataclass
class KBertTaggingConfig(KBertClassificationConfig):
    kg_inject: INJECT = field(
        default="object",
        metadata={"help": "branch tokens of a triple: predicate-object or object (the paper's choice for NER)"},
    )
    kg_injected_label: ChoiceEnum(["none", "ent"]) = field(
        default="none",
        metadata={
            "help": "the tag of injected tokens: none (no tag, no loss: the paper tags the sentence's characters) or "
            "ent (the authors' run_kbert_ner.py: a tag [ENT], trained on; never predicted for a character)"
        },
    )


@register_task("kbert_classification", dataclass=KBertClassificationConfig)
class KBertClassificationTask(FairseqTask):
    """Sentence classification over K-BERT sentence trees (Liu et al., 2020)."""

    tagging = False
    head_name = "sentence_classification_head"

    def __init__(self, cfg, dictionary, labels):
        super().__init__(cfg)
        if self.tagging and str(getattr(cfg, "kg_injected_label", None) or "none") == "ent" and ENT not in labels:
            labels = list(labels) + [ENT]  # the last tag: the authors' label of injected tokens
        self.dictionary, self.labels = dictionary, labels
        self.label_index = {x: i for i, x in enumerate(labels)}
        self._label_dictionary = Dictionary()
        for x in labels:
            self._label_dictionary.add_symbol(x)
        self._kg = None

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        with exit_on_data_error():
            dictionary = load_dictionary(os.path.join(cfg.data, "dict.txt"))
            dictionary.add_symbol("<mask>")  # as fairseq's masked_lm task, so its checkpoints load
            labels_path = os.path.join(cfg.data, "labels.txt")
            if os.path.isfile(labels_path):
                labels = [x.strip() for x in read_lines(labels_path, "labels") if x.strip()]
            else:
                labels = label_set(os.path.join(cfg.data, "train.tsv"), cls.tagging)
        logger.info(f"dictionary: {len(dictionary)} types; labels: {labels}")
        return cls(cfg, dictionary, labels)

    @property
    def kg(self):
        if self._kg is None and self.cfg.kg:
            # a checkpoint saved before --kg-matching existed matched by longest match
            matching = str(getattr(self.cfg, "kg_matching", None) or "longest")
            with exit_on_data_error():
                self._kg = load_kg(self.cfg.kg, "char", self.cfg.kg_max_entities, self.cfg.kg_min_mention, matching)
            logger.info(f"knowledge graph {self.cfg.kg}: {len(self._kg)} subjects, mentions by {matching} matching")
        return self._kg

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        path = os.path.join(self.cfg.data, f"{split}.tsv")
        with exit_on_data_error():
            ds = KBertDataset(
                read_tsv(path, self.tagging),
                self.dictionary,
                self.label_index,
                self.kg,
                self.cfg.kg_inject,
                self.cfg.max_positions,
                self.tagging,
                path,
                self.label_index.get(ENT) if self.tagging else None,
                framing=str(getattr(self.cfg, "kbert_framing", None) or "bos-eos"),  # none in older checkpoints
            )
        logger.info(
            f"{path}: {len(ds)} examples, {ds.injected_tokens} injected tokens kept, {ds.dropped_branches} branches "
            f"and {ds.dropped_trunk} sentence tokens dropped (--max-positions {self.cfg.max_positions})"
        )
        self.datasets[split] = ds
        return ds

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq's, with ``required_batch_size_multiple=1`` for the K-BERT datasets whatever the
        flag says: this fairseq drops a last batch that is not a multiple of it (default 8), so
        ``fairseq-validate`` would score 56 of 60 dev rows and ``fairseq-train`` would never see
        the longest rows (the last batch of the size-sorted order). Every row counts."""
        if isinstance(dataset, KBertDataset):
            args, kwargs = every_row(args, kwargs)
        return super().get_batch_iterator(dataset, *args, **kwargs)

    def build_model(self, cfg, from_checkpoint=False):
        pairs = has_text_b(os.path.join(self.cfg.data, "train.tsv"))
        if not from_checkpoint and getattr(cfg, "num_segments", 0) is None and pairs:
            cfg.num_segments = 2  # sentence pairs: segment embeddings (recorded in the args, so in checkpoints)
            logger.info("sentence-pair data: 2 segment embeddings (--num-segments 2)")
        with exit_on_data_error():  # a --kbert-pretrained that is missing, partial or of other sizes
            model = super().build_model(cfg, from_checkpoint)
        if self.tagging:
            model.register_tagging_head(self.head_name, len(self.labels))
        else:
            model.register_classification_head(self.head_name, len(self.labels))
        return model

    def max_positions(self):
        return self.cfg.max_positions

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    @property
    def label_dictionary(self):
        return self._label_dictionary


@register_task("kbert_tagging", dataclass=KBertTaggingConfig)
class KBertTaggingTask(KBertClassificationTask):
    """Character-level BIO tagging over K-BERT sentence trees; only sentence characters carry tags."""

    tagging = True
    head_name = "tagging_head"


def every_row(args: tuple, kwargs: dict):
    """``FairseqTask.get_batch_iterator``'s arguments after the dataset with
    ``required_batch_size_multiple=1``, given by position or by keyword."""
    if len(args) > 4:  # positional: max_tokens, max_sentences, max_positions, ignore_invalid_inputs, multiple
        return (*args[:4], 1, *args[5:]), kwargs
    return args, {**kwargs, "required_batch_size_multiple": 1}


def load_dictionary(path: str) -> Dictionary:
    """fairseq's ``Dictionary.load``; a missing or malformed ``dict.txt`` raises :class:`DataError`."""
    if not os.path.isfile(path):
        raise DataError(path, 0, "dictionary not found (prep.kbert writes DATA/dict.txt)")
    try:
        return Dictionary.load(path)
    except (ValueError, RuntimeError) as e:
        raise DataError(path, 0, f"not a fairseq dict.txt ({e})") from None


def has_text_b(tsv: str) -> bool:
    """Whether a TSV's header names a ``text_b`` column (sentence pairs)."""
    if not os.path.isfile(tsv):
        return False
    with open(tsv, encoding="utf-8", errors="replace") as f:
        return "text_b" in f.readline().rstrip("\r\n").split("\t")


def label_set(train_tsv: str, tagging: bool):
    """The sorted labels (tags) of a training TSV."""
    examples = read_tsv(train_tsv, tagging)
    labels = {t for ex in examples for t in ex.label} if tagging else {ex.label for ex in examples}
    if not labels:
        raise DataError(train_tsv, 0, "no labels")
    return sorted(labels)
