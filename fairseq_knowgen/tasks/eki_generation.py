"""``eki_generation``: translation whose sources are ``concepts <sep> prototype``.

fairseq's ``translation`` task plus the source annotations of
:class:`~fairseq_knowgen.data.eki_dataset.SourceAnnotator` (group ids, position-indicator
distances, L_E labels), which reach the model as ``src_group`` / ``src_distance`` in
``net_input`` and the criterion as ``src_label``. Binarize with ``fairseq-preprocess`` as
for translation; keep ``<sep>`` out of BPE (``subword-nmt apply-bpe --glossaries '<sep>'``, or
with GPT-2 BPE each side encoded apart and ``<sep>`` put between them:
``python -m fairseq_knowgen.prep.commongen gpt2-bpe``). With GPT-2 BPE (BART's dictionaries)
give ``--eki-gpt2-encoder-json encoder.json``: the annotations then read words from the GPT-2
ids (:class:`~fairseq_knowgen.data.eki_dataset.PieceWords`).
It extends ``translation_constrained``: ``--constraints-from SUFFIX`` with ``fairseq-generate
--constraints unordered`` forces e.g. every concept into the output (the constraints sit in the
wrapped ``LanguagePairDataset``, whose collater :class:`EKIDataset` calls).

Model hyper-parameters are the model's alone: the task has no copy of ``--eki-max-distance``
(distances leave the data unclipped and the model clamps them at the bound its checkpoint
saved). A checkpoint whose task config holds ``eki_max_distance`` loads unchanged (fairseq drops
task keys it does not know when it sets a task up from a checkpoint).

``fairseq-interactive`` (raw text)::

    fairseq-interactive DATA --user-dir fairseq_knowgen --task eki_generation --path ckpt.pt \\
        --bpe subword_nmt --bpe-codes codes [--eki-prototype-corpus train.tgt \\
        --eki-prototype-corpus-keys train.src] < lines

Each input line is ``concepts <sep> prototype``, or, with ``--eki-prototype-corpus``, may be
the concepts alone: the task then retrieves the prototype itself with
:class:`~fairseq_knowgen.prep.retrieval.PrototypeRetriever` (as
``scripts/retrieve_prototypes.py`` made the training sources). Both happen in
``get_interactive_tokens_and_lengths``, the one hook that sees the raw line *before*
fairseq-interactive's ``--tokenizer``/``--bpe`` (``build_dataset_for_inference`` only sees
token ids): retrieval works on words, and the two sides of ``<sep>`` are encoded separately
so that BPE never splits the separator. fairseq-interactive then keeps only ``src_tokens``
and ``src_lengths`` of each batch; :meth:`EKIGenerationTask.inference_step` recomputes
``src_group`` and ``src_distance`` from the tokens with the same annotator as the training
data.

A bad input line (not UTF-8, empty, no concepts before ``<sep>``, more than one ``<sep>``, no
``<sep>`` without ``--eki-prototype-corpus``, more tokens than the model's positions or
``--max-tokens``) gets one ``error: INPUT:LINE: ...`` on stderr and is left out; decoding goes on
with the next line, and the run ends with exit status 2 once the input ends
(:mod:`fairseq_knowgen.compat.interactive_input`). fairseq itself stops at a long line unless
``--skip-invalid-size-inputs-valid-test``; here that flag's skipping is the default.
"""

import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
from fairseq import utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task

from ..compat import interactive_input
from ..data.eki_dataset import (
    CENTER_MATCHES,
    INPUT_LAYOUTS,
    LABEL_UNITS,
    SEPARATOR,
    EKIDataset,
    SeparatorKeepingBPE,
    SourceAnnotator,
    data_settings,
    encode_source,
)
from ..textio import DataError, read_lines, read_parallel
from .translation_constrained import TranslationConstrainedConfig, TranslationConstrainedTask


