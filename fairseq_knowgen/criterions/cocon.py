"""``cocon``: the four self-supervised losses of CoCon (Chan et al., "CoCon: A Self-Supervised Approach for
Controlled Text Generation", ICLR 2021, Section 3.1), each weighted by a flag and logged on its own::

    L = w_self L_self + w_null L_null + w_cycle L_cycle + w_adv L_adv (+ w_disc L_disc)

(Section 3.1, "Full Training": "the four losses combined"). The seed text numbers equations up to
Eq. 7 (Section 3) and displays none of Section 3.1, so the losses are cited by their paragraph.

For ``--arch cocon_lm`` with ``--task cocon_generation``. A sentence is ``x = x_1 .. x_n </s>``.

- **Split** (``L_self``, ``L_null``, ``L_adv``'s real side), ``--cocon-split``:

  - ``fixed`` (default; the authors' scheme, ``traininfer_cocon.py`` with ``train_cocon.sh``'s
    ``--min/max_hs_tis_split_offset -2/2``): per sentence an offset d ~ Uniform{-J, .., J}
    (J = ``--cocon-len-jitter``), the prefix x^a = x_1..x_t with t = P + d and the content x^b =
    x_{t+1}..x_{t+m} with m = C - d (P = ``--cocon-prefix-len``, C = ``--cocon-content-len``), so
    that the distance from a step to its content column is nearly constant and position can guide
    the lookup. A sentence shorter than t + ``--cocon-min-content`` gets a shorter prefix (t =
    n - min_content, at least 0); m is cut at the sentence end and at ``--cocon-max-content``.
    L_self and L_null are computed on x^b (and ``</s>`` when x^b reaches the end), as the authors
    compute them on the transformed span only. (The authors draw d once per batch; here once per
    sentence, which needs no padding either.)
  - ``uniform`` (this package's first version): t ~ Uniform{a, .., n - m} with a =
    ``--cocon-min-prefix`` (x^a may be empty, as when decoding from the start symbol) and m =
    ``--cocon-min-content``; x^b = x_{t+1}..x_n </s>, all of it in the losses; the content is x^b
    without ``</s>`` cut at ``--cocon-max-content`` tokens (its first ones). Only induction-like
    matching tells a step which column to read: in a toy probe (see
    :mod:`fairseq_knowgen.modules.cocon_block`) the self/null gap fell from 0.96 (fixed) to 0.18.

  Split points are drawn on the model's device (no host-device sync); validation draws them from
  a generator seeded by the batch, so that every validation sees the same splits.
- **Self-reconstruction** ("Self Reconstruction Loss": "c = x^b, and what is generated is x^b
  itself"): ``L_self = -sum_{i in x^b} log p(x_i | c = x^b, x_<i)``. Which content columns a
  step sees is ``--cocon-self-mask`` (the paper's "content masking", named in its introduction;
  the seed text gives no details):

  - ``aligned`` (default; the authors' ``--self_token_mask_prob 1``): the step predicting x^b_j
    does not see content position j in the block (its column gets -inf), so the block cannot
    just copy the token it is asked for. This hides column j *at the block only*: content states
    come from the LM run on c alone, causally, so later columns j' > j still carry c_j, and the
    frozen upper layers read h' of the earlier positions, which did see column j (perturbing
    column j moves that step's logits). What the mask removes is the direct path from the target
    token's own column to its prediction.
  - ``random``: each content column of a sentence is hidden from all its steps with probability
    ``--cocon-self-mask-prob`` (at least one column stays visible), so the aligned column is seen
    in part of the sentences (copying is rewarded) and missing in the others (the block also
    learns to generate without it).
  - ``none``: every step sees the whole content.

  (``1``/``0`` are read as ``aligned``/``none``: checkpoints of earlier versions.)
- **Null content** ("Null Content Loss", c = null): the same positions with c = nothing: the block
  attends over the causal self part only (no content keys at all).
- **Cycle reconstruction** ("Cycle Reconstruction Loss": q^1 = f(p', c = q), q^2 = f(p, q^1), q^2
  trained towards q), from ``--cocon-cycle-start`` updates on (default 2,000, the authors'): with
  one split t_c for the batch (so prefixes need no padding; drawn on the host from the shapes
  alone: P + d for ``fixed``, shortened to leave ``--cocon-min-content`` tokens in the batch's
  padded width, uniform over that width for ``uniform``), x = [p; q] and x' =
  [p'; q'] (x' = the previous sentence of the batch, cyclically: row b takes p' from row b - 1; on
  the batch's first ``--cocon-cycle-sentences`` sentences only, as its cost grows with sentences x
  vocabulary; rows too short for t_c, or whose p' is, take no part), q^1 = f(p', c = q) is
  generated for ``--cocon-cycle-steps`` steps (default 20, the authors') as *soft* tokens: step s
  feeds back y_s = softmax(o_s / T) (``--cocon-cycle-soft softmax``, T =
  ``--cocon-cycle-temperature``) or a Gumbel-softmax sample (``gumbel``) through the embedding
  matrix (y_s E), incrementally; then ``L_cycle = -sum_{i in q} log p(q_i | c = q^1, p, q_<i)``,
  the content q^1 entering as the soft embeddings y E. Its gradient reaches the CoCon block
  through both passes (the frozen LM only passes it on).
- **Adversarial** ("Adversarial Loss": "make the generated text closer to real text"), from
  ``--cocon-adv-start`` updates on (default 2,000): the discriminator
  (:mod:`~fairseq_knowgen.modules.cocon_discriminator`, in the model) tells the frozen LM's
  lower-layer states of real text (the x^b positions of the cycle's sentences: "real") from
  the CoCon block's states while it generates the cycle's q^1 ("fake", ``--cocon-adv-fake
  generated``, the paper's and the authors' choice; q^1 is generated whenever L_adv is on, even
  with L_cycle off). ``--cocon-adv-fake teacher-forced`` takes instead the block's states of the
  x^b positions in the self-reconstruction pass (this package's first version: the
  discriminator's only signal is then h' - h, so L_adv penalises exactly the use of content).
  ``L_disc`` (weight ``--cocon-disc-weight``) reaches only the discriminator (detached states);
  ``L_adv`` (non-saturating, weight ``--cocon-adv-weight``) reaches only CoCon (discriminator run
  with detached parameters). Schedule: the discriminator learns every ``--cocon-disc-update-freq``
  updates (default 5, the authors' ``--disc_update_interval``), by the same fairseq optimizer as
  the block (same optimizer kind and lr schedule, and so the same DDP all-reduce), on its own
  loss only; on the other updates it gets no optimizer step at all (the ``cocon_generation``
  task's ``optimizer_step`` holds its parameters and optimizer state, see
  :func:`fairseq_knowgen.optim_utils.no_optimizer_step`), and L_adv still trains the block. Both
  adversarial losses are means over sentences, scaled by tokens per sentence so that after
  fairseq's division by the sample size they weigh as w x mean BCE.
- **Content bag-of-words** (beyond the paper, off by default: ``--cocon-bow-weight``): on the
  self-reconstruction pass, each step predicting x^b_j also gets
  ``-log sum_{w in bag_j} p(w | c = x^b, x_<i)``, bag_j = the distinct tokens of the content
  columns k >= j that the step may see (the aligned mask hides k = j, so then k > j; padding and
  ``</s>`` excluded; a step with an empty bag adds nothing). It rewards putting mass on *any*
  content token not yet reached, which needs the content but no alignment: a block that reads its
  content uniformly and copies token identities lowers it, without the induction-like matching
  (which column follows the current token?) that L_self asks for. After the bag-of-words
  objective of PPLM (Dathathri et al., 2020), which the paper compares against; here a training
  loss, not a decoding-time update. Logged as ``loss_bow`` (bits per step with a bag); it is
  summed over those steps and divided by fairseq's sample size (every x^b step), so its weight
  per step with a bag grows with the share of such steps.

Validation's loss is L_self + L_null only (checkpoints are picked by the paper's losses; L_bow is
logged there too when weighted). Counting is by fairseq's ``update_num`` (the task's
``train_step`` calls :meth:`CoConCriterion.set_update_num`), never by steps within an epoch.
The losses are logged as tensors (fairseq reads them at its logging interval) and the sample
size is a tensor: a training step makes no host-device sync of its own.
"""

