"""The discriminator of CoCon's adversarial loss (Chan et al., ICLR 2021, Section 3.1,
"Adversarial Loss": "make the generated text closer to real text"; the seed text displays no
equation for it) on hidden-state sequences.

The paper leaves its shape open; here (``--cocon-disc-dim``): a position-wise two-layer MLP
(LayerNorm, Linear d -> d_disc, GELU, Linear d_disc -> d_disc), mean-pooled over the non-padded
positions, then Linear d_disc -> 1: one logit per sequence, "real" (the frozen LM's states
``enc(x^b)``) vs "fake" (the CoCon block's states ``h'`` of the same positions; the paper's fake
side is generated text, see :mod:`fairseq_knowgen.criterions.cocon`)::

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


def discriminator_losses(disc: HiddenStateDiscriminator, real: Tensor, fake: Tensor, padding_mask: Tensor):
    """``(L_disc, L_adv)`` summed over the batch, with separated gradients:

    - ``L_disc`` sees detached states: its gradient reaches the discriminator only;
    - ``L_adv`` (generator side) runs the discriminator with detached parameters
      (``torch.func.functional_call``): its gradient reaches the fake states (CoCon) only.
    """
    d_real = disc(real.detach(), padding_mask)
    d_fake = disc(fake.detach(), padding_mask)
    l_disc = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real), reduction="sum")
    l_disc = l_disc + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake), reduction="sum")
    frozen = {k: v.detach() for k, v in disc.named_parameters()}
    g_fake = torch.func.functional_call(disc, frozen, (fake, padding_mask))
    l_adv = F.binary_cross_entropy_with_logits(g_fake, torch.ones_like(g_fake), reduction="sum")
    return l_disc, l_adv
