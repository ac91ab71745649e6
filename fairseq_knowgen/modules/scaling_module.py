"""EKI scaling module ("An Enhanced Knowledge Injection Model for Commonsense Generation", Section 2.3.1, Eq. 5-6).

On each encoder output state h_v (every channel separately)::

    Lambda = sigmoid(W2 act(W1 h_v + b1) + b2)          W1: d_s x d, W2: d x d_s   (Eq. 5)
    h_v   <- h_v * (2 Lambda)

so that a token likely to matter can be strengthened (2 Lambda > 1) and a noisy prototype
token weakened in the encoder-decoder attention. ``Mean(Lambda_v)`` over channels is the
probability of the token-level classification L_E (Eq. 6, in the criterion
``eki_label_smoothed_cross_entropy``): does token v occur in the target?

The paper fixes the form and act = ReLU; it leaves d_s, dropout and the initialization's
variance open. The authors' released code (LibertFan/EKI-BART, ``Adaptor`` in ``src/model.py``)
uses d_s = 512, BART's activation (GELU), dropout (the model's, 0.1) on the input of W1 and on
the hidden units (``Lambda = sigmoid(W2 drop(act(W1 drop(h) + b1)) + b2)``, the scaled state
the undropped ``h``), and N(0, 1e-3^2) weights with zero biases. The EKI models' defaults are
the paper's ReLU and the authors' d_s, dropout and initialization (``docs/methods/eki.md``).

Initialization. The paper draws the weights from N(0, var) with a small var and the biases
at 0, so that Lambda ~ 0.5 and 2 Lambda ~ 1: a pretrained model's encoder output is barely
disturbed (``init="normal"``, the default). ``init="mirrored"`` (this package's option) makes
the start exact: each weight is still drawn from N(0, std^2), but the second half of the hidden
units copies the first half's W1 rows and negates its W2 columns, so W2 act(W1 h) = 0 for every
h (up to float rounding, ~1e-12 at std 1e-3, far below float32's resolution at 0.5): Lambda = 0.5
and 2 Lambda = 1 exactly (in evaluation; dropout in training drops the two halves apart), and
EKI-BART computes BART's function before its first update. Unlike W2 = 0 it leaves every weight
a non-zero gradient at the first step. With an odd d_s the last unit's W2 column is 0.
"""

import torch
import torch.nn as nn
from fairseq import utils
from torch import Tensor

SCALING_INITS = ("normal", "mirrored")


class ScalingModule(nn.Module):
    """Eq. 5 on ``... x d`` encoder states.

    Args:
        embed_dim: d.
        inner_dim: d_s (>= 1).
        activation: a fairseq activation; the paper's is relu, the authors' code BART's gelu.
        init_std: std of the N(0, std^2) weights (> 0).
        init: ``normal`` (the paper's N(0, std^2): 2 Lambda ~ 1) or ``mirrored`` (exactly
            2 Lambda = 1 at the start, see the module docstring).
        dropout: dropout on the input of W1 and on the hidden units (the authors' code), in [0, 1).
    """

    def __init__(
        self,
        embed_dim: int,
        inner_dim: int,
        activation: str = "relu",
        init_std: float = 1e-3,
        init: str = "normal",
        dropout: float = 0.0,
    ):
        super().__init__()
        if inner_dim < 1:
            raise ValueError(f"scaling module: inner size d_s must be >= 1, got {inner_dim}")
        if not init_std > 0:
            raise ValueError(f"scaling module: init std must be > 0, got {init_std}")
        if init not in SCALING_INITS:
            raise ValueError(f"scaling module: init must be one of {SCALING_INITS}, got {init!r}")
        if not 0 <= dropout < 1:
            raise ValueError(f"scaling module: dropout must be in [0, 1), got {dropout}")
        self.init_std, self.init, self.activation_name = init_std, init, activation
        self.fc1 = nn.Linear(embed_dim, inner_dim)
        self.fc2 = nn.Linear(inner_dim, embed_dim)
        self.activation = utils.get_activation_fn(activation)
        self.dropout = nn.Dropout(dropout)
        self.reset_eki_parameters()

    def reset_eki_parameters(self):
        """The start described in the module docstring (also called by the EKI models after
        fairseq's own initialization, e.g. BART's ``init_bert_params``)."""
        with torch.no_grad():
            for lin in (self.fc1, self.fc2):
                nn.init.normal_(lin.weight, mean=0.0, std=self.init_std)
                nn.init.zeros_(lin.bias)
            if self.init == "mirrored":
                half = self.fc1.out_features // 2
                self.fc1.weight[half : 2 * half] = self.fc1.weight[:half]
                self.fc2.weight[:, half : 2 * half] = -self.fc2.weight[:, :half]
                self.fc2.weight[:, 2 * half :] = 0.0

    def extra_repr(self):
        return f"activation={self.activation_name}, init={self.init}, init_std={self.init_std}"

    def forward(self, h: Tensor):
        """h: ``... x d``. Returns (h * 2 Lambda, Lambda), both ``... x d``."""
        hidden = self.dropout(self.activation(self.fc1(self.dropout(h))))
        lam = torch.sigmoid(self.fc2(hidden))
        return h * (2.0 * lam), lam