import functools
import math
from typing import Optional
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..modules.cocon_discriminator import (
    ADV_LOSSES,
    DISCRIMINATORS,
    build_discriminator,
    discriminator_loss,
    generator_loss,
)
from ..optim.discriminator_optimizer import DiscriminatorOptimizer

SOFT_CHOICES = ChoiceEnum(["softmax", "gumbel"])
# "generated": the name of "block" in checkpoints saved before "text" existed
ADV_FAKE_CHOICES = ChoiceEnum(["text", "block", "teacher-forced", "generated"])
ADV_LOSS_CHOICES = ChoiceEnum(list(ADV_LOSSES))
SPLIT_CHOICES = ChoiceEnum(["fixed", "uniform"])
DISC_CHOICES = ChoiceEnum(list(DISCRIMINATORS))

SELF_MASKS = ("aligned", "random", "none")
LEGACY_SELF_MASKS = {"1": "aligned", "0": "none"}
# fairseq's argparse refuses any other value on the command line (exit 2); "1"/"0": earlier versions' values
SELF_MASK_CHOICES = ChoiceEnum([*SELF_MASKS, *LEGACY_SELF_MASKS])


@dataclass
class CoConCriterionConfig(FairseqDataclass):
    cocon_self_weight: float = field(
        default=1.0, metadata={"help": "weight of L_self (Section 3.1, Self Reconstruction Loss)"}
    )
    cocon_null_weight: float = field(
        default=1.0, metadata={"help": "weight of L_null (Section 3.1, Null Content Loss); 0 = ablation"}
    )
    cocon_cycle_weight: float = field(
        default=1.0, metadata={"help": "weight of L_cycle (Section 3.1, Cycle Reconstruction Loss); 0 = ablation"}
    )
    cocon_adv_weight: float = field(
        default=1.0,
        metadata={
            "help": "weight of the generator-side L_adv (Section 3.1, Adversarial Loss); 0 = ablation (no D either)"
        },
    )
    cocon_disc_weight: float = field(
        default=1.0, metadata={"help": "weight of the discriminator's loss (the other side of L_adv)"}
    )
    cocon_cycle_start: int = field(default=2000, metadata={"help": "updates before L_cycle starts (authors: 2000)"})
    cocon_adv_start: int = field(default=2000, metadata={"help": "updates before L_adv/L_disc start (authors: 2000)"})
    cocon_start_after_gap: float = field(
        default=0.0,
        metadata={
            "help": "BITS > 0: L_cycle and L_adv start instead at the first update after a validation whose dev gap "
            "L_null - L_self reaches BITS per token (the block reads its content); 0: at --cocon-cycle-start / "
            "--cocon-adv-start"
        },
    )
    cocon_cycle_steps: int = field(
        default=20, metadata={"help": "length of the soft q^1 of the cycle (authors: 20)"}
    )
    cocon_cycle_soft: SOFT_CHOICES = field(
        default="softmax", metadata={"help": "soft token fed back: softmax(o/T), or a Gumbel-softmax sample"}
    )
    cocon_cycle_temperature: float = field(default=1.0, metadata={"help": "T of the soft tokens"})
    cocon_cycle_detach_interval: int = field(
        default=1,
        metadata={
            "help": "while q^1 is generated, the lower-layer state fed back into the block is detached every N "
            "steps (1: at every step, the authors' --train_cycle_detach_interval; 0: never, the gradient runs "
            "through the whole generated chain)"
        },
    )
    cocon_cycle_sentences: int = field(
        default=16,
        metadata={
            "help": "the cycle runs on the batch's first N samples (the authors' cycle batch: 16; its cost grows "
            "with N x vocab)"
        },
    )
    cocon_disc_update_freq: int = field(
        default=5,
        metadata={"help": "the discriminator learns every K updates (the authors' --disc_update_interval 5)"},
    )
    cocon_disc: Optional[DISC_CHOICES] = field(
        default=None,
        metadata={
            "help": "the discriminator: cnn (the authors': convolutions of widths 1-3, max-pooled) or mlp (a "
            "position-wise MLP, mean-pooled); default cnn"
        },
    )
    cocon_disc_dim: Optional[int] = field(
        default=None,
        metadata={"help": "channels per convolution (cnn) or hidden size (mlp); default 128 (cocon_lm_small: 64)"},
    )
    cocon_disc_lr: float = field(
        default=0.0,
        metadata={"help": "the discriminator's own AdamW learning rate; 0: the block's at each update (the authors')"},
    )
    cocon_disc_clip_norm: float = field(
        default=1.0, metadata={"help": "the discriminator's own gradient clip (the authors': 1.0); 0: none"}
    )
    cocon_adv_fake: ADV_FAKE_CHOICES = field(
        default="text",
        metadata={
            "help": "the discriminator's fake side: text (the LM's own states of the generated q^1, as the "
            "authors' --adv_use_th_gen_output), block (the block's states while it generates q^1: the authors' "
            "default) or teacher-forced (the block's states on the real text)"
        },
    )
    cocon_adv_loss: ADV_LOSS_CHOICES = field(
        default="minimax",
        metadata={
            "help": "CoCon's side of the adversarial loss: minimax (log(1 - D(fake)), the authors') or "
            "non-saturating (-log D(fake))"
        },
    )
    cocon_split: SPLIT_CHOICES = field(
        default="fixed",
        metadata={
            "help": "fixed: prefix P+d, content C-d tokens, d ~ U{-J..J} (the authors'); uniform: the split point "
            "uniform over the sentence"
        },
    )
    cocon_prefix_len: int = field(default=10, metadata={"help": "--cocon-split fixed: P, the prefix length"})
    cocon_content_len: int = field(default=20, metadata={"help": "--cocon-split fixed: C, the content length"})
    cocon_len_jitter: int = field(default=2, metadata={"help": "--cocon-split fixed: J, the range of the offset d"})
    cocon_self_mask: SELF_MASK_CHOICES = field(
        default="aligned",
        metadata={
            "help": "content columns hidden in L_self: aligned (the step predicting x^b_j does not see content j), "
            "random (each column hidden with --cocon-self-mask-prob), none"
        },
    )
    cocon_self_mask_prob: float = field(
        default=0.5, metadata={"help": "--cocon-self-mask random: probability that a content column is hidden"}
    )
    cocon_bow_weight: float = field(
        default=0.0,
        metadata={
            "help": "weight of the content bag-of-words loss on the self-reconstruction pass (beyond the paper; "
            "0 = off): -log of the mass on the visible content tokens not yet reached"
        },
    )
    cocon_min_prefix: int = field(default=0, metadata={"help": "--cocon-split uniform: shortest x^a (tokens)"})
    cocon_min_content: int = field(
        default=5, metadata={"help": "shortest content (tokens; shorter sentences give all their words)"}
    )
    cocon_max_content: int = field(default=32, metadata={"help": "longest content: x^b cut here"})


