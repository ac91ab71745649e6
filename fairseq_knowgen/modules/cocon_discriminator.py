"""The discriminator of CoCon's adversarial loss (Chan et al., ICLR 2021, Section 3.1,
"Adversarial Loss": "make the generated text closer to real text"; the paper displays no equation
for it and leaves the discriminator's shape open) on hidden-state sequences: one logit per
sequence, "real" (the frozen LM's states ``enc(x^b)`` of real text) vs "fake" (the CoCon block's
states while it generates; see :mod:`fairseq_knowgen.criterions.cocon` for both sides).

Two discriminators (``--cocon-disc``):

- ``cnn`` (default; the authors' ``HDiscriminator``): 1-D convolutions of widths 1, 2 and 3 with
  ``--cocon-disc-dim`` channels each over the positions, each max-pooled over the positions (windows
  that touch padding left out), LeakyReLU (slope 0.01), dropout 0.5, a linear map without bias to
  one logit; the linear map starts at N(0, 0.02^2)::

      f_disc(h) = w^T dropout(concat_k LeakyReLU(max_i conv_k(h)_i))

- ``mlp`` (beyond the paper and the authors' code): a position-wise two-layer MLP (LayerNorm, Linear d ->
  d_disc, GELU, Linear d_disc -> d_disc), mean-pooled over the non-padded positions, then Linear
  d_disc -> 1::

      f_disc(h) = w^T mean_i MLP(LN(h_i)) + b

The losses (:func:`discriminator_losses`); the discriminator always minimizes
``L_disc = -log sigmoid(f_disc(real)) - log(1 - sigmoid(f_disc(fake)))``, and CoCon (``--cocon-adv-loss``):

- ``minimax`` (default; the authors' generator loss ``-(d_fake_loss + d_real_loss)``, whose
  real-side term has no gradient into CoCon): ``L_adv = log(1 - sigmoid(f_disc(fake)))``, the
  GAN's own minimax game;
- ``non-saturating`` (beyond the paper and the authors' code): ``L_adv = -log sigmoid(f_disc(fake))``, the
  same fixed point without the vanishing gradient of a confident discriminator.
"""

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


DISCRIMINATORS = ("cnn", "mlp")
ADV_LOSSES = ("minimax", "non-saturating")


