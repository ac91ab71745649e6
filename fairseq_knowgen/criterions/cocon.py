"""``cocon``: the four self-supervised losses of CoCon (Chan et al., ICLR 2021, Section 3.1;
``shared/seeds/cocon.zh.txt``), each weighted by a flag and logged on its own::

    L = w_self L_self + w_null L_null + w_cycle L_cycle + w_adv L_adv (+ w_disc L_disc)

(Section 3.1, "Full Training": "the four losses combined"). The seed text numbers equations up to
Eq. 7 (Section 3) and displays none of Section 3.1, so the losses are cited by their paragraph.

For ``--arch cocon_lm`` with ``--task cocon_generation``. A sentence is ``x = x_1 .. x_n </s>``.

- **Split** (``L_self``, ``L_null``, ``L_adv``): per sentence t ~ Uniform{a, .., n - m} with
  a = ``--cocon-min-prefix`` (default 0: x^a may be empty, as when decoding from the start
  symbol) and m = ``--cocon-min-content``; x^a = x_1..x_t, x^b = x_{t+1}..x_n </s>. The content is
  c = x^b without ``</s>``, cut at ``--cocon-max-content`` tokens (its first ones).
- **Self-reconstruction** ("Self Reconstruction Loss": "c = x^b, and what is generated is x^b
  itself"): ``L_self = -sum_{i in x^b} log p(x_i | c = x^b, x_<i)``. Which content columns a
  step sees is ``--cocon-self-mask`` (the paper's "content masking", named in its introduction;
  the seed text gives no details):

  - ``aligned`` (default): the step predicting x^b_j does not see content position j (its column
    gets -inf), so the block cannot just copy the token it is asked for. Content states come from
    the LM run on c alone, causally, so later columns j' > j still carry c_j; but copying a token's
    *identity* is never rewarded (the column holding it is hidden exactly when it is the target),
    which is what content-conditioned decoding from a concept list needs. Measured in the README:
    at 40 minutes the block barely reads its content with this mask.
  - ``random``: each content column of a sentence is hidden from all its steps with probability
    ``--cocon-self-mask-prob`` (at least one column stays visible), so the aligned column is seen
    in part of the sentences (copying is rewarded) and missing in the others (the block also
    learns to generate without it).
  - ``none``: every step sees the whole content.

  (``1``/``0`` are read as ``aligned``/``none``: checkpoints of earlier versions.)
- **Null content** ("Null Content Loss", c = null): the same positions with c = nothing: the block
  attends over the causal self part only (no content keys at all).
- **Cycle reconstruction** ("Cycle Reconstruction Loss": q^1 = f(p', q), q^2 = f(p, q^1), q^2
  trained towards q), from ``--cocon-cycle-start`` updates on: with one split t_c for the batch
  (so prefixes need no padding), x = [p; q] and x' = [p'; q'] (x' = the previous sentence of the
  batch, cyclically: row b takes p' from row b - 1; on the batch's first ``--cocon-cycle-sentences``
  sentences only, as its cost grows with sentences x vocabulary), q^1 = f(p', c = q) is generated
  for ``--cocon-cycle-steps`` steps as *soft* tokens: step s feeds back y_s = softmax(o_s / T)
  (``--cocon-cycle-soft softmax``, T = ``--cocon-cycle-temperature``) or a Gumbel-softmax sample
  (``gumbel``) through the embedding matrix (y_s E), incrementally; then ``L_cycle = -sum_{i in q}
  log p(q_i | c = q^1, p, q_<i)``, the content q^1 entering as the soft embeddings y E. Its gradient
  reaches the CoCon block through both passes (the frozen LM only passes it on).
- **Adversarial** ("Adversarial Loss": "make the generated text closer to real text"), from
  ``--cocon-adv-start`` updates on: the discriminator
  (:mod:`~fairseq_knowgen.modules.cocon_discriminator`, in the model) tells the frozen LM's
  lower-layer states of the x^b positions ("real") from the CoCon block's states of the same
  positions in the self-reconstruction pass ("fake"; a choice of this implementation: the paper
  has the discriminator judge *generated* text against real text, while here "fake" is the
  block's output on the real, teacher-forced text, so L_adv keeps h' close to the LM's own states).
  ``L_disc`` (weight ``--cocon-disc-weight``)
  reaches only the discriminator (detached states); ``L_adv`` (non-saturating, weight
  ``--cocon-adv-weight``) reaches only CoCon (discriminator run with detached parameters).
  Schedule: the discriminator is stepped by the same fairseq optimizer update as the block (same
  optimizer kind and lr schedule, and so the same DDP all-reduce), on its own loss only, every
  ``--cocon-disc-update-freq`` updates (the others give it a zero loss). Both adversarial losses
  are means over sentences, scaled by tokens per sentence so that after fairseq's division by the
  sample size they weigh as w x mean BCE.
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
"""

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..modules.cocon_discriminator import discriminator_losses

