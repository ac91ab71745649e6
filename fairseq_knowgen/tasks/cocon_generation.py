"""``cocon_generation``: train CoCon on plain text and decode content-conditioned text with
``fairseq-generate`` / ``fairseq-interactive`` (Chan et al., ICLR 2021).

Data folder ``DATA``: ``dict.txt`` (the LM's dictionary: binarize with the LM's ``--srcdict``);
the task appends ``<sep>`` and ``<prompt>`` when absent (never fed to the LM, never generated).

- Training/validation splits: fairseq-preprocess ``--only-source`` output (``SPLIT.bin/.idx``) of
  running text, one paragraph or text a line. With ``--cocon-sample-mode window`` (default, the
  authors' samples) a sample is a window of ``--cocon-window`` (30) tokens inside a line, no
  ``</s>`` in it (:class:`CoConWindowDataset`); its ``target`` is the window, its
  ``prev_output_tokens`` ``</s>`` and the window but its last token. With ``lines`` a sample is a
  line: ``target`` the line and ``</s>``, ``prev_output_tokens`` ``</s>`` and the line (lines
  longer than ``--tokens-per-sample`` are cut, ``</s>`` kept; lines without any word are skipped).
  Either way ``src_tokens`` is the text itself as its content (what decoding a training split
  conditions on, e.g. in the benchmark); the ``cocon`` criterion draws contents from the text.
- Decoding splits: a text file ``DATA/SPLIT.{--cocon-source-suffix}`` (default ``src``), tokenized
  and BPE'd as the LM's data, one input a line::

      content one <sep> content two <prompt> optional prompt words

  Contents are separated by ``<sep>``; what follows ``<prompt>`` is the prompt: the output starts
  with it (fairseq's ``prefix_tokens``, forced per input, so prompts may differ in length) and
  the hypothesis printed by fairseq includes it. ``fairseq-interactive`` reads lines in the same
  format. An input without content stops decoding (``file:line``, exit 2), except with
  ``--cocon-mode lm``.

Decoding flags: ``--cocon-content-bias TAU[,TAU2,...]`` adds tau to the CoCon attention logits
of content k (Section 3, "Strength of Content Conditioning"; one value per content, the last
repeats; default 0 = no bias); ``--cocon-mode lm`` skips the CoCon block: the frozen LM inside the
checkpoint decodes alone (the plain LM from its start symbol, or the prompted LM), with the
same search. Beam search, ``--sampling``, ``--sampling-topk`` and ``--sampling-topp`` all apply.
Use ``--max-len-a 0 --max-len-b N`` (the source is the content, not a text to translate), or
``--cocon-fixed-len N``: every output is its prompt and exactly N more tokens, no ``</s>`` before
them (the authors decode a fixed 50 or 80 tokens with no EOS id): the model bans ``</s>`` per row
before its prompt + N (fairseq's search forces prompts of different lengths up to the batch's
longest and bans ``</s>`` only after it), the search runs to the longest prompt + N, and each
hypothesis is cut to its own prompt + N tokens. The prompt lengths also tell the model where each
row's prompt ends (``net_input["prompt_lengths"]``: Eq. 7's ``dec`` reads the LM's own states
before the prompt's last token).

Training: ``train_step`` hands fairseq's ``update_num`` to the ``cocon`` criterion (``begin_update``), so
that ``--cocon-cycle-start`` / ``--cocon-adv-start`` count updates, and ``optimizer_step`` steps the
criterion's discriminator with its own optimizer after fairseq's step of the block, on the updates where it
learns (``--cocon-disc-update-freq``).
"""

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset, data_utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..models.cocon import PROMPT, SEP, CoConSetupError
from ..textio import DataError, read_lines

logger = logging.getLogger(__name__)

COCON_MODES = ChoiceEnum(["cocon", "lm"])
SAMPLE_MODES = ChoiceEnum(["window", "lines"])


