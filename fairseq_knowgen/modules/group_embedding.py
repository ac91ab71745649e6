"""EKI group embeddings (``shared/seeds/eki_bart.txt``, Eq. 3).

The input is the concatenation S = [C, O] of concepts and retrieved prototype (Eq. 2); each
token's embedding gets the embedding of its group on top of the model's own token and
position embeddings::

    E(c_j) = E_B(c_j) + E_C,        E(o_k) = E_B(o_k) + E_O                            (Eq. 3)

Group ids: 0 padding (and anything outside both parts), 1 concept, 2 prototype. The table
starts at zero, so a pretrained model's input is unchanged at the first step.
"""

import torch.nn as nn
from torch import Tensor

PAD_GROUP, CONCEPT_GROUP, PROTOTYPE_GROUP = 0, 1, 2


class GroupEmbedding(nn.Module):
    def __init__(self, embed_dim: int, num_groups: int = 3):
        super().__init__()
        self.embed = nn.Embedding(num_groups, embed_dim, padding_idx=PAD_GROUP)
        nn.init.zeros_(self.embed.weight)

    def forward(self, groups: Tensor) -> Tensor:
        """groups: ``B x S`` ids -> ``B x S x d``."""
        return self.embed(groups)