SOFT_CHOICES = ChoiceEnum(["softmax", "gumbel"])
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
    cocon_cycle_start: int = field(default=1000, metadata={"help": "updates before L_cycle starts"})
    cocon_adv_start: int = field(default=1000, metadata={"help": "updates before L_adv/L_disc start"})
    cocon_cycle_steps: int = field(default=10, metadata={"help": "length of the soft q^1 of the cycle"})
    cocon_cycle_soft: SOFT_CHOICES = field(
        default="softmax", metadata={"help": "soft token fed back: softmax(o/T), or a Gumbel-softmax sample"}
    )
    cocon_cycle_temperature: float = field(default=1.0, metadata={"help": "T of the soft tokens"})
    cocon_cycle_sentences: int = field(
        default=32, metadata={"help": "the cycle runs on the batch's first N sentences (its cost grows with N x vocab)"}
    )
    cocon_disc_update_freq: int = field(default=1, metadata={"help": "the discriminator learns every K updates"})
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
    cocon_min_prefix: int = field(default=0, metadata={"help": "shortest x^a (tokens)"})
    cocon_min_content: int = field(default=1, metadata={"help": "shortest content (tokens)"})
    cocon_max_content: int = field(default=32, metadata={"help": "longest content: x^b cut here"})


def sample_splits(n_words: torch.Tensor, min_prefix: int, min_content: int, generator=None) -> torch.Tensor:
    """t per sentence, uniform over {a, .., n - m} (clamped into [0, n - 1] for short sentences)."""
    hi = (n_words - min_content).clamp(min=0)
    lo = torch.minimum(torch.full_like(hi, min_prefix), hi)
    r = torch.rand(n_words.shape, generator=generator)
    return (lo + (r * (hi - lo + 1).float()).floor().long()).clamp(max=(n_words - 1).clamp(min=0))