def unwrap(model):
    """The model inside fairseq's DDP / other wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


@dataclass
class CoConGenerationConfig(FairseqDataclass):
    data: Optional[str] = field(default=None, metadata={"help": "data folder: dict.txt, binarized text splits"})
    tokens_per_sample: int = field(
        default=256, metadata={"help": "--cocon-sample-mode lines: longest training line in tokens (longer ones are cut)"}
    )
    cocon_sample_mode: SAMPLE_MODES = field(
        default="window",
        metadata={
            "help": "training samples: window (fixed-length windows of running text, no </s> inside, as the authors) "
            "or lines (each line with its </s>)"
        },
    )
    cocon_window: int = field(
        default=30, metadata={"help": "--cocon-sample-mode window: tokens per window (the authors': 10 + 20)"}
    )
    cocon_source_suffix: str = field(
        default="src", metadata={"help": "decoding inputs are read from DATA/SPLIT.SUFFIX when that file exists"}
    )
    cocon_content_bias: str = field(
        default="0",
        metadata={"help": "tau added to the attention logits of the content (comma list: one per content)"},
    )
    cocon_mode: COCON_MODES = field(
        default="cocon", metadata={"help": "'lm': decode with the frozen LM alone (the CoCon block skipped)"}
    )
    cocon_fixed_len: int = field(
        default=0,
        metadata={
            "help": "N > 0: every output is its prompt and exactly N generated tokens, no </s> before them (the "
            "authors decode a fixed 50 or 80 tokens with no EOS id); 0: fairseq's own stop at </s> within "
            "--max-len-a/--max-len-b"
        },
    )
    seed: int = II("common.seed")


def parse_taus(text: str) -> List[float]:
    try:
        taus = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--cocon-content-bias: expected comma-separated numbers, got {text!r}") from None
    return taus


class _SizedDataset(FairseqDataset):
    """Batching by ``self.sizes`` (tokens per example), shortest first (stable)."""

    def num_tokens(self, index):
        return int(self.sizes[index])

    def num_tokens_vec(self, indices):
        return self.sizes[indices]

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.argsort(self.sizes, kind="mergesort")


class CoConTextDataset(_SizedDataset):
    """Sentences (``w_1 .. w_n </s>``) for training; see the module docstring."""

    def __init__(self, dataset, dictionary: Dictionary, max_len: int):
        self.dataset, self.dictionary, self.max_len = dataset, dictionary, max_len
        raw = np.minimum(np.array(dataset.sizes), max_len)
        self.keep = np.nonzero(raw >= 2)[0]
        self.sizes = raw[self.keep]

    def __len__(self):
        return len(self.keep)

    def __getitem__(self, i):
        t = self.dataset[int(self.keep[i])].long()
        if t.numel() > self.max_len:
            t = torch.cat([t[: self.max_len - 1], t.new_tensor([self.dictionary.eos()])])
        return {"id": i, "text": t}

    def collater(self, samples):
        if not samples:
            return {}
        d = self.dictionary
        texts = [s["text"] for s in samples]
        target = data_utils.collate_tokens(texts, d.pad(), d.eos(), left_pad=False)
        prev = data_utils.collate_tokens(texts, d.pad(), d.eos(), left_pad=False, move_eos_to_beginning=True)
        src = data_utils.collate_tokens([t[:-1] for t in texts], d.pad(), d.eos(), left_pad=False)
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": sum(t.numel() for t in texts),
            "net_input": {
                "src_tokens": src,
                "src_lengths": torch.LongTensor([t.numel() - 1 for t in texts]),
                "prev_output_tokens": prev,
            },
            "target": target,
        }


class CoConWindowDataset(_SizedDataset):
    """Fixed-length windows of running text (the authors' training samples: ``JsonlCoconDataset``
    cuts ``block_size`` = 30 tokens from a random place of each text at least that long).

    Here every line (a paragraph or a text, binarized with its ``</s>``) of n >= W tokens gives
    floor(n / W) non-overlapping windows of W tokens, ``</s>`` never among them; they start at an
    offset drawn in 0..n - floor(n / W) W per line and epoch (``set_epoch``; seeded by ``seed`` and
    the epoch, so a resumed run draws the same), or at 0 when ``fixed`` (validation). A sample's
    ``target`` is the window itself, ``prev_output_tokens`` is ``</s>`` (the LM's start symbol) and
    the window but its last token."""

    def __init__(self, dataset, dictionary: Dictionary, window: int, seed: int = 1, fixed: bool = False):
        self.dataset, self.dictionary, self.window, self.seed, self.fixed = dataset, dictionary, window, seed, fixed
        n = np.array(dataset.sizes) - 1  # tokens before </s>
        per_line = np.where(n >= window, n // max(window, 1), 0)
        self.line = np.repeat(np.arange(len(n)), per_line)  # window -> its line
        self.slot = np.arange(len(self.line)) - np.repeat(np.cumsum(per_line) - per_line, per_line)
        self.slack = n - per_line * window  # free tokens of each line: the offset's range
        self.sizes = np.full(len(self.line), window, dtype=np.int64)
        self.offsets = np.zeros(len(n), dtype=np.int64)
        self.set_epoch(1)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True  # the windows' sizes never change: only their offsets

    def ordered_indices(self):
        """Training windows in a random order (fairseq draws it under its seed), so that a batch mixes
        documents; validation windows in file order."""
        return np.arange(len(self)) if self.fixed else np.random.permutation(len(self))

    def set_epoch(self, epoch):
        if self.fixed:
            return
        rng = np.random.default_rng([self.seed, epoch])
        self.offsets = np.floor(rng.random(len(self.slack)) * (self.slack + 1)).astype(np.int64)

    def __len__(self):
        return len(self.line)

    def __getitem__(self, i):
        line = int(self.line[i])
        start = int(self.offsets[line]) + int(self.slot[i]) * self.window
        return {"id": i, "text": self.dataset[line][start : start + self.window].long()}

    def collater(self, samples):
        if not samples:
            return {}
        d = self.dictionary
        texts = torch.stack([s["text"] for s in samples])
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": texts.numel(),
            "net_input": {
                "src_tokens": texts,
                "src_lengths": torch.full((len(samples),), texts.size(1), dtype=torch.long),
                "prev_output_tokens": torch.cat([texts.new_full((len(samples), 1), d.eos()), texts[:, :-1]], dim=1),
            },
            "target": texts,
        }


class CoConSourceDataset(_SizedDataset):
    """Decoding inputs ``content <sep> content <prompt> prompt`` as token tensors."""

    def __init__(self, sources: List[torch.Tensor], dictionary: Dictionary):
        self.sources, self.dictionary = sources, dictionary
        self.sizes = np.array([max(s.numel(), 1) for s in sources])

    def __len__(self):
        return len(self.sources)

    def __getitem__(self, i):
        return {"id": i, "source": self.sources[i]}

    def collater(self, samples):
        if not samples:
            return {}
        d = self.dictionary
        srcs = [s["source"] if s["source"].numel() else torch.LongTensor([d.pad()]) for s in samples]
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": 0,
            "net_input": {
                "src_tokens": data_utils.collate_tokens(srcs, d.pad(), d.eos(), left_pad=False),
                "src_lengths": torch.LongTensor([s["source"].numel() for s in samples]),
            },
            "target": None,
        }


def fixed_length(hypo, keep: int, eos: int):
    """A hypothesis of fairseq's generator cut to its first ``keep`` tokens and ``</s>`` (whose
    positional score is 0: it was not generated there); its score is the mean of the kept ones."""
    toks = hypo["tokens"]
    if toks.numel() <= keep + 1:
        return hypo
    kept = hypo["positional_scores"][:keep]
    return {
        **hypo,
        "tokens": torch.cat([toks[:keep], toks.new_tensor([eos])]),
        "positional_scores": torch.cat([kept, kept.new_zeros(1)]),
        "score": kept.mean(),
    }


def split_source(tokens: List[int], d: Dictionary):
    """``(content ids with <sep>, prompt ids)`` of one source row (``</s>``, padding dropped)."""
    prompt = d.index(PROMPT)
    toks = [t for t in tokens if t not in (d.pad(), d.eos())]
    if prompt in toks:
        i = toks.index(prompt)
        return toks[:i], [t for t in toks[i + 1 :] if t != prompt]
    return toks, []


def has_content(content: List[int], d: Dictionary) -> bool:
    return any(t != d.index(SEP) for t in content)


@register_task("cocon_generation", dataclass=CoConGenerationConfig)
class CoConGenerationTask(FairseqTask):
    """Content-conditioned LM training and decoding for ``--arch cocon_lm``; see the module docstring."""

    def __init__(self, cfg: CoConGenerationConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.taus = parse_taus(cfg.cocon_content_bias)

    @classmethod
    def load_cocon_dictionary(cls, path: str) -> Dictionary:
        d = Dictionary.load(path)
        for sym in (SEP, PROMPT):
            if sym not in d.indices:
                d.add_symbol(sym)
        return d

    @classmethod
    def setup_task(cls, cfg: CoConGenerationConfig, **kwargs):
        path = os.path.join(cfg.data.split(os.pathsep)[0], "dict.txt")
        if not os.path.isfile(path):
            print(f"error: {path}: dictionary not found (the LM's dict.txt in the data folder)", file=sys.stderr)
            sys.exit(2)
        try:
            parse_taus(cfg.cocon_content_bias)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        return cls(cfg, cls.load_cocon_dictionary(path))

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def max_positions(self):
        return self.cfg.tokens_per_sample

    def encode_sources(self, lines: List[str], path: str = "input") -> List[torch.Tensor]:
        out = []
        for n, line in enumerate(lines, start=1):
            ids = self.dictionary.encode_line(line, add_if_not_exist=False, append_eos=False).long()
            content, _ = split_source(ids.tolist(), self.dictionary)
            if str(self.cfg.cocon_mode) == "cocon" and not has_content(content, self.dictionary):
                raise DataError(path, n, "empty content (write 'content [<sep> content] [<prompt> prompt]')")
            out.append(ids)
        return out

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = self.cfg.data.split(os.pathsep)
        base = os.path.join(paths[(epoch - 1) % len(paths)], split)
        text = f"{base}.{self.cfg.cocon_source_suffix}"
        if os.path.isfile(text):
            try:
                sources = self.encode_sources(read_lines(text, "CoCon input"), text)
            except DataError as e:
                print(f"error: {e}", file=sys.stderr)
                sys.exit(2)
            self.datasets[split] = CoConSourceDataset(sources, self.dictionary)
            return
        data = data_utils.load_indexed_dataset(base, self.dictionary, None)
        if data is None:
            print(f"error: {base}: neither binarized text ({base}.bin) nor decoding inputs ({text})", file=sys.stderr)
            sys.exit(2)
        if str(self.cfg.cocon_sample_mode) == "window":
            windows = CoConWindowDataset(
                data, self.dictionary, self.cfg.cocon_window, self.cfg.seed, fixed=not split.startswith("train")
            )
            if len(windows) == 0:
                print(f"error: {base}: no line of at least --cocon-window {self.cfg.cocon_window} tokens (the "
                      "windows are cut from lines of running text; --cocon-sample-mode lines reads short lines)",
                      file=sys.stderr)
                sys.exit(2)
            self.datasets[split] = windows
            return
        self.datasets[split] = CoConTextDataset(data, self.dictionary, self.cfg.tokens_per_sample)

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq's; decoding inputs are batched with ``required_batch_size_multiple=1`` whatever
        the flag says: this fairseq drops a last batch that is not a multiple of it (default 8),
        and with it inputs, silently."""
        if isinstance(dataset, CoConSourceDataset):
            if len(args) > 4:  # positional: max_tokens, max_sentences, max_positions, ignore_invalid, multiple
                args = (*args[:4], 1, *args[5:])
            else:
                kwargs["required_batch_size_multiple"] = 1
        return super().get_batch_iterator(dataset, *args, **kwargs)

    def build_dataset_for_inference(self, src_tokens, src_lengths, **kwargs):
        """fairseq-interactive: the encoded lines (same format as the decoding files)."""
        for i, t in enumerate(src_tokens):
            content, _ = split_source(t.tolist(), self.dictionary)
            if str(self.cfg.cocon_mode) == "cocon" and not has_content(content, self.dictionary):
                print(f"error: input line {i + 1}: empty content", file=sys.stderr)
                sys.exit(2)
        return CoConSourceDataset([t.long() for t in src_tokens], self.dictionary)

    def build_model(self, cfg, from_checkpoint=False):
        try:
            model = super().build_model(cfg, from_checkpoint)
        except CoConSetupError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        if hasattr(model, "decoder") and hasattr(model.decoder, "embed_dim"):
            self.cocon_embed_dim = model.decoder.embed_dim  # the cocon criterion's discriminator reads states this wide
        if str(self.cfg.cocon_mode) == "lm" and hasattr(model, "decoder") and hasattr(model.decoder, "bypass"):
            model.decoder.bypass = True
        if hasattr(model, "decoder") and hasattr(model.decoder, "min_new_tokens"):
            model.decoder.min_new_tokens = max(self.cfg.cocon_fixed_len, 0)
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        self._criterion = criterion
        if hasattr(criterion, "begin_update"):
            criterion.begin_update(update_num, accumulate=not ignore_grad)
            self.check_gap(unwrap(model), criterion, update_num)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        loss, sample_size, log = super().valid_step(sample, model, criterion)
        if getattr(criterion, "start_after_gap", 0) and "loss_null" in log:
            sums = torch.stack([torch.as_tensor(log[k], dtype=torch.double) for k in ("loss_self", "loss_null")]
                               + [torch.as_tensor(sample_size, dtype=torch.double)]).cpu()
            self._valid_sums = sums if getattr(self, "_valid_sums", None) is None else self._valid_sums + sums
        return loss, sample_size, log

    def check_gap(self, model, criterion, update_num):
        """``--cocon-start-after-gap``: after a validation, the dev gap (L_null - L_self, bits per token, summed
        over the data-parallel ranks) decides whether the cycle and adversarial losses start at this update."""
        sums = getattr(self, "_valid_sums", None)
        if sums is None or not criterion.start_after_gap:
            return
        self._valid_sums = None
        criterion.read_gap_start(model)
        if criterion.gap_reached_at is not None and criterion.gap_reached_at >= 0:
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from fairseq.distributed import utils as distributed_utils

            sums = sums.to(next(model.parameters()).device)
            distributed_utils.all_reduce(sums, group=distributed_utils.get_data_parallel_group())
        l_self, l_null, size = sums.tolist()
        gap = (l_null - l_self) / max(size, 1.0) / math.log(2)
        if gap >= criterion.start_after_gap:
            criterion.gap_reached(model, update_num)
            logger.info(f"dev gap {gap:.3f} bits >= {criterion.start_after_gap}: cycle and adversarial losses from "
                        f"update {update_num}")

    def optimizer_step(self, optimizer, model, update_num):
        """fairseq's step of the block, then the ``cocon`` criterion's discriminator's own step (where it learns)."""
        optimizer.step()
        criterion = getattr(self, "_criterion", None)
        if hasattr(criterion, "step_discriminator"):
            criterion.step_discriminator(optimizer.get_lr())

    def conditioned_sample(self, sample):
        """Split every source row into its contents (the encoder's input) and its prompt
        (``prefix_tokens``, padded; None when no row has one). Stops (exit 2) on an input
        without content, except with ``--cocon-mode lm``."""
        d = self.dictionary
        rows = [split_source(r, d) for r in sample["net_input"]["src_tokens"].tolist()]
        if str(self.cfg.cocon_mode) == "cocon":
            for b, (content, _) in enumerate(rows):
                if not has_content(content, d):
                    which = f"input {sample['id'][b].item()}" if "id" in sample else f"input {b + 1}"
                    print(f"error: {which}: empty content", file=sys.stderr)
                    sys.exit(2)
        dev = sample["net_input"]["src_tokens"].device
        width = max(1, max(len(c) for c, _ in rows))
        src = torch.full((len(rows), width), d.pad(), dtype=torch.long)
        for b, (c, _) in enumerate(rows):
            src[b, : len(c)] = torch.tensor(c, dtype=torch.long)
        prefix = None
        if any(p for _, p in rows):
            prefix = torch.full((len(rows), max(len(p) for _, p in rows)), d.pad(), dtype=torch.long)
            for b, (_, p) in enumerate(rows):
                prefix[b, : len(p)] = torch.tensor(p, dtype=torch.long)
            prefix = prefix.to(dev)
        net_input = {
            "src_tokens": src.to(dev),
            "src_lengths": torch.tensor([len(c) for c, _ in rows], device=dev),
            "content_tau": torch.tensor(self.taus),
        }
        if prefix is not None:  # the upper layers read the LM's own states before each prompt's last token (Eq. 7)
            net_input["prompt_lengths"] = torch.tensor([len(p) for _, p in rows], device=dev)
        return {**sample, "net_input": net_input}, prefix

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        new, prompt = self.conditioned_sample(sample)
        prompt = prompt if prefix_tokens is None else prefix_tokens
        n = self.cfg.cocon_fixed_len
        if n <= 0:
            with torch.no_grad():
                return generator.generate(models, new, prefix_tokens=prompt, constraints=constraints)
        # fixed length: no </s> before each row's prompt + N tokens (the model bans it: build_model), at most the
        # batch's longest prompt + N steps (fairseq's generator has one length per batch), then each row cut to
        # its own prompt + N tokens
        width = 0 if prompt is None else prompt.size(1)
        saved = generator.max_len_a, generator.max_len_b
        generator.max_len_a, generator.max_len_b = 0, width + n
        try:
            with torch.no_grad():
                hypos = generator.generate(models, new, prefix_tokens=prompt, constraints=constraints)
        finally:
            generator.max_len_a, generator.max_len_b = saved
        lengths = [0] * len(hypos) if prompt is None else prompt.ne(self.dictionary.pad()).sum(1).tolist()
        return [[fixed_length(h, lengths[b] + n, self.dictionary.eos()) for h in row] for b, row in enumerate(hypos)]