@dataclass
class EKIGenerationConfig(TranslationConstrainedConfig):
    eki_input_layout: ChoiceEnum(list(INPUT_LAYOUTS)) = field(
        default=INPUT_LAYOUTS[0],
        metadata={
            "help": "what the model reads of the data's 'concepts <sep> prototype': 'concat' (default; the paper's "
            "S = [C, O], as the authors feed BART: <s> C O </s>, <sep> removed, the parts told apart by the group "
            "embeddings) or 'sep' (C <sep> O </s>, <sep> a symbol of its own)"
        },
    )
    eki_center_match: ChoiceEnum(list(CENTER_MATCHES)) = field(
        default=CENTER_MATCHES[0],
        metadata={
            "help": "position-indicator centers (Eq. 7): 'token' (default, the paper's s_p = c: a prototype token "
            "whose id is a concept token's) or 'lemma' (every piece of a prototype word with a concept's lemma)"
        },
    )
    eki_label_unit: ChoiceEnum(list(LABEL_UNITS)) = field(
        default=LABEL_UNITS[0],
        metadata={
            "help": "L_E labels I{s_v in T} (Eq. 6) on 'token' ids (default; the paper's tokens, the authors' code) "
            "or on 'word's rebuilt from the BPE (lower-cased)"
        },
    )
    eki_prototype_corpus: Optional[str] = field(
        default=None,
        metadata={
            "help": "fairseq-interactive: retrieve the prototype of an input line that holds only concepts (no "
            "'<sep>') from this corpus, one sentence a line, as scripts/retrieve_prototypes.py --corpus does"
        },
    )
    eki_gpt2_encoder_json: Optional[str] = field(
        default=None,
        metadata={
            "help": "GPT-2's encoder.json when the data is GPT-2 BPE (a BART dictionary, whose symbols are GPT-2 ids): "
            "concepts, prototype words and L_E labels are then matched on the words decoded from the ids"
        },
    )
    eki_prototype_corpus_keys: Optional[str] = field(
        default=None,
        metadata={
            "help": "concept set of each --eki-prototype-corpus line (in-domain corpora): a sentence written for "
            "the query's own concept set is never its prototype (scripts/retrieve_prototypes.py --corpus-keys)"
        },
    )


def missing_split(cfg, split: str) -> str:
    """``DATA: no SPLIT split ...``: what the binarized data folder holds, and the flag that names a split."""
    data = utils.split_paths(cfg.data)[0]
    found = sorted(
        {n.split(".")[0] for n in os.listdir(data) if n.endswith(".idx")} if os.path.isdir(data) else set()
    )
    return (
        f"{data}: no '{split}' split (binarized: {', '.join(found) or 'none'}); fairseq-generate decodes "
        f"--gen-subset, test unless given: name one of these, e.g. --gen-subset {found[-1] if found else 'valid'}"
    )