def gather_spans(tokens: torch.Tensor, start: torch.Tensor, length: torch.Tensor, pad: int) -> torch.Tensor:
    """``B x max(length)``: tokens[b, start_b : start_b + length_b], right-padded."""
    L = max(int(length.max()), 1)
    ar = torch.arange(L, device=tokens.device)
    idx = (start[:, None] + ar[None]).clamp(max=tokens.size(1) - 1)
    out = tokens.gather(1, idx)
    return out.masked_fill(ar[None] >= length[:, None], pad)


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
        cocon_cycle_start=1000,
        cocon_adv_start=1000,
        cocon_cycle_steps=10,
        cocon_cycle_soft="softmax",
        cocon_cycle_temperature=1.0,
        cocon_cycle_sentences=32,
        cocon_disc_update_freq=1,
        cocon_self_mask="aligned",
        cocon_self_mask_prob=0.5,
        cocon_bow_weight=0.0,
        cocon_min_prefix=0,
        cocon_min_content=1,
        cocon_max_content=32,
    ):
        super().__init__(task)
        self.w_self, self.w_null, self.w_cycle = cocon_self_weight, cocon_null_weight, cocon_cycle_weight
        self.w_adv, self.w_disc = cocon_adv_weight, cocon_disc_weight
        self.cycle_start, self.adv_start = cocon_cycle_start, cocon_adv_start
        self.cycle_steps = cocon_cycle_steps
        self.cycle_soft, self.cycle_temperature = str(cocon_cycle_soft), cocon_cycle_temperature
        self.cycle_sentences = max(2, cocon_cycle_sentences)
        self.disc_update_freq = max(1, cocon_disc_update_freq)
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

    def set_update_num(self, update_num: int):
        self.update_num = int(update_num)

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

    def self_content(self, dec, target, n_words, t, generator=None):
        """The content x^b (``B x L``), its lower-layer states and padding mask, and the per-query
        mask of the self-reconstruction (``B x T x L``, True = hidden; ``None`` for ``none``):
        ``aligned``: query p never sees content p - t; ``random``: the same random columns hidden
        from every query of a sentence (``generator``: a CPU ``torch.Generator``, for validation)."""
        pad = self.padding_idx
        length = torch.minimum(n_words - t, torch.full_like(t, self.max_content))
        content = gather_spans(target, t, length, pad)
        states, cpad = dec.encode_content_tensor(content)
        T, L = target.size(1), content.size(1)
        qmask = None
        if self.self_mask == "aligned":
            j = torch.arange(T, device=target.device)[None, :] - t[:, None]  # B x T: content index j
            qmask = j[:, :, None].eq(torch.arange(L, device=target.device)[None, None, :])
        elif self.self_mask == "random":
            hide = torch.rand(content.shape, generator=generator).to(target.device) < self.self_mask_prob
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
        """q^1 = f(p', c = q) as soft tokens (Cycle Reconstruction Loss): ``B x steps x V`` distributions, generated
        incrementally after the prefix inputs (``</s> p'``, no padding)."""
        inc = {}
        h, _ = dec.lower(prefix_inputs, inc, new=prefix_inputs.size(1))  # the whole prefix at once
        h, _ = dec.block(h, content_states, content_pad, None, incremental_state=inc)
        feats = dec.upper(h, inc)[:, -1:]
        toks, ys = prefix_inputs, []
        emb = dec.lm.embed_tokens.weight
        for s in range(self.cycle_steps):
            y = self.soft_tokens(dec.lm_logits(feats))  # B x 1 x V
            ys.append(y)
            if s + 1 == self.cycle_steps:
                break
            # the position embedding only needs a non-pad placeholder id for the soft step
            toks = torch.cat([toks, toks[:, -1:].clone().fill_(dec.lm.dictionary.unk())], dim=1)
            h, _ = dec.lower(toks, inc, token_embeddings=y @ emb)
            h, _ = dec.block(h, incremental_state=inc)
            feats = dec.upper(h, inc)
        return torch.cat(ys, dim=1)

    def cycle_loss(self, model, sample, h, pad_mask, n_words):
        """L_cycle (q^2 = f(p, c = q^1) trained towards q) summed over the cycle's tokens, and their
        number, on the batch's first ``--cocon-cycle-sentences`` sentences (``h``: the lower states of
        the whole batch)."""
        dec = model.decoder
        n = min(self.cycle_sentences, sample["target"].size(0))
        target, prev = sample["target"][:n], sample["net_input"]["prev_output_tokens"][:n]
        h, n_words = h[:, :n], n_words[:n]
        pad_mask = pad_mask[:n] if pad_mask is not None else None
        B = target.size(0)
        tc = int(sample_splits(n_words.min().view(1), self.min_prefix, self.min_content)[0])
        perm = torch.roll(torch.arange(B, device=target.device), 1)
        q_len = torch.minimum(n_words - tc, torch.full_like(n_words, self.max_content))
        q = gather_spans(target, torch.full_like(n_words, tc), q_len, self.padding_idx)
        q_states, q_pad = dec.encode_content_tensor(q)
        q1 = self.generate_soft(dec, prev[perm, : tc + 1], q_states, q_pad)  # B x S x V
        c1, _ = dec.encode_contents(None, target.device, soft=q1 @ dec.lm.embed_tokens.weight)
        h2, _ = dec.block(h, c1.transpose(0, 1))
        pos = torch.arange(target.size(1), device=target.device)[None]
        mask = (pos >= tc) & target.ne(self.padding_idx)
        return self.nll(dec, h2, pad_mask, target, mask), mask.sum()

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
        lengths = target.ne(self.padding_idx).sum(1)
        n_words = lengths - 1
        training = model.training
        gen = None if training else torch.Generator().manual_seed(int(sample["id"].sum()) + 1)
        t = sample_splits(n_words.cpu(), self.min_prefix, self.min_content, gen).to(target.device)
        pos = torch.arange(T, device=target.device)[None]
        loss_mask = (pos >= t[:, None]) & (pos < lengths[:, None])  # predicts x^b (and </s>)
        sample_size = int(loss_mask.sum())

        h, pad_mask = dec.lower(prev)  # T x B x C, the frozen LM's lower states
        content, c_states, c_pad, qmask = self.self_content(dec, target, n_words, t, gen)
        h_self, _ = dec.block(h, c_states, c_pad, None, content_attn_mask=qmask)
        self_logits = self.logits(dec, h_self, pad_mask)
        l_self = self.nll(dec, h_self, pad_mask, target, loss_mask, logits=self_logits)
        loss = self.w_self * l_self
        log = {"loss_self": l_self.item()}
        if self.w_bow:
            l_bow, n_bow = self.bow_loss(self_logits, content, t, qmask, loss_mask)
            if training:  # validation's loss (checkpoint selection) stays the paper's, whatever the weight
                loss = loss + self.w_bow * l_bow
            log["loss_bow"], log["ntokens_bow"] = l_bow.item(), int(n_bow)
        if self.w_null:
            h_null, _ = dec.block(h)
            l_null = self.nll(dec, h_null, pad_mask, target, loss_mask)
            loss = loss + self.w_null * l_null
            log["loss_null"] = l_null.item()
        if training and self.w_cycle and self.update_num >= self.cycle_start:
            l_cycle, n_cycle = self.cycle_loss(model, sample, h, pad_mask, n_words)
            # per cycle token, weighed as one self-reconstruction token
            loss = loss + self.w_cycle * l_cycle * (sample_size / max(int(n_cycle), 1))
            log["loss_cycle"], log["ntokens_cycle"] = l_cycle.item(), int(n_cycle)
        disc = getattr(model, "discriminator", None)
        adv_on = training and self.w_adv and disc is not None and self.update_num >= self.adv_start
        if adv_on:
            real, fake = h.transpose(0, 1), h_self.transpose(0, 1)
            l_disc, l_adv = discriminator_losses(disc, real, fake, ~loss_mask)
            per_sentence = sample_size / B
            w_disc = self.w_disc if self.update_num % self.disc_update_freq == 0 else 0.0
            loss = loss + per_sentence * (self.w_adv * l_adv + w_disc * l_disc)
            log["loss_adv"], log["loss_disc"] = l_adv.item(), l_disc.item()
        if training and disc is not None and not (adv_on and self.w_disc):
            # every parameter takes part in every update (torch DDP without find_unused_parameters)
            loss = loss + 0.0 * sum(p.sum() for p in disc.parameters())
        logging_output = {
            "loss": loss.data,
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
        nsent = total("nsentences")
        metrics.log_scalar("loss", total("loss") / max(size, 1) / math.log(2), size, round=3)
        for key in ("loss_self", "loss_null"):
            if any(key in log for log in logging_outputs):
                metrics.log_scalar(key, total(key) / max(size, 1) / math.log(2), size, round=3)
        if any("loss_cycle" in log for log in logging_outputs):
            n = total("ntokens_cycle")
            metrics.log_scalar("loss_cycle", total("loss_cycle") / max(n, 1) / math.log(2), n, round=3)
        if any("loss_bow" in log for log in logging_outputs):
            n = total("ntokens_bow")
            metrics.log_scalar("loss_bow", total("loss_bow") / max(n, 1) / math.log(2), n, round=3)
        for key in ("loss_adv", "loss_disc"):
            if any(key in log for log in logging_outputs):
                metrics.log_scalar(key, total(key) / max(nsent, 1), nsent, round=3)
        metrics.log_derived("ppl_self", lambda m: 2 ** m["loss_self"].avg if "loss_self" in m else float("nan"))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