class ConvDiscriminator(nn.Module):
    """The authors' CNN over hidden states (module docstring, ``cnn``).

    Args:
        embed_dim: d of the states
        channels: output channels of each convolution (the authors': 128)
        widths: the convolutions' widths (the authors': 1, 2, 3)
        dropout: dropout before the last layer (the authors': 0.5)
    """

    def __init__(self, embed_dim: int, channels: int = 128, widths=(1, 2, 3), dropout: float = 0.5):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, channels, w) for w in widths)
        self.dropout = dropout
        self.out = nn.Linear(channels * len(widths), 1, bias=False)
        nn.init.normal_(self.out.weight, mean=0.0, std=0.02)

    def forward(self, h: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        """h: ``B x T x C``; padding_mask: ``B x T`` (True on padding). Returns ``B`` logits."""
        x = h.transpose(1, 2)  # B x C x T
        pooled = []
        for conv in self.convs:
            w = conv.kernel_size[0]
            if x.size(2) < w:  # too short for this width: nothing to pool
                pooled.append(h.new_zeros(h.size(0), conv.out_channels))
                continue
            z = conv(x)  # B x channels x (T - w + 1)
            if padding_mask is not None:  # a window touching padding is left out of the max
                touched = padding_mask.unfold(1, w, 1).any(-1)  # B x (T - w + 1)
                z = z.masked_fill(touched[:, None], float("-inf"))
            m = z.max(dim=2).values
            pooled.append(F.leaky_relu(torch.where(torch.isinf(m), torch.zeros_like(m), m), negative_slope=0.01))
        feats = F.dropout(torch.cat(pooled, dim=1), p=self.dropout, training=self.training)
        return self.out(feats).squeeze(-1)


def build_discriminator(kind: str, embed_dim: int, hidden_dim: int) -> nn.Module:
    """``cnn`` (the authors') or ``mlp`` (module docstring); ``hidden_dim``: channels or d_disc."""
    if kind == "cnn":
        return ConvDiscriminator(embed_dim, hidden_dim)
    if kind == "mlp":
        return HiddenStateDiscriminator(embed_dim, hidden_dim)
    raise ValueError(f"discriminator {kind!r}: one of {', '.join(DISCRIMINATORS)}")


class HiddenStateDiscriminator(nn.Module):
    """The position-wise MLP with mean pooling (module docstring, ``mlp``).

    Args:
        embed_dim: d of the states
        hidden_dim: d_disc of the MLP
    """

    def __init__(self, embed_dim: int, hidden_dim: int):
        super().__init__()
        self.layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim, 1)

    def forward(self, h: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        """h: ``B x T x C``; padding_mask: ``B x T`` (True on padding). Returns ``B`` logits."""
        z = self.fc2(F.gelu(self.fc1(self.layer_norm(h))))  # B x T x D
        if padding_mask is None:
            pooled = z.mean(1)
        else:
            keep = (~padding_mask).unsqueeze(-1).to(z.dtype)
            pooled = (z * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.out(pooled).squeeze(-1)


def discriminator_loss(disc: nn.Module, params, real: Tensor, fake: Tensor, real_padding_mask=None,
                       fake_padding_mask=None, rows: Optional[Tensor] = None):
    """The discriminator's side: ``L_disc = -log sigmoid(f(real)) - log(1 - sigmoid(f(fake)))`` summed over the
    sequences (``rows``: ``B`` bool, the sequences that count), run with ``params`` (a name -> tensor dict: the
    discriminator's own fp32 weights, :class:`~fairseq_knowgen.optim.cocon_discriminator.DiscriminatorTrainer`) on
    the states detached and in fp32, so that its gradient reaches those weights only. Returns ``(L_disc, correct)``:
    ``correct`` counts the sequences it classifies right (real logit > 0, fake logit < 0), real and fake together."""
    z_real = torch.func.functional_call(disc, params, (real.detach().float(), real_padding_mask))
    z_fake = torch.func.functional_call(disc, params, (fake.detach().float(), fake_padding_mask))
    keep = torch.ones_like(z_real) if rows is None else rows.to(z_real.dtype)
    loss = F.binary_cross_entropy_with_logits(z_real, torch.ones_like(z_real), reduction="none")
    loss = loss + F.binary_cross_entropy_with_logits(z_fake, torch.zeros_like(z_fake), reduction="none")
    correct = ((z_real > 0).to(keep.dtype) + (z_fake < 0).to(keep.dtype)) * keep
    return (loss * keep).sum(), correct.sum().detach()


def generator_loss(
    disc: nn.Module, fake: Tensor, fake_padding_mask=None, rows: Optional[Tensor] = None, adv_loss: str = "minimax"
) -> Tensor:
    """CoCon's side, ``L_adv`` summed over the sequences (``adv_loss``: ``minimax`` ``log(1 - sigmoid(f(fake)))`` or
    ``non-saturating`` ``-log sigmoid(f(fake))``; module docstring), the discriminator run with detached weights
    (``torch.func.functional_call``) in fp32: its gradient reaches the fake states (CoCon) only."""
    frozen = {k: v.detach() for k, v in disc.named_parameters()}
    logits = torch.func.functional_call(disc, frozen, (fake.float(), fake_padding_mask))
    if adv_loss == "minimax":  # log(1 - D(fake)) = -BCE(D(fake), 0)
        loss = -F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none")
    elif adv_loss == "non-saturating":  # -log D(fake) = BCE(D(fake), 1)
        loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="none")
    else:
        raise ValueError(f"adversarial loss {adv_loss!r}: one of {', '.join(ADV_LOSSES)}")
    return (loss if rows is None else loss * rows.to(loss.dtype)).sum()
