"""EKI group embeddings (``shared/seeds/eki_bart.txt``, Eq. 3).

The input is the concatenation S = [C, O] of concepts and retrieved prototype (Eq. 2); each
token's embedding gets the embedding of its group on top of the model's own token and
position embeddings::

    E(c_j) = E_B(c_j) + E_C,        E(o_k) = E_B(o_k) + E_O                            (Eq. 3)

Group ids: 0 padding (and anything outside both parts), 1 concept, 2 prototype. The table
starts at zero, so a pretrained model's input is unchanged at the first step (the EKI models
reset it to zero after fairseq's own initialization, e.g. BART's ``init_bert_params``, which
would draw it from N(0, 0.02^2)).
"""

import torch.nn as nn
from torch import Tensor

PAD_GROUP, CONCEPT_GROUP, PROTOTYPE_GROUP = 0, 1, 2


class GroupEmbedding(nn.Module):
    """E_C / E_O of Eq. 3 (and a zero row for padding). Args: embed_dim, num_groups."""

    def __init__(self, embed_dim: int, num_groups: int = 3):
        super().__init__()
        self.embed = nn.Embedding(num_groups, embed_dim, padding_idx=PAD_GROUP)
        self.reset_eki_parameters()

    def reset_eki_parameters(self):
        nn.init.zeros_(self.embed.weight)

    def forward(self, groups: Tensor) -> Tensor:
        """groups: ``B x S`` ids -> ``B x S x d``."""
        return self.embed(groups)