def sample_splits(n_words: torch.Tensor, min_prefix: int, min_content: int, generator=None) -> torch.Tensor:
    """``--cocon-split uniform``: t per sentence, uniform over {a, .., n - m} (clamped into
    [0, n - 1] for short sentences); drawn on ``n_words``' device."""
    hi = (n_words - min_content).clamp(min=0)
    lo = hi.clamp(max=min_prefix)
    r = torch.rand(n_words.shape, generator=generator, device=n_words.device)
    return (lo + (r * (hi - lo + 1).float()).floor().long()).clamp(max=(n_words - 1).clamp(min=0))


def sample_fixed_splits(
    n_words: torch.Tensor,
    prefix_len: int,
    content_len: int,
    jitter: int,
    min_content: int,
    max_content: int,
    generator=None,
):
    """``--cocon-split fixed`` (the authors'): per sentence d ~ U{-J..J}, t = P + d (shortened to
    n - min_content, at least 0), content length m = min(C - d, n - t, max_content). Returns
    ``(t, m)``, drawn on ``n_words``' device."""
    d = torch.randint(-jitter, jitter + 1, n_words.shape, generator=generator, device=n_words.device)
    t = torch.minimum(prefix_len + d, (n_words - min_content).clamp(min=0)).clamp(min=0)
    m = torch.minimum(content_len - d, n_words - t).clamp(min=0, max=max_content)
    return t, m


