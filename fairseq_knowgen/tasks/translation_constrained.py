"""``translation_constrained``: fairseq's ``translation`` with lexical constraints from a file.

For the plain transformer, ``transformer_dimattn``, ``bart_dimattn_*`` and ``copy_transformer*``
models (trained with ``--task translation``; their checkpoints decode with this task as they
are). ``--constraints-from SUFFIX`` makes every split it loads read ``DATA/{split}.{SUFFIX}``
(format in :mod:`fairseq_knowgen.data.constraints`: one line per input, constraints separated by
TABs, tokenized and BPE'd as the target) and put each example's constraints in the batches, so
that ``fairseq-generate --constraints unordered`` forces them into every hypothesis of that
example (e.g. every source entity of WebNLG, every concept of CommonGen)::

    fairseq-generate DATA --user-dir fairseq_knowgen --task translation_constrained \\
        --constraints-from cons --constraints unordered --gen-subset test --path ckpt.pt --beam 5

reads ``DATA/test.cons``. The flag is for decoding: the file must exist for each split loaded
(fairseq-generate loads only ``--gen-subset``). ``fairseq-interactive`` takes constraints from its
input lines instead (``source<TAB>constraint<TAB>...``) and ignores the flag. ``eki_generation``
extends this task, so it has the same flags.

``--at-most-once REGEX`` (a decoding rule, :mod:`fairseq_knowgen.modules.at_most_once`) lets each
target symbol that matches REGEX appear at most once per hypothesis: ``--at-most-once '<ent-\\d+>'``
keeps a WebNLG output from naming an entity twice.

With ``--constraints`` the search is
:class:`~fairseq_knowgen.modules.length_safe_search.LengthSafeConstrainedBeamSearch`: fairseq's
lexically constrained beam search, except that a hypothesis still missing a constraint at the length
limit ends there (logged) instead of stopping the run with ``AssertionError: 200 < 200`` (fairseq
forbids it EOS, and at the limit EOS is all that is left). That happened with a decoding rule that
blocks a constraint's token (``--at-most-once`` on WebNLG dev) and with models that loop on subword
pieces (CommonGen EKI).

Decoding needs room: a hypothesis can only end once it holds every constraint, and fairseq's
search stops with ``AssertionError: N < N`` when the length limit comes first, so
:meth:`TranslationConstrainedTask.inference_step` stops (exit 2) naming the input whose
constraints hold more tokens than ``--max-len-a``/``--max-len-b`` let the decoder write.
"""

import sys
from dataclasses import dataclass, field
from typing import Optional

from fairseq import utils
from fairseq.dataclass import ChoiceEnum
from fairseq.search import LexicallyConstrainedBeamSearch
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..data.constraints import UNK_CHOICES, attach_constraints, constraints_path, token_counts
from ..modules.at_most_once import AtMostOnceBlock, token_ids_matching
from ..modules.length_safe_search import LengthSafeConstrainedBeamSearch
from ..compat.ngram_block import fix_cpu_ngram_blocker
from ..textio import DataError

CONSTRAINTS_UNK = ChoiceEnum(list(UNK_CHOICES))


@dataclass
class TranslationConstrainedConfig(TranslationConfig):
    constraints_from: Optional[str] = field(
        default=None,
        metadata={
            "help": "read the lexical constraints of split S from DATA/S.SUFFIX (one line per input, constraints "
            "separated by TABs, tokenized/BPE'd as the target) for fairseq-generate --constraints unordered|ordered"
        },
    )
    constraints_unk: CONSTRAINTS_UNK = field(
        default="error",
        metadata={
            "help": "a constraint with a token outside the target dictionary: 'error' (stop, naming file:line) or "
            "'drop' (leave that constraint out)"
        },
    )

    at_most_once: Optional[str] = field(
        default=None,
        metadata={
            "help": "decoding: every target symbol matching this regular expression (whole symbol) appears at most "
            "once in a hypothesis, e.g. '<ent-\\d+>' (each WebNLG entity named once)"
        },
    )


@register_task("translation_constrained", dataclass=TranslationConstrainedConfig)
class TranslationConstrainedTask(TranslationTask):
    """fairseq's translation task whose datasets carry lexical constraints read from
    ``DATA/{split}.{--constraints-from}``."""

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch, combine, **kwargs)
        if self.cfg.constraints_from:
            paths = utils.split_paths(self.cfg.data)
            path = constraints_path(paths[(epoch - 1) % len(paths)], split, self.cfg.constraints_from)
            try:
                attach_constraints(
                    self.datasets[split], path, self.tgt_dict, split=split, unk=str(self.cfg.constraints_unk)
                )
            except DataError as e:
                print(f"error: {e}", file=sys.stderr)
                sys.exit(2)

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        """fairseq's generator; with ``--constraints-from``, stops (exit 2) unless the search is
        constrained (``--constraints``): a plain beam search refuses batches with constraints."""
        if self.cfg.constraints_from and not getattr(args, "constraints", None):
            print(
                f"error: --constraints-from {self.cfg.constraints_from} puts lexical constraints in every batch: "
                "decode with --constraints unordered (or ordered)",
                file=sys.stderr,
            )
            sys.exit(2)
        generator = super().build_generator(
            models, args, seq_gen_cls=seq_gen_cls, extra_gen_cls_kwargs=extra_gen_cls_kwargs, **kwargs
        )
        fix_cpu_ngram_blocker(generator)  # --no-repeat-ngram-size: fairseq's CPU path blocks nothing (compat.ngram_block)
        if self.cfg.at_most_once:
            ids = token_ids_matching(self.tgt_dict, self.cfg.at_most_once)
            if ids.numel() == 0:
                print(f"error: --at-most-once {self.cfg.at_most_once!r} matches no target symbol", file=sys.stderr)
                sys.exit(2)
            generator.repeat_ngram_blocker = AtMostOnceBlock(ids, generator.repeat_ngram_blocker)
        if isinstance(getattr(generator, "search", None), LexicallyConstrainedBeamSearch):
            generator.search = LengthSafeConstrainedBeamSearch(self.target_dictionary, args.constraints)
        return generator

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """fairseq's step, after checking that each input's constraints fit in the length the
        generator allows its batch (``min(a * source width + b, max positions - 1)``, as
        ``SequenceGenerator`` computes it)."""
        if constraints is not None and all(hasattr(generator, a) for a in ("max_len_a", "max_len_b", "max_len")):
            width = sample["net_input"]["src_tokens"].size(1)
            limit = min(int(generator.max_len_a * width + generator.max_len_b), generator.max_len - 1)
            counts = token_counts(constraints)
            over = counts.gt(limit).nonzero().flatten().tolist()
            if over:
                b = over[0]
                # fairseq-interactive's batches carry no ids
                which = f"input {sample['id'][b].item()}" if "id" in sample else "an input"
                print(
                    f"error: {which}: its constraints hold {counts[b].item()} tokens, more than "
                    f"the {limit} the decoder may write in its batch (--max-len-a {generator.max_len_a} x source "
                    f"width {width} + --max-len-b {generator.max_len_b}, below the model's {generator.max_len} "
                    "positions): raise --max-len-b",
                    file=sys.stderr,
                )
                sys.exit(2)
        hypos = super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints)
        if isinstance(getattr(generator, "search", None), LengthSafeConstrainedBeamSearch):
            generator.search.log_unmet_at_limit()  # after the batch: reading its count is a host sync
        return hypos
