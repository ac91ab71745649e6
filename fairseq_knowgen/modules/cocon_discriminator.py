"""The discriminator of CoCon's adversarial loss (Chan et al., ICLR 2021, Section 3.1,
"Adversarial Loss": "make the generated text closer to real text"; the seed text displays no
equation for it) on hidden-state sequences.

The paper leaves its shape open; here (``--cocon-disc-dim``): a position-wise two-layer MLP
(LayerNorm, Linear d -> d_disc, GELU, Linear d_disc -> d_disc), mean-pooled over the non-padded
positions, then Linear d_disc -> 1: one logit per sequence, "real" (the frozen LM's states
``enc(x^b)`` of real text) vs "fake" (the CoCon block's states while it generates, as the paper;
see :mod:`fairseq_knowgen.criterions.cocon` for both sides)::

    f_disc(h) = w^T mean_i MLP(LN(h_i)) + b
    L_disc = -log sigmoid(f_disc(real)) - log(1 - sigmoid(f_disc(fake)))   (the discriminator minimizes it)
    L_adv  = -log sigmoid(f_disc(fake))    (CoCon minimizes it: the non-saturating generator loss)

i.e. the discriminator maximizes log D(real) + log(1 - D(fake)) and CoCon, instead of minimizing
log(1 - D(fake)), maximizes log D(fake) (same fixed point, no vanishing gradient early on).
"""

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class HiddenStateDiscriminator(nn.Module):
    """Args:
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


def discriminator_losses(
    disc: HiddenStateDiscriminator,
    real: Tensor,
    fake: Tensor,
    real_padding_mask: Optional[Tensor] = None,
    fake_padding_mask: Optional[Tensor] = None,
    rows: Optional[Tensor] = None,
):
    """``(L_disc, L_adv)`` summed over the batch's sequences, with separated gradients:

    - ``L_disc`` sees detached states: its gradient reaches the discriminator only;
    - ``L_adv`` (generator side) runs the discriminator with detached parameters
      (``torch.func.functional_call``): its gradient reaches the fake states (CoCon) only.

    ``real`` and ``fake`` are ``B x T x C`` and ``B x T' x C`` (their lengths may differ: real
    text against generated steps); ``rows`` (``B`` bool) keeps only some sequences in the sums.
    """
    keep = None if rows is None else rows.to(real.dtype)

    def bce(logits, label):
        loss = F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, label), reduction="none")
        return (loss if keep is None else loss * keep).sum()

    l_disc = bce(disc(real.detach(), real_padding_mask), 1.0) + bce(disc(fake.detach(), fake_padding_mask), 0.0)
    frozen = {k: v.detach() for k, v in disc.named_parameters()}
    l_adv = bce(torch.func.functional_call(disc, frozen, (fake, fake_padding_mask)), 1.0)
    return l_disc, l_adv
