"""EKI scaling module (``shared/seeds/eki_bart.txt``, Section 2.3.1, Eq. 5-6).

On each encoder output state h_v (every channel separately)::

    Lambda = sigmoid(W2 act(W1 h_v + b1) + b2)          W1: d_s x d, W2: d x d_s   (Eq. 5)
    h_v   <- h_v * (2 Lambda)

so that a token likely to matter can be strengthened (2 Lambda > 1) and a noisy prototype
token weakened in the encoder-decoder attention. The weights start from N(0, std^2) with a
small std and the biases at 0, so that Lambda ~ 0.5 and 2 Lambda ~ 1 at the start: a
pretrained model's encoder output is not disturbed. ``Mean(Lambda_v)`` over channels is the
probability of the token-level classification L_E (Eq. 6, in the criterion
``eki_label_smoothed_cross_entropy``): does token v occur in the target?
"""

import torch
import torch.nn as nn
from fairseq import utils
from torch import Tensor


class ScalingModule(nn.Module):
    """Args: embed_dim (d), inner_dim (d_s), activation (the paper: relu), init_std."""

    def __init__(self, embed_dim: int, inner_dim: int, activation: str = "relu", init_std: float = 1e-3):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, inner_dim)
        self.fc2 = nn.Linear(inner_dim, embed_dim)
        self.activation = utils.get_activation_fn(activation)
        for lin in (self.fc1, self.fc2):
            nn.init.normal_(lin.weight, mean=0.0, std=init_std)
            nn.init.zeros_(lin.bias)

    def forward(self, h: Tensor):
        """h: ``... x d``. Returns (h * 2 Lambda, Lambda), both ``... x d``."""
        lam = torch.sigmoid(self.fc2(self.activation(self.fc1(h))))
        return h * (2.0 * lam), lam