def gather_spans(tokens: torch.Tensor, start: torch.Tensor, length: torch.Tensor, pad: int, width: int) -> torch.Tensor:
    """``B x width``: tokens[b, start_b : start_b + length_b], right-padded (``width`` >= every
    length, known on the host: no sync)."""
    ar = torch.arange(max(width, 1), device=tokens.device)
    idx = (start[:, None] + ar[None]).clamp(max=tokens.size(1) - 1)
    out = tokens.gather(1, idx)
    return out.masked_fill(ar[None] >= length[:, None], pad)


def span_mask(T: int, start: torch.Tensor, length: torch.Tensor, n_words: torch.Tensor) -> torch.Tensor:
    """``B x T`` bool: target positions start .. start + length - 1, and ``</s>`` (position n)
    when the span reaches the sentence's end."""
    pos = torch.arange(T, device=start.device)[None]
    end = start + length
    end = end + (end == n_words).long()
    return (pos >= start[:, None]) & (pos < end[:, None])


def count_words(target: torch.Tensor, pad: int, eos: int) -> torch.Tensor:
    """Tokens of each right-padded row before its ``</s>``: a sentence line ends in ``</s>``
    (position n then holds it), a window of running text has none (n = its length, and position n
    lies past the row, so no mask ever reaches a padding position)."""
    lengths = target.ne(pad).sum(1)
    last = target.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
    return lengths - last.eq(eos).long()


def ratio(num, den):
    """num / max(den, 1) for numbers or tensors, without a host-device sync."""
    return num / (den.clamp(min=1) if torch.is_tensor(den) else max(den, 1))


