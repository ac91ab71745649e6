"""``kbert_transformer``: a transformer whose encoder is K-BERT's (:class:`~fairseq_knowgen.models.kbert.KBertEncoder`).

The source is a sentence tree (knowledge injected by the ``kbert_translation`` task) read with soft positions and
the visible matrix; the decoder is fairseq's. ``--encoder-pretrained`` starts the encoder from a released BERT
(:mod:`~fairseq_knowgen.models.pretrained_encoder`), so that knowledge injection sits on a pretrained encoder.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer import base_architecture as transformer_base_architecture

from .kbert import KBertEncoder
from .pretrained_encoder import PretrainedEncoderMixin, add_encoder_pretrained_args, uses_pretrained_encoder


@register_model("kbert_transformer")
class KBertTransformerModel(PretrainedEncoderMixin, TransformerModel):
    """A transformer whose encoder is K-BERT's (Liu et al., 2020): the source is a sentence tree
    (knowledge injected by the ``kbert_translation`` task) read with soft positions and the
    visible matrix; the decoder is fairseq's, with incremental decoding, attending to every
    encoder state (sentence and knowledge tokens alike). Beyond the paper, which only encodes.
    ``--encoder-pretrained`` starts that encoder from a released BERT
    (:mod:`~fairseq_knowgen.models.pretrained_encoder`): knowledge injection on a pretrained encoder."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        parser.add_argument("--no-visible-matrix", action="store_true", help="ablation: no mask-self-attention")
        parser.add_argument("--no-soft-positions", action="store_true", help="ablation: hard positions")
        add_encoder_pretrained_args(parser)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's transformer with its encoder replaced by :class:`KBertEncoder` (same,
        possibly shared, token embedding); with ``--encoder-pretrained``, BERT's."""
        kbert_transformer_architecture(args)
        model = super().build_model(args, task)
        if not uses_pretrained_encoder(args):
            embed_tokens = model.encoder.embed_tokens
            model.encoder = KBertEncoder(args, task.source_dictionary, embed_tokens, args.max_source_positions)
        return model

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        soft_positions=None,
        branch_ids=None,
        mention_ids=None,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer=None,
        alignment_heads=None,
    ):
        encoder_out = self.encoder(
            src_tokens, soft_positions=soft_positions, branch_ids=branch_ids, mention_ids=mention_ids
        )
        return self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )


@register_model_architecture("kbert_transformer", "kbert_transformer")
def kbert_transformer_architecture(args):
    """fairseq's ``transformer`` sizes (use the recipe's LAYERS/DIM/HEADS); post-LN encoder with an
    embedding layer norm, as BERT; learned (soft) positions."""
    args.num_segments = getattr(args, "num_segments", None) or 0
    args.no_visible_matrix = getattr(args, "no_visible_matrix", False) or False
    args.no_soft_positions = getattr(args, "no_soft_positions", False) or False
    transformer_base_architecture(args)
