"""EKI group embeddings ("An Enhanced Knowledge Injection Model for Commonsense Generation", Eq. 3).

The input is the concatenation S = [C, O] of concepts and retrieved prototype (Eq. 2); each
token's embedding gets the embedding of its group on top of the model's own token and
position embeddings::

    E(c_j) = E_B(c_j) + E_C,        E(o_k) = E_B(o_k) + E_O                            (Eq. 3)

Group ids: 0 padding (and anything outside both parts), 1 concept, 2 prototype. The paper does
not say how E_C and E_O start; the authors' code (their segment embeddings, ``--init-scale
1e-2``) draws them from N(0, 0.01^2), which is the default (``init_std``); ``init_std=0`` starts
them at zero, so that a pretrained model's input is unchanged at the first step. The padding row
is zero either way. The EKI models redraw the table after fairseq's own initialization (BART's
``init_bert_params`` would draw it from N(0, 0.02^2)).
"""

import torch
import torch.nn as nn
from torch import Tensor

PAD_GROUP, CONCEPT_GROUP, PROTOTYPE_GROUP = 0, 1, 2


class GroupEmbedding(nn.Module):
    """E_C / E_O of Eq. 3 (and a zero row for padding).

    Args:
        embed_dim: d.
        num_groups: rows, padding included.
        init_std: E_C, E_O ~ N(0, init_std^2) (>= 0; 0: zero).
    """

    def __init__(self, embed_dim: int, num_groups: int = 3, init_std: float = 0.01):
        super().__init__()
        if not init_std >= 0:
            raise ValueError(f"group embeddings: init std must be >= 0, got {init_std}")
        self.init_std = init_std
        self.embed = nn.Embedding(num_groups, embed_dim, padding_idx=PAD_GROUP)
        self.reset_eki_parameters()

    def reset_eki_parameters(self):
        with torch.no_grad():
            self.embed.weight.normal_(0.0, self.init_std) if self.init_std > 0 else self.embed.weight.zero_()
            self.embed.weight[PAD_GROUP] = 0.0

    def forward(self, groups: Tensor) -> Tensor:
        """groups: ``B x S`` ids -> ``B x S x d``."""
        return self.embed(groups)
