"""``cocon``: CoCon's training loss (Chan et al., "CoCon: A Self-Supervised Approach for Controlled Text
Generation", ICLR 2021, Section 3.1, "Full Training": "the four losses combined")::

    L = w_self L_self + w_null L_null + w_cycle L_cycle + w_adv L_adv          (the block's loss)
    L_disc                                                                     (the discriminator's own)

- ``self_loss``: L_self = -sum_{i in x^b} log p(x_i | c = x^b, x_<i), the content x^b cut from the sentence
  itself ("Self Reconstruction Loss"); the step predicting x^b_j does not see content column j;
- ``null_loss``: L_null, the same positions with no content ("Null Content Loss");
- ``cycle_loss``: L_cycle = -sum_{i in q} log p(q_i | c = q^1, p), q^1 = f(p', c = q) generated as soft tokens
  from another sentence's prefix p' ("Cycle Reconstruction Loss"), from update ``--cocon-cycle-start``;
- ``adversarial_losses``: L_adv = mean log(1 - D(fake)) for the block and L_disc = mean BCE(D(real), 1) +
  BCE(D(fake), 0) for the discriminator D ("Adversarial Loss"), fake = the LM's states of q^1, real = those of
  x^b, from update ``--cocon-adv-start``; D learns with its own optimizer every ``--cocon-disc-update-freq``
  updates (:class:`~fairseq_knowgen.optim.discriminator_optimizer.DiscriminatorOptimizer`).

The block's output reaches the frozen LM's upper layers as Eq. 7 writes it (the LM's own states before the
prefix's last token). Splits, masks and the cycle's sentences: ``docs/methods/cocon.md`` ("The losses"). Every
loss is summed over its tokens (or sentences) and weighed as a mean per self-reconstruction token; validation's
loss is L_self + L_null. The schedule counts fairseq's updates (the task calls :meth:`CoConCriterion.begin_update`).

``forward`` hands :meth:`CoConCriterion.compute` to the model, which calls it inside its own ``forward``: torch's
DistributedDataParallel synchronizes the gradients of what ran inside the wrapped model's forward only, and the
losses call the model's parts several times.
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

from ..compat import self_synced_criterion  # noqa: F401  (fairseq's DDP does not wrap this criterion)
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
# fairseq's argparse refuses any other value on the command line (exit 2); "1"/"0": older checkpoints' values
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
    cocon_disc: DISC_CHOICES = field(
        default="cnn",
        metadata={
            "help": "the discriminator: cnn (the authors': convolutions of widths 1-3, max-pooled) or mlp (a "
            "position-wise MLP, mean-pooled)"
        },
    )
    cocon_disc_dim: Optional[int] = field(
        default=None,
        metadata={
            "help": "channels per convolution (cnn) or hidden size (mlp); unset: the arch's, 128 (cocon_lm_small: 64)"
        },
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

    # the discriminator's weights are the criterion's (checkpointed with it) and train with its own optimizer,
    # which averages their gradients over the ranks: fairseq's DDP wrapper stays off (compat.self_synced_criterion)
    self_synced = True

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
            raise ValueError(
                "--cocon-split fixed needs 0 <= --cocon-len-jitter < --cocon-content-len and <= --cocon-prefix-len"
            )
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

    def self_loss(self, dec, h, target, t, m, loss_mask, generator):
        """L_self summed over x^b; with ``--cocon-bow-weight`` the content bag-of-words loss of the same pass (else
        None); the block's states of that pass (Eq. 7 applied); the log."""
        content, c_states, c_pad, qmask = self.self_content(dec, target, t, m, generator)
        h_self, _ = dec.block(h, c_states, c_pad, None, content_attn_mask=qmask)
        h_self = dec.with_prefix_states(h, h_self, t)  # Eq. 7: the LM's own states before x^a's last token
        logits = self.logits(dec, h_self, None)
        l_self = self.nll(dec, h_self, None, target, loss_mask, logits=logits)
        log, l_bow = {"loss_self": l_self.detach()}, None
        if self.w_bow:
            l_bow, n_bow = self.bow_loss(logits, content, t, qmask, loss_mask)
            log["loss_bow"], log["ntokens_bow"] = l_bow.detach(), n_bow
        return l_self, l_bow, h_self, log

    def null_loss(self, dec, h, target, t, loss_mask):
        """L_null summed over x^b: the block with no content keys."""
        h_null, _ = dec.block(h)
        return self.nll(dec, dec.with_prefix_states(h, h_null, t), None, target, loss_mask)

    def cycle_loss(self, model, cyc):
        """L_cycle (q^2 = f(p, c = q^1) trained towards q) summed over the cycle's tokens, and their number."""
        dec = model.decoder
        c1, _ = dec.encode_contents(None, cyc["target"].device, soft=cyc["q1"] @ dec.lm.embed_tokens.weight)
        h2, _ = dec.block(cyc["h"], c1.transpose(0, 1))
        h2 = dec.with_prefix_states(cyc["h"], h2, cyc["tc"])
        return self.nll(dec, h2, None, cyc["target"], cyc["mask"]), cyc["mask"].sum()

    def adversarial_losses(self, h, h_self, cyc, target, loss_mask, log):
        """L_adv summed over the sentences it is computed on, and their number; L_disc's gradient goes to the
        discriminator's own optimizer (where it learns in this update). Logs both, and D's right answers."""
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
            rows = torch.ones(target.size(0), dtype=torch.bool, device=target.device)
        disc = self.discriminator
        l_adv = generator_loss(disc.discriminator, fake, fake_pad, rows, self.adv_loss)
        # the discriminator's own graph only where it learns (its weights' leaves: disc.weights())
        weights = disc.weights() if self.learn_discriminator else dict(disc.discriminator.named_parameters())
        l_disc, correct = discriminator_loss(disc.discriminator, weights, real, fake, real_pad, fake_pad, rows)
        n_adv = rows.sum()
        if self.learn_discriminator:
            disc.accumulate(self.w_disc * l_disc / n_adv.clamp(min=1), weights)
        log["loss_adv"], log["loss_disc"], log["disc_correct"] = l_adv.detach(), l_disc.detach(), correct
        log["nsentences_adv"] = n_adv
        return l_adv, n_adv

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
        l_self, l_bow, h_self, log = self.self_loss(dec, h, target, t, m, loss_mask, gen)
        loss = self.w_self * l_self
        if l_bow is not None and training:  # validation's loss (checkpoint selection) stays the paper's
            loss = loss + self.w_bow * l_bow
        if self.w_null:
            l_null = self.null_loss(dec, h, target, t, loss_mask)
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
            l_cycle, n_cycle = self.cycle_loss(model, cyc)
            # per cycle token, weighed as one self-reconstruction token
            loss = loss + self.w_cycle * l_cycle * ratio(sample_size, n_cycle)
            log["loss_cycle"], log["ntokens_cycle"] = l_cycle.detach(), n_cycle
        if adv_on:
            l_adv, n_adv = self.adversarial_losses(h, h_self, cyc, target, loss_mask, log)
            # weighs as w x the mean over the sentences it is computed on (the authors' BCE means)
            loss = loss + ratio(sample_size, n_adv) * self.w_adv * l_adv
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