@register_task("eki_generation", dataclass=EKIGenerationConfig)
class EKIGenerationTask(TranslationConstrainedTask):
    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self._annotator = None
        self._retriever = None
        self._corpus: List[str] = []
        self._input_lines_seen = 0
        self._inference_dataset = None  # fairseq-interactive's current buffer
        self._inference_max_tokens = None
        self._refused_lines = {}

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        interactive_input.use_for_interactive()  # one error per bad input line, then the next line
        return super().setup_task(cfg, **kwargs)

    def annotator(self, model=None) -> SourceAnnotator:
        """The annotator of raw batches: with the settings ``model`` was trained with (its args;
        checkpoints older than the options: :data:`~fairseq_knowgen.data.eki_dataset.LEGACY_DATA_SETTINGS`),
        else the task's."""
        args = getattr(model, "args", None)
        s = data_settings(args, legacy=True) if args is not None else data_settings(self.cfg)
        key = tuple(s.values())
        if self._annotator is None or self._annotator[0] != key:
            annotator = SourceAnnotator(
                self.src_dict,
                str(self.cfg.data),
                self.cfg.eki_gpt2_encoder_json,
                layout=s["eki_input_layout"],
                center_match=s["eki_center_match"],
                label_unit=s["eki_label_unit"],
            )
            self._annotator = (key, annotator)
        return self._annotator[1]

    def load_dataset(self, split, epoch=1, combine=False, task_cfg=None, **kwargs):
        """fairseq's split, wrapped in :class:`EKIDataset`; ``fairseq-generate`` passes the
        checkpoint's task config (``task_cfg``), whose data settings the model was trained with."""
        try:
            super().load_dataset(split, epoch, combine, **kwargs)
        except FileNotFoundError as e:  # fairseq's "Dataset not found: test (DATA)"
            if not str(e).startswith("Dataset not found"):
                raise
            print(f"error: {missing_split(self.cfg, split)}", file=sys.stderr)
            sys.exit(2)
        s = data_settings(task_cfg, legacy=True) if task_cfg is not None else data_settings(self.cfg)
        ds = EKIDataset(
            self.datasets[split],
            self.src_dict,
            f"{self.cfg.data}:{split}",
            self.cfg.eki_gpt2_encoder_json,
            layout=s["eki_input_layout"],
            center_match=s["eki_center_match"],
            label_unit=s["eki_label_unit"],
        )
        try:
            ds.check_sources()
        except DataError as e:  # before any training: error: DATA:SPLIT:LINE: ..., exit status 2
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        self.datasets[split] = ds

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """The raw ``C <sep> O </s>`` rows: fairseq-interactive keeps only their ``src_tokens``, which
        :meth:`inference_step` puts into the model's input layout."""
        base = super().build_dataset_for_inference(src_tokens, src_lengths, constraints)
        s = data_settings(self.cfg)
        self._inference_dataset = EKIDataset(
            base, self.src_dict, "<inference>", self.cfg.eki_gpt2_encoder_json, layout="sep",
            center_match=s["eki_center_match"], label_unit=s["eki_label_unit"],
        )
        return self._inference_dataset

    def build_bpe(self, args):
        """The ``--bpe`` of fairseq-generate/-interactive, decoding each side of ``<sep>`` apart."""
        bpe = super().build_bpe(args)
        return SeparatorKeepingBPE(bpe) if bpe is not None else None

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        """The parent's generator, with ``<sep>`` stripped from the output strings as EOS is: it
        is in no target, and GPT-2's decoder (``--bpe gpt2``) cannot read it."""
        generator = super().build_generator(
            models, args, seq_gen_cls=seq_gen_cls, extra_gen_cls_kwargs=extra_gen_cls_kwargs, **kwargs
        )
        strip = getattr(generator, "symbols_to_strip_from_output", None) or {self.tgt_dict.eos()}
        generator.symbols_to_strip_from_output = set(strip) | {self.tgt_dict.index(SEPARATOR)}
        return generator

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """A batch without ``src_group`` / ``src_distance`` (fairseq-interactive passes only
        ``src_tokens`` and ``src_lengths``, of ``C <sep> O </s>`` rows) gets them, and its tokens
        in the input layout, with the settings the model was trained with."""
        net = sample["net_input"]
        if "src_group" not in net or "src_distance" not in net:
            tokens, group, distance = self.annotator(models[0] if models else None).annotate_batch(net["src_tokens"])
            net = {**net, "src_tokens": tokens, "src_group": group, "src_distance": distance}
            sample = {**sample, "net_input": net}
        return super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints)

    def get_interactive_tokens_and_lengths(self, lines, encode_fn):
        """fairseq-interactive's raw lines -> token ids: retrieve missing prototypes, then
        tokenize/BPE each side of ``<sep>`` on its own. A bad line (:meth:`input_line_problem`, or
        not UTF-8) gets a placeholder row that :meth:`filter_indices_by_size` leaves out, naming the
        line (:mod:`fairseq_knowgen.compat.interactive_input`); the other lines are decoded."""
        first = self._input_lines_seen + 1
        self._input_lines_seen += len(lines)
        source = interactive_input.current()
        self._refused_lines = {}  # index in this buffer -> (line number, what is wrong)
        for i, line in enumerate(lines):
            problem = source.problem(first + i, line) or self.input_line_problem(line)
            if problem:
                self._refused_lines[i] = (first + i, problem)
        kept = [i for i in range(len(lines)) if i not in self._refused_lines]
        try:
            completed = self.complete_input_lines([lines[i] for i in kept])
        except DataError as e:  # the prototype corpus itself
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        eos = torch.tensor([self.source_dictionary.eos()])
        tokens = [eos] * len(lines)  # a refused line's placeholder, never batched
        for i, line in zip(kept, completed):
            encoded = encode_source(line, encode_fn)
            tokens[i] = self.source_dictionary.encode_line(encoded, add_if_not_exist=False).long()
        return tokens, [t.numel() for t in tokens]

    def input_line_problem(self, line: str) -> Optional[str]:
        """What is wrong with an input line of fairseq-interactive (``concepts <sep> prototype``,
        or with ``--eki-prototype-corpus`` the concepts alone), or None."""
        words = line.split()
        if not words:
            return f"empty line: expected 'concepts {SEPARATOR} prototype'"
        seps = words.count(SEPARATOR)
        if seps > 1:
            return f"{seps} '{SEPARATOR}' in the line: expected 'concepts {SEPARATOR} prototype', one '{SEPARATOR}'"
        if seps == 1 and words[0] == SEPARATOR:
            return f"no concepts before '{SEPARATOR}': expected 'concepts {SEPARATOR} prototype'"
        if seps == 0 and self.cfg.eki_prototype_corpus is None:
            return (
                f"no '{SEPARATOR}': give 'concepts {SEPARATOR} prototype', or --eki-prototype-corpus FILE to "
                "retrieve the prototype of a line of concepts"
            )
        return None

    def get_batch_iterator(self, dataset, max_tokens=None, *args, **kwargs):
        if dataset is getattr(self, "_inference_dataset", None):  # filter_indices_by_size names long lines
            self._inference_max_tokens = max_tokens
        return super().get_batch_iterator(dataset, max_tokens, *args, **kwargs)

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        """fairseq-interactive's lines: the refused ones (:meth:`get_interactive_tokens_and_lengths`) and
        those longer than the model's positions or ``--max-tokens`` are left out, each named by one error
        (fairseq's ``--skip-invalid-size-inputs-valid-test`` leaves the long ones out too, with one
        warning that names no line); other datasets as fairseq filters them."""
        if dataset is not getattr(self, "_inference_dataset", None):
            return super().filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs)
        refused = dict(self._refused_lines)
        first = self._input_lines_seen - len(dataset) + 1

        def source_size(i):
            return int(dataset.size(i)[0])

        indices = np.array([i for i in indices if i not in refused], dtype=np.int64)
        if max_positions is not None:
            indices, too_long = dataset.filter_indices_by_size(indices, max_positions)
            limit = max_positions[0] if isinstance(max_positions, (tuple, list)) else max_positions
            for i in too_long:
                refused[i] = (first + i, f"{source_size(i)} tokens, more than the model's {limit} positions: "
                                         "left out (shorten the line)")  # fmt: skip
        max_tokens = self._inference_max_tokens
        if max_tokens is not None:
            for i in indices:
                if source_size(i) > max_tokens:
                    refused[i] = (first + i, f"{source_size(i)} tokens, more than --max-tokens {max_tokens}: "
                                             "left out (shorten the line or raise --max-tokens)")  # fmt: skip
            indices = np.array([i for i in indices if i not in refused], dtype=np.int64)
        for i in sorted(refused):
            interactive_input.current().refuse(*refused[i])
        return indices

    def complete_input_lines(self, lines: List[str]) -> List[str]:
        """``concepts <sep> prototype`` lines (checked by :meth:`input_line_problem`): lines without
        ``<sep>`` are concept sets whose prototype comes from ``--eki-prototype-corpus``."""
        queries = {n: " ".join(line.split()) for n, line in enumerate(lines) if SEPARATOR not in line.split()}
        if not queries:
            return list(lines)
        found = self.prototype_retriever().retrieve(list(queries.values()))
        out = list(lines)
        for (n, query), (index, _coverage) in zip(queries.items(), found):
            out[n] = f"{query} {SEPARATOR} {self._corpus[index] if index >= 0 else ''}".rstrip()
        return out

    def prototype_retriever(self):
        """The retriever over ``--eki-prototype-corpus``, built on first use, with the corpus
        (and keys) ``scripts/retrieve_prototypes.py`` builds from the same files."""
        if self._retriever is None:
            from ..prep.retrieval import PrototypeRetriever, in_domain_corpus

            path, keys_path = self.cfg.eki_prototype_corpus, self.cfg.eki_prototype_corpus_keys
            keys = None
            if keys_path:
                corpus, keys = in_domain_corpus(*read_parallel(path, keys_path, what="prototype corpus"))
            else:
                corpus = read_lines(path, "prototype corpus")
            self._corpus = corpus
            self._retriever = PrototypeRetriever(corpus, keys)
        return self._retriever