@register_criterion("cocon", dataclass=CoConCriterionConfig)
class CoConCriterion(FairseqCriterion):
    """CoCon's training losses; see the module docstring."""

    def __init__(
        self,
        task,
        cocon_self_weight=1.0,
        cocon_null_weight=1.0,
        cocon_cycle_weight=1.0,
        cocon_adv_weight=1.0,
        cocon_disc_weight=1.0,
        cocon_cycle_start=2000,
        cocon_adv_start=2000,
        cocon_start_after_gap=0.0,
        cocon_cycle_steps=20,
        cocon_cycle_soft="softmax",
        cocon_cycle_temperature=1.0,
        cocon_cycle_detach_interval=1,
        cocon_cycle_sentences=16,
        cocon_disc_update_freq=5,
        cocon_disc=None,
        cocon_disc_dim=None,
        cocon_disc_lr=0.0,
        cocon_disc_clip_norm=1.0,
        cocon_adv_fake="text",
        cocon_adv_loss="minimax",
        cocon_split="fixed",
        cocon_prefix_len=10,
        cocon_content_len=20,
        cocon_len_jitter=2,
        cocon_self_mask="aligned",
        cocon_self_mask_prob=0.5,
        cocon_bow_weight=0.0,
        cocon_min_prefix=0,
        cocon_min_content=5,
        cocon_max_content=32,
    ):
        super().__init__(task)
        self.w_self, self.w_null, self.w_cycle = cocon_self_weight, cocon_null_weight, cocon_cycle_weight
        self.w_adv, self.w_disc = cocon_adv_weight, cocon_disc_weight
        self.cycle_start, self.adv_start = cocon_cycle_start, cocon_adv_start
        if cocon_start_after_gap < 0:
            raise ValueError("--cocon-start-after-gap must be >= 0 (bits per token)")
        self.start_after_gap = float(cocon_start_after_gap)
        self.gap_reached_at = None  # --cocon-start-after-gap: the update it was reached at (read from the model)
        self.cycle_steps = cocon_cycle_steps
        self.cycle_soft, self.cycle_temperature = str(cocon_cycle_soft), cocon_cycle_temperature
        self.cycle_sentences = max(2, cocon_cycle_sentences)
        self.cycle_detach_interval = max(0, cocon_cycle_detach_interval)
        self.disc_update_freq = max(1, cocon_disc_update_freq)
        self.adv_fake = "block" if str(cocon_adv_fake) == "generated" else str(cocon_adv_fake)
        self.adv_loss = str(cocon_adv_loss)
        self.split = str(cocon_split)
        self.prefix_len, self.content_len, self.len_jitter = cocon_prefix_len, cocon_content_len, cocon_len_jitter
        if self.split == "fixed" and not (0 <= self.len_jitter < self.content_len and self.len_jitter <= self.prefix_len):
            raise ValueError("--cocon-split fixed needs 0 <= --cocon-len-jitter < --cocon-content-len and <= --cocon-prefix-len")
        mode = LEGACY_SELF_MASKS.get(str(cocon_self_mask), str(cocon_self_mask))
        if mode not in SELF_MASKS:
            raise ValueError(f"--cocon-self-mask {cocon_self_mask!r}: choose one of {', '.join(SELF_MASKS)}")
        if mode == "random" and not 0.0 <= cocon_self_mask_prob < 1.0:
            raise ValueError("--cocon-self-mask-prob must be in [0, 1)")
        self.self_mask, self.self_mask_prob = mode, float(cocon_self_mask_prob)
        if cocon_bow_weight < 0:
            raise ValueError("--cocon-bow-weight must be >= 0")
        self.w_bow = float(cocon_bow_weight)
        dictionary = getattr(task, "target_dictionary", None)
        self.eos_idx = dictionary.eos() if dictionary is not None else -1
        self.min_prefix, self.min_content, self.max_content = cocon_min_prefix, cocon_min_content, cocon_max_content
        if self.min_content < 1 or self.max_content < self.min_content:
            raise ValueError("need 1 <= --cocon-min-content <= --cocon-max-content")
        self.update_num = 0
        self.learn_discriminator = False
        # the discriminator and its own optimizer (only when L_adv is on: a configuration builds what it uses)
        self.discriminator = None
        if self.w_adv:
            dim = getattr(task, "cocon_embed_dim", None)
            if dim is None:
                raise ValueError("the cocon criterion needs the model's width: build the model with the task first")
            disc = build_discriminator(str(cocon_disc or "cnn"), dim, cocon_disc_dim or 128)
            self.discriminator = DiscriminatorOptimizer(disc, lr=cocon_disc_lr or None, clip_norm=cocon_disc_clip_norm)

    def load_state_dict(self, state_dict, strict: bool = True):
        """fairseq restores the criterion's state (the discriminator and its optimizer's) on resume; a checkpoint
        saved when the discriminator was a part of the model has none: the discriminator then starts afresh."""
        if state_dict is None:
            return None
        return super().load_state_dict(state_dict, strict)

    def begin_update(self, update_num: int, accumulate: bool = True):
        """Called by the ``cocon_generation`` task before each batch of update ``update_num``: the schedule counts
        fairseq's updates; the discriminator's gradients of this update are kept unless ``accumulate`` is False (a
        dummy batch of distributed training)."""
        if self.discriminator is not None and int(update_num) != self.update_num:
            self.discriminator.begin_update()
        self.update_num = int(update_num)
        self.learn_discriminator = accumulate and self.discriminator_learns()

    def set_update_num(self, update_num: int):
        self.begin_update(update_num)

    def adversarial_on(self) -> bool:
        """Whether L_adv takes part in this training update."""
        return self.discriminator is not None and self.update_num >= self.start("adv")

    def start(self, loss: str) -> float:
        """The first update of L_cycle (``loss`` = "cycle") or of L_adv ("adv"): the fixed ones, or with
        ``--cocon-start-after-gap`` the update after the validation that showed the gap (never before it)."""
        if self.start_after_gap:
            return math.inf if self.gap_reached_at is None or self.gap_reached_at < 0 else self.gap_reached_at
        return self.cycle_start if loss == "cycle" else self.adv_start

    def read_gap_start(self, model):
        """The update at which ``--cocon-start-after-gap``'s gap was reached, kept in the model's buffer
        ``decoder.gap_reached_at`` (-1: not yet) so that a resumed run keeps it; read once (a host-device sync)."""
        if self.start_after_gap and self.gap_reached_at is None:
            self.gap_reached_at = int(model.decoder.gap_reached_at)

    def gap_reached(self, model, update_num: int):
        """Record that the dev gap reached ``--cocon-start-after-gap`` before update ``update_num``."""
        model.decoder.gap_reached_at.fill_(update_num)
        self.gap_reached_at = update_num

    def discriminator_learns(self) -> bool:
        """Whether the discriminator learns in this update (every ``--cocon-disc-update-freq`` updates once L_adv
        is on)."""
        return self.adversarial_on() and bool(self.w_disc) and self.update_num % self.disc_update_freq == 0

    def step_discriminator(self, lr: float) -> bool:
        """The discriminator's own optimizer step, after fairseq's step of the block (the task calls it)."""
        return self.discriminator is not None and self.discriminator.step(lr)

    def content_width(self) -> int:
        """The widest content any split can give (host-known: spans are padded to it)."""
        if self.split == "fixed":
            return min(self.content_len + self.len_jitter, self.max_content)
        return self.max_content

    def draw_splits(self, n_words, T, generator=None):
        """``(t, content length, loss mask B x T)`` of the split scheme (module docstring)."""
        if self.split == "fixed":
            t, m = sample_fixed_splits(
                n_words, self.prefix_len, self.content_len, self.len_jitter, self.min_content, self.max_content, generator
            )
            return t, m, span_mask(T, t, m, n_words)
        t = sample_splits(n_words, self.min_prefix, self.min_content, generator)
        m = torch.minimum(n_words - t, torch.full_like(t, self.max_content))
        pos = torch.arange(T, device=n_words.device)[None]
        return t, m, (pos >= t[:, None]) & (pos <= n_words[:, None])

    # -- pieces, each usable on its own in tests ----------------------------------------------
    def logits(self, dec, h, pad_mask):
        """``B x T x V`` float logits of the upper layers on block output states ``h`` (``T x B x C``)."""
        return dec.lm_logits(dec.upper(h, None, pad_mask)).float()

    def nll(self, dec, h, pad_mask, target, loss_mask, logits=None):
        """Summed NLL of ``target`` where ``loss_mask`` from block output states ``h`` (or from ``logits``)."""
        logits = self.logits(dec, h, pad_mask) if logits is None else logits
        nll = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        return (nll * loss_mask).sum()

    def content_bags(self, content, t, T, qmask):
        """``B x T x L`` bool: content column k is in the bag of query position p (it predicts x^b_j,
        j = p - t) when k >= j, the query may see k (``qmask``), c_k is neither padding nor ``</s>``,
        and no earlier column of the same bag holds the same token (each token counted once)."""
        B, L = content.shape
        k = torch.arange(L, device=content.device)
        j = torch.arange(T, device=content.device)[None, :] - t[:, None]  # B x T
        real = content.ne(self.padding_idx) & content.ne(self.eos_idx)
        bag = (k[None, None, :] >= j[:, :, None]) & real[:, None, :]
        if qmask is not None:
            bag = bag & ~qmask
        earlier_same = content[:, :, None].eq(content[:, None, :]) & (k[None, :] < k[:, None])  # B x L(k) x L(k')
        dup = (bag[:, :, None, :] & earlier_same[:, None]).any(-1)
        return bag & ~dup

    def bow_loss(self, logits, content, t, qmask, loss_mask):
        """Content bag-of-words loss (module docstring), summed, and the number of steps it covers."""
        B, T, _ = logits.shape
        bag = self.content_bags(content, t, T, qmask)
        # log p of the content tokens only (B x T x L): no second B x T x V log_softmax
        g = logits.gather(2, content[:, None, :].expand(B, T, content.size(1))) - logits.logsumexp(-1, keepdim=True)
        mass = torch.logsumexp(g.masked_fill(~bag, float("-inf")), dim=-1)  # B x T
        steps = loss_mask & bag.any(-1)
        return -(mass.masked_fill(~steps, 0.0)).sum(), steps.sum()

    def self_content(self, dec, target, t, length, generator=None):
        """The content x^b (``B x L``: ``length`` tokens from position t), its lower-layer states and
        padding mask, and the per-query mask of the self-reconstruction (``B x T x L``, True =
        hidden; ``None`` for ``none``): ``aligned``: query p never sees content p - t; ``random``:
        the same random columns hidden from every query of a sentence (``generator``: on the
        model's device, for validation)."""
        pad = self.padding_idx
        content = gather_spans(target, t, length, pad, self.content_width())
        states, cpad = dec.encode_content_tensor(content)
        T, L = target.size(1), content.size(1)
        qmask = None
        if self.self_mask == "aligned":
            j = torch.arange(T, device=target.device)[None, :] - t[:, None]  # B x T: content index j
            qmask = j[:, :, None].eq(torch.arange(L, device=target.device)[None, None, :])
        elif self.self_mask == "random":
            hide = torch.rand(content.shape, generator=generator, device=target.device) < self.self_mask_prob
            hide = hide & content.ne(self.padding_idx)
            # at least one real column stays visible: the first one of each sentence, when all are hidden
            all_hidden = (hide | content.eq(self.padding_idx)).all(1)
            hide[:, 0] &= ~all_hidden
            qmask = hide[:, None, :].expand(-1, T, -1)
        return content, states, cpad, qmask

    def soft_tokens(self, logits):
        if self.cycle_soft == "gumbel":
            return F.gumbel_softmax(logits.float(), tau=self.cycle_temperature, hard=False).to(logits.dtype)
        return F.softmax(logits.float() / self.cycle_temperature, dim=-1).to(logits.dtype)

    def generate_soft(self, dec, prefix_inputs, content_states, content_pad):
        """q^1 = f(p', c = q) as soft tokens (Cycle Reconstruction Loss): ``B x steps x V``
        distributions, generated incrementally after the prefix inputs (``</s> p'``, no padding), and
        the adversarial loss's fake side (``B x steps x C``): with ``--cocon-adv-fake text`` the LM's
        lower-layer states of the generated soft tokens (their gradient reaches the block through the
        soft tokens), with ``block`` the block's states that generated them (at the prefix's last
        position and at each fed-back step)."""
        inc = {}
        h, _ = dec.lower(prefix_inputs, inc, new=prefix_inputs.size(1))  # the whole prefix at once
        h_block, _ = dec.block(h, content_states, content_pad, None, incremental_state=inc)
        states = [] if self.adv_fake == "text" else [h_block[-1:]]
        # Eq. 7: the LM's own states before the prefix's last token
        feats = dec.upper(dec.with_prefix_states(h, h_block, h.size(0) - 1), inc)[:, -1:]
        toks, ys = prefix_inputs, []
        emb = dec.lm.embed_tokens.weight
        for s in range(self.cycle_steps):
            y = self.soft_tokens(dec.lm_logits(feats))  # B x 1 x V
            ys.append(y)
            if s + 1 == self.cycle_steps and self.adv_fake != "text":
                break
            # the position embedding only needs a non-pad placeholder id for the soft step
            toks = torch.cat([toks, toks[:, -1:].clone().fill_(dec.lm.dictionary.unk())], dim=1)
            h, _ = dec.lower(toks, inc, token_embeddings=y @ emb)
            if self.adv_fake == "text":
                states.append(h)
                if s + 1 == self.cycle_steps:
                    break
            if self.cycle_detach_interval and s % self.cycle_detach_interval == 0:  # the authors' cur_len % N
                h = h.detach()  # the block reads the fed-back state; the gradient stops here
            h, _ = dec.block(h, incremental_state=inc)
            if self.adv_fake != "text":
                states.append(h)
            feats = dec.upper(h, inc)
        return torch.cat(ys, dim=1), torch.cat(states, dim=0).transpose(0, 1)

    def cycle_split(self, T: int):
        """The cycle's one split t_c and its content length bound, drawn on the host from the shapes
        alone (torch's CPU generator, which fairseq seeds per update): P + d for ``fixed``, uniform
        over the padded width for ``uniform``."""
        if self.split == "fixed":
            d = int(torch.randint(-self.len_jitter, self.len_jitter + 1, ()))
            return max(self.prefix_len + d, 0), min(self.content_len - d, self.max_content)
        hi = max(T - 1 - self.min_content, 0)
        lo = min(self.min_prefix, hi)
        return int(torch.randint(lo, hi + 1, ())), self.max_content

    def cycle(self, model, sample, h):
        """The cycle's pieces on the batch's first ``--cocon-cycle-sentences`` sentences (``h``: the
        lower states of the whole batch): q^1 = f(p', c = q) generated (its soft tokens and the
        block's states), and what L_cycle and the real side of L_adv need. Rows too short for t_c
        (or whose p' is) take no part (``valid``)."""
        dec = model.decoder
        n = min(self.cycle_sentences, sample["target"].size(0))
        target, prev = sample["target"][:n], sample["net_input"]["prev_output_tokens"][:n]
        n_words = count_words(target, self.padding_idx, self.eos_idx)
        B, T = target.shape
        tc, width = self.cycle_split(T)
        # a batch of short sentences (fairseq groups sentences by length) keeps a content: t_c shrinks to the width
        tc = max(min(tc, T - 1 - min(self.min_content, width)), 0)
        perm = torch.roll(torch.arange(B, device=target.device), 1)
        q_len = torch.minimum(n_words - tc, torch.full_like(n_words, width)).clamp(min=0)
        valid = (n_words >= tc + min(self.min_content, width)) & (n_words[perm] >= tc)
        q = gather_spans(target, torch.full_like(n_words, tc), q_len, self.padding_idx, width)
        q_states, q_pad = dec.encode_content_tensor(q)
        q1, fake = self.generate_soft(dec, prev[perm, : tc + 1], q_states, q_pad)  # B x S x V, B x S x C
        mask = span_mask(T, torch.full_like(n_words, tc), q_len, n_words) & valid[:, None]
        return {"n": n, "q1": q1, "fake": fake, "mask": mask, "valid": valid, "h": h[:, :n], "target": target, "tc": tc}

    def cycle_loss(self, model, cyc, pad_mask):
        """L_cycle (q^2 = f(p, c = q^1) trained towards q) summed over the cycle's tokens, and their number."""
        dec = model.decoder
        c1, _ = dec.encode_contents(None, cyc["target"].device, soft=cyc["q1"] @ dec.lm.embed_tokens.weight)
        h2, _ = dec.block(cyc["h"], c1.transpose(0, 1))
        h2 = dec.with_prefix_states(cyc["h"], h2, cyc["tc"])
        pad_mask = pad_mask[: cyc["n"]] if pad_mask is not None else None
        return self.nll(dec, h2, pad_mask, cyc["target"], cyc["mask"]), cyc["mask"].sum()

    def forward(self, model, sample, reduce=True):
        """All four losses inside one call of the model's ``forward`` (``cocon_loss``): torch's
        DistributedDataParallel (fairseq's ``pytorch_ddp``) synchronizes the gradients of what ran
        inside its forward only, and the losses call the model's parts several times."""
        return model(**sample["net_input"], cocon_loss=functools.partial(self.compute, sample=sample))

    def compute(self, model, sample):
        """``(loss, sample_size, logging_output)`` of the unwrapped model (see the module docstring)."""
        dec = model.decoder
        target, prev = sample["target"], sample["net_input"]["prev_output_tokens"]
        B, T = target.shape
        n_words = count_words(target, self.padding_idx, self.eos_idx)
        training = model.training
        gen = None
        if not training:  # the same splits at every validation (a sync, outside training steps)
            gen = torch.Generator(device=target.device).manual_seed(int(sample["id"].sum()) + 1)
        t, m, loss_mask = self.draw_splits(n_words, T, gen)
        sample_size = loss_mask.sum()

        # T x B x C, the frozen LM's lower states; the rows are right-padded, so under the causal mask no real
        # position sees padding: no padding mask in the LM's layers (the losses only count real positions)
        h, _ = dec.lower(prev, padding_mask=False)
        pad_mask = None
        content, c_states, c_pad, qmask = self.self_content(dec, target, t, m, gen)
        h_self, _ = dec.block(h, c_states, c_pad, None, content_attn_mask=qmask)
        h_self = dec.with_prefix_states(h, h_self, t)  # Eq. 7: the LM's own states before x^a's last token
        self_logits = self.logits(dec, h_self, pad_mask)
        l_self = self.nll(dec, h_self, pad_mask, target, loss_mask, logits=self_logits)
        loss = self.w_self * l_self
        log = {"loss_self": l_self.detach()}
        if self.w_bow:
            l_bow, n_bow = self.bow_loss(self_logits, content, t, qmask, loss_mask)
            if training:  # validation's loss (checkpoint selection) stays the paper's, whatever the weight
                loss = loss + self.w_bow * l_bow
            log["loss_bow"], log["ntokens_bow"] = l_bow.detach(), n_bow
        if self.w_null:
            h_null, _ = dec.block(h)
            h_null = dec.with_prefix_states(h, h_null, t)
            l_null = self.nll(dec, h_null, pad_mask, target, loss_mask)
            loss = loss + self.w_null * l_null
            log["loss_null"] = l_null.detach()
        if training:
            self.read_gap_start(model)
        cycle_on = training and self.w_cycle and self.update_num >= self.start("cycle")
        adv_on = training and self.adversarial_on()
        cyc = None
        if cycle_on or (adv_on and self.adv_fake != "teacher-forced"):
            cyc = self.cycle(model, sample, h)
        if cycle_on:
            l_cycle, n_cycle = self.cycle_loss(model, cyc, pad_mask)
            # per cycle token, weighed as one self-reconstruction token
            loss = loss + self.w_cycle * l_cycle * ratio(sample_size, n_cycle)
            log["loss_cycle"], log["ntokens_cycle"] = l_cycle.detach(), n_cycle
        if adv_on:
            if self.adv_fake != "teacher-forced":
                # real: the LM's states of the cycle sentences' x^b tokens, one position to the right of x^b's
                # targets (position i of h read x_{i-1}); a window's last token has no state there and is left
                # out. Fake: the states of the generated q^1
                n = cyc["n"]
                words = loss_mask[:n] & target[:n].ne(self.eos_idx)  # x^b without the </s> L_self may count
                real_mask = F.pad(words[:, :-1], (1, 0), value=False)
                real, real_pad = h[:, :n].transpose(0, 1), ~real_mask
                fake, fake_pad = cyc["fake"], None
                rows = cyc["valid"] & real_mask.any(1)
            else:
                real, real_pad = h.transpose(0, 1), ~loss_mask
                fake, fake_pad = h_self.transpose(0, 1), ~loss_mask
                rows = torch.ones(B, dtype=torch.bool, device=target.device)
            disc = self.discriminator
            l_adv = generator_loss(disc.discriminator, fake, fake_pad, rows, self.adv_loss)
            # weighs as w x the mean over the sentences it is computed on (the authors' BCE means)
            loss = loss + ratio(sample_size, rows.sum()) * self.w_adv * l_adv
            # the discriminator's own graph only where it learns (its weights' leaves: disc.weights())
            weights = disc.weights() if self.learn_discriminator else dict(disc.discriminator.named_parameters())
            l_disc, correct = discriminator_loss(disc.discriminator, weights, real, fake, real_pad, fake_pad, rows)
            n_adv = rows.sum()
            if self.learn_discriminator:
                disc.accumulate(self.w_disc * l_disc / n_adv.clamp(min=1), weights)
            log["loss_adv"], log["loss_disc"], log["disc_correct"] = l_adv.detach(), l_disc.detach(), correct
            log["nsentences_adv"] = n_adv
        logging_output = {
            "loss": loss.detach(),
            "ntokens": sample["ntokens"],
            "nsentences": B,
            "sample_size": sample_size,
            **log,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        size = total("sample_size")
        metrics.log_scalar("loss", ratio(total("loss"), size) / math.log(2), size, round=3)
        for key in ("loss_self", "loss_null"):
            if any(key in log for log in logging_outputs):
                metrics.log_scalar(key, ratio(total(key), size) / math.log(2), size, round=3)
        if any("loss_cycle" in log for log in logging_outputs):
            n = total("ntokens_cycle")
            metrics.log_scalar("loss_cycle", ratio(total("loss_cycle"), n) / math.log(2), n, round=3)
        if any("loss_bow" in log for log in logging_outputs):
            n = total("ntokens_bow")
            metrics.log_scalar("loss_bow", ratio(total("loss_bow"), n) / math.log(2), n, round=3)
        if any("loss_adv" in log for log in logging_outputs):
            n = total("nsentences_adv")
            for key in ("loss_adv", "loss_disc"):
                metrics.log_scalar(key, ratio(total(key), n), n, round=3)
            # real and fake sequences classified right, of 2 per sentence
            metrics.log_scalar("disc_acc", ratio(total("disc_correct"), 2 * n), 2 * n, round=3)
        metrics.log_derived("ppl_self", lambda m: 2 ** m["loss_self"].avg if "loss_self" in m else float("nan"))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
