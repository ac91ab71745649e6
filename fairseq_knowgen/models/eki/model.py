"""The EKI models and their registered architectures: ``eki_transformer`` (from scratch), ``eki_bart_base`` and
``eki_bart_large`` (fine-tuned from fairseq's BART)."""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.bart import BARTModel
from fairseq.models.bart.model import bart_base_architecture, bart_large_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel, base_architecture

from ...modules.group_embedding import GroupEmbedding
from ...modules.position_indicator import PositionIndicatorAttention
from ...modules.scaling_module import ScalingModule
from ..copy_transformer import add_copy_args, copy_defaults, dimattn_at_copy_layer, tie_placeholders
from ..dimattn import add_dimattn_args, dimattn_defaults
from .config import NEW_PARAMETER_PREFIXES, add_eki_args, check_shared_dictionary, eki_defaults
from .decoder import EKICopyDecoder, EKIDecoder
from ..pretrained_encoder import PretrainedEncoderMixin, add_encoder_pretrained_args, uses_pretrained_encoder
from .encoder import EKIBertEncoder, EKIEncoder


class EKIMixin:
    """Shared by the transformer and BART variants: build EKI encoder/decoder, start the new
    parameters at their EKI initialization, load pretrained checkpoints that lack them."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        # BARTModel.__init__ has just run init_bert_params over every module, ours included
        # (N(0, 0.02^2) group/distance embeddings and scaling weights): restore the EKI start
        self.reset_eki_parameters()

    def reset_eki_parameters(self):
        """New parameters to their EKI start: E_C/E_O ~ N(0, ``--eki-group-init-std``^2), E_D ~
        N(0, ``--eki-distance-init-std``^2), the scaling module at 2 Lambda ~ 1 (``--eki-scaling-init``;
        exactly 1 with ``mirrored``). With both stds 0 and ``mirrored`` the pretrained model's function
        is unchanged."""
        for m in self.modules():
            if isinstance(m, (GroupEmbedding, ScalingModule, PositionIndicatorAttention)):
                m.reset_eki_parameters()

    @classmethod
    def build_model(cls, args, task):
        check_shared_dictionary(task.source_dictionary, task.target_dictionary)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        eki_defaults(args)
        if uses_pretrained_encoder(args):
            return EKIBertEncoder(args, src_dict, embed_tokens)
        return EKIEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens, args)

    @classmethod
    def build_embedding(cls, args, dictionary, embed_dim, path=None):
        emb = super().build_embedding(args, dictionary, embed_dim, path)
        return tie_placeholders(emb, dictionary) if getattr(args, "copy", False) else emb

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        eki_defaults(args)
        cfg = TransformerConfig.from_namespace(args)
        if not getattr(args, "copy", False):
            if getattr(args, "dimattn_type", None):
                dimattn_defaults(args)
            return EKIDecoder(cfg, tgt_dict, embed_tokens, args)
        copy_defaults(args)
        if getattr(args, "dimattn_type", None):
            n = cfg.decoder.layers
            if not -n <= args.copy_layer < n:
                raise ValueError(f"--copy-layer {args.copy_layer} out of range for {n} decoder layers")
            dimattn_at_copy_layer(args, args.copy_layer % n)
        return EKICopyDecoder(cfg, tgt_dict, embed_tokens, args)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, src_group=None, src_distance=None, **kwargs):
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, src_group=src_group, src_distance=src_distance)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, src_lengths=src_lengths)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Parameters of EKI parts absent from a checkpoint (a plain BART one) keep their
        initialization; everything else must match as usual."""
        own = self.state_dict()
        missing_new = {k for k in own if k not in state_dict and any(p in k for p in NEW_PARAMETER_PREFIXES)}
        if missing_new:
            state_dict = dict(state_dict)
            for k in missing_new:
                state_dict[k] = own[k]
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


@register_model("eki_transformer")
class EKITransformerModel(EKIMixin, PretrainedEncoderMixin, TransformerModel):
    """EKI on a transformer trained from scratch, or on a released BERT's encoder (``--encoder-pretrained``)."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_eki_args(parser)
        add_copy_args(parser, switch=True)
        add_dimattn_args(parser)
        add_encoder_pretrained_args(parser)


@register_model("eki_bart")
class EKIBARTModel(EKIMixin, BARTModel):
    """EKI-BART: fine-tuned from a fairseq BART checkpoint."""

    @staticmethod
    def add_args(parser):
        BARTModel.add_args(parser)
        add_eki_args(parser)
        add_copy_args(parser, switch=True)
        add_dimattn_args(parser)

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        src_group=None,
        src_distance=None,
        features_only=False,
        classification_head_name=None,
        token_embeddings=None,
        return_all_hiddens=True,
        alignment_layer=None,
        alignment_heads=None,
    ):
        return EKIMixin.forward(self, src_tokens, src_lengths, prev_output_tokens, src_group, src_distance)

    def upgrade_state_dict_named(self, state_dict, name):
        """BART's upgrade, then the checkpoint's embeddings grown to the task dictionary
        (``<sep>`` and any other new symbol get new rows, the mean of the pretrained ones);
        a pretrained tensor the upgrade would drop is refused
        (:func:`~fairseq_knowgen.convert.extend_dictionary.upgrade_pretrained_bart`)."""
        # imported here: ``python -m fairseq_knowgen.convert.extend_dictionary`` runs that module as
        # __main__, and runpy warns when the package import (which registers the models) loaded it first
        from ...convert.extend_dictionary import upgrade_pretrained_bart

        upgrade_pretrained_bart(self, state_dict, name, super().upgrade_state_dict_named)


@register_model_architecture("eki_transformer", "eki_transformer")
def eki_transformer_architecture(args):
    eki_defaults(args)
    base_architecture(args)


@register_model_architecture("eki_bart", "eki_bart_base")
def eki_bart_base_architecture(args):
    eki_defaults(args)
    bart_base_architecture(args)


@register_model_architecture("eki_bart", "eki_bart_large")
def eki_bart_large_architecture(args):
    eki_defaults(args)
    bart_large_architecture(args)
