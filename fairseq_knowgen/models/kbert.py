"""K-BERT: a BERT encoder over a sentence tree, with soft positions and the visible matrix.

K-BERT (Liu et al., 2020, "K-BERT: Enabling Language Representation with Knowledge Graph",
``../shared/seeds/k_bert.zh.txt``, section 02): the embedding layer sums token, soft-position and
segment embeddings of the flattened sentence tree (:mod:`..modules.sentence_tree`); the
mask-Transformer applies the visible matrix in the self-attention of every layer
(:mod:`..modules.visible_attention`). Heads: a sentence classifier on the first token (``<s>``,
BERT's [CLS]) and a token tagger.

Flags for the paper's ablations: ``--no-visible-matrix`` (every token sees every token, as plain
BERT on the flattened tree) and ``--no-soft-positions`` (hard positions 0..T-1 along the flattened
tree). ``--kbert-pretrained PATH`` starts the encoder from a fairseq RoBERTa / masked-LM
checkpoint (``encoder.sentence_encoder.*`` weights; same dictionary), whose layer layout this
encoder shares.
"""

import logging

import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils, utils
from fairseq.models import FairseqEncoder, FairseqEncoderModel, register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from torch import Tensor, nn

from ..modules.sentence_tree import visible_matrix
from ..modules.visible_attention import VisibleEncoderLayer

logger = logging.getLogger(__name__)


class KBertEncoder(FairseqEncoder):
    """Token + soft-position (+ segment) embeddings and :class:`VisibleEncoderLayer` s.

    Args:
        args: the model's arguments (sizes, dropouts, ``no_visible_matrix``, ``no_soft_positions``)
        dictionary: the token dictionary
        embed_tokens: a token embedding to use (shared with a decoder); a new one when ``None``
        max_positions: size of the position table (default ``args.max_positions``)
    """

    def __init__(self, args, dictionary, embed_tokens=None, max_positions=None):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.max_positions_ = max_positions or args.max_positions
        self.use_visible_matrix = not args.no_visible_matrix
        self.use_soft_positions = not args.no_soft_positions
        dim = args.encoder_embed_dim
        # fairseq's learned positions: index p + padding_idx + 1 for position p, padding at padding_idx
        self.embed_positions = nn.Embedding(self.max_positions_ + self.padding_idx + 1, dim, self.padding_idx)
        self.embed_segments = nn.Embedding(args.num_segments, dim) if args.num_segments > 0 else None
        self.layernorm_embedding = None if args.encoder_normalize_before else nn.LayerNorm(dim)
        self.dropout = args.dropout
        self.layers = nn.ModuleList(
            VisibleEncoderLayer(
                dim,
                args.encoder_ffn_embed_dim,
                args.encoder_attention_heads,
                args.dropout,
                args.attention_dropout,
                args.activation_dropout,
                args.activation_fn,
                args.encoder_normalize_before,
            )
            for _ in range(args.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim) if args.encoder_normalize_before else None
        self.apply(init_bert_params)
        self.embed_tokens = (
            embed_tokens if embed_tokens is not None else nn.Embedding(len(dictionary), dim, self.padding_idx)
        )
        if embed_tokens is None:
            init_bert_params(self.embed_tokens)

    def attention_mask(self, src_tokens: Tensor, branch_ids: Tensor, mention_ids: Tensor) -> Tensor:
        """bool B x T x T visible matrix, or B x 1 x T key-padding mask with ``--no-visible-matrix``."""
        padding_mask = src_tokens.eq(self.padding_idx)
        if not self.use_visible_matrix:
            return ~padding_mask.unsqueeze(1)
        return visible_matrix(branch_ids, mention_ids, padding_mask)

    def forward(self, src_tokens, soft_positions=None, branch_ids=None, mention_ids=None, segment_ids=None, **unused):
        """
        Args:
            src_tokens: B x T (right-padded flattened sentence trees)
            soft_positions, branch_ids, mention_ids: B x T small ints (see ``sentence_tree``);
                ``None`` means a plain sentence (positions 0..T-1, all trunk)
            segment_ids: B x T, with ``--num-segments`` > 0

        Returns:
            dict with ``encoder_out`` [T x B x C] and ``encoder_padding_mask`` [B x T]
        """
        padding_mask = src_tokens.eq(self.padding_idx)
        if soft_positions is None or not self.use_soft_positions:  # hard positions 0, 1, ... (left or right padding)
            soft_positions = torch.cumsum(~padding_mask, dim=1) - 1
        if branch_ids is None:
            branch_ids = torch.zeros_like(src_tokens)
            mention_ids = torch.zeros_like(src_tokens)
        positions = (soft_positions + self.padding_idx + 1).masked_fill(padding_mask, self.padding_idx)
        x = self.embed_tokens(src_tokens) + self.embed_positions(positions)  # B x T x C
        if self.embed_segments is not None:
            x = x + self.embed_segments(segment_ids if segment_ids is not None else torch.zeros_like(src_tokens))
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        mask = self.attention_mask(src_tokens, branch_ids, mention_ids)  # one mask for every layer and head
        for layer in self.layers:
            x = layer(x, mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return {
            "encoder_out": [x.transpose(0, 1)],  # T x B x C
            "encoder_padding_mask": [padding_mask],
            "encoder_embedding": [],
            "encoder_states": [],
            "src_tokens": [],
            "src_lengths": [],
        }

    def reorder_encoder_out(self, encoder_out, new_order):
        return {
            "encoder_out": [encoder_out["encoder_out"][0].index_select(1, new_order)],
            "encoder_padding_mask": [encoder_out["encoder_padding_mask"][0].index_select(0, new_order)],
            "encoder_embedding": [],
            "encoder_states": [],
            "src_tokens": [],
            "src_lengths": [],
        }

    def max_positions(self):
        return self.max_positions_


class KBertClassificationHead(nn.Module):
    """RoBERTa's sentence head: dense + tanh + dropout + projection on the first token."""

    def __init__(self, dim: int, num_classes: int, pooler_dropout: float):
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(pooler_dropout)
        self.out_proj = nn.Linear(dim, num_classes)

    def forward(self, features: Tensor) -> Tensor:
        """features: B x T x C -> B x num_classes"""
        x = self.dropout(features[:, 0, :])
        return self.out_proj(self.dropout(torch.tanh(self.dense(x))))


class KBertTaggingHead(nn.Module):
    """A per-token projection: B x T x C -> B x T x num_tags."""

    def __init__(self, dim: int, num_tags: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(dim, num_tags)

    def forward(self, features: Tensor) -> Tensor:
        return self.out_proj(self.dropout(features))


@register_model("kbert")
class KBertModel(FairseqEncoderModel):
    """K-BERT (Liu et al., 2020) with named sentence-classification and tagging heads.

    ``forward`` follows RoBERTa's interface (fairseq's ``sentence_prediction`` criterion calls
    ``model(**net_input, features_only=True, classification_head_name=NAME)``); the tagging
    criterion passes ``tagging_head_name``.
    """

    def __init__(self, args, encoder):
        super().__init__(encoder)
        self.args = args
        self.classification_heads = nn.ModuleDict()
        self.tagging_heads = nn.ModuleDict()

    @staticmethod
    def add_args(parser):
        parser.add_argument("--encoder-layers", type=int, metavar="N")
        parser.add_argument("--encoder-embed-dim", type=int, metavar="N")
        parser.add_argument("--encoder-ffn-embed-dim", type=int, metavar="N")
        parser.add_argument("--encoder-attention-heads", type=int, metavar="N")
        parser.add_argument("--activation-fn", choices=utils.get_available_activation_fns())
        parser.add_argument("--dropout", type=float, metavar="D")
        parser.add_argument("--attention-dropout", type=float, metavar="D")
        parser.add_argument("--activation-dropout", type=float, metavar="D")
        parser.add_argument("--pooler-dropout", type=float, metavar="D", help="dropout of the heads")
        parser.add_argument("--encoder-normalize-before", action="store_true", help="pre-LN layers (BERT: post-LN)")
        parser.add_argument("--num-segments", type=int, metavar="N", help="segment embeddings (0: none, as RoBERTa)")
        parser.add_argument(
            "--no-visible-matrix",
            action="store_true",
            help="ablation: every token sees every token of the flattened tree (no mask-self-attention)",
        )
        parser.add_argument(
            "--no-soft-positions", action="store_true", help="ablation: hard positions 0..T-1 along the flattened tree"
        )
        parser.add_argument(
            "--kbert-pretrained",
            metavar="PATH",
            help="start the encoder from this fairseq RoBERTa/masked_lm checkpoint (encoder.sentence_encoder.*; "
            "the same dictionary)",
        )

    @classmethod
    def build_model(cls, args, task):
        kbert_base_architecture(args)  # --max-positions (the position table) is the task's flag
        model = cls(args, KBertEncoder(args, task.source_dictionary))
        if getattr(args, "kbert_pretrained", None):
            model.load_pretrained_encoder(args.kbert_pretrained)
        return model

    def load_pretrained_encoder(self, path: str):
        """Copy ``encoder.sentence_encoder.*`` (RoBERTa / masked_lm) weights into the encoder
        (see :func:`encoder_state_from_roberta`)."""
        state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
        ours, loaded = encoder_state_from_roberta(state, self.encoder.state_dict(), path)
        self.encoder.load_state_dict(ours)
        missing = sorted(set(ours) - set(loaded))
        logger.info(f"K-BERT encoder from {path}: {len(loaded)} tensors loaded, kept initial: {missing}")

    def register_classification_head(self, name: str, num_classes: int):
        if name not in self.classification_heads:
            dim = self.args.encoder_embed_dim
            self.classification_heads[name] = KBertClassificationHead(dim, num_classes, self.args.pooler_dropout)

    def register_tagging_head(self, name: str, num_tags: int):
        if name not in self.tagging_heads:
            self.tagging_heads[name] = KBertTaggingHead(self.args.encoder_embed_dim, num_tags, self.args.pooler_dropout)

    def forward(
        self,
        src_tokens,
        soft_positions=None,
        branch_ids=None,
        mention_ids=None,
        segment_ids=None,
        features_only=False,
        classification_head_name=None,
        tagging_head_name=None,
        **unused,
    ):
        """Returns ``(out, extra)``: out is B x T x C features, B x classes logits
        (``classification_head_name``) or B x T x tags logits (``tagging_head_name``)."""
        enc = self.encoder(src_tokens, soft_positions, branch_ids, mention_ids, segment_ids)
        x = enc["encoder_out"][0].transpose(0, 1)  # B x T x C
        extra = {"padding_mask": enc["encoder_padding_mask"][0]}
        if classification_head_name is not None:
            x = self.classification_heads[classification_head_name](x)
        elif tagging_head_name is not None:
            x = self.tagging_heads[tagging_head_name](x)
        return x, extra

    def upgrade_state_dict_named(self, state_dict, name):
        """A RoBERTa / masked_lm checkpoint given to ``--restore-file`` (with ``--reset-optimizer
        --reset-dataloader --reset-meters --reset-lr-scheduler``) becomes a K-BERT state: its
        ``encoder.sentence_encoder.*`` weights as ``encoder.*``, its LM head dropped, our heads
        (and anything else it lacks) as initialized."""
        prefix = name + "." if name else ""
        if any(k.startswith(prefix + "encoder.sentence_encoder.") for k in state_dict):
            roberta = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
            ours, loaded = encoder_state_from_roberta(roberta, self.encoder.state_dict(), "--restore-file")
            for k in [k for k in state_dict if k.startswith(prefix)]:
                del state_dict[k]
            for k, v in self.state_dict().items():
                state_dict[prefix + k] = ours[k[len("encoder.") :]] if k.startswith("encoder.") else v
            logger.info(f"K-BERT from a RoBERTa/masked_lm checkpoint: {len(loaded)} encoder tensors loaded")
        super().upgrade_state_dict_named(state_dict, name)


def encoder_state_from_roberta(state: dict, ours: dict, path: str):
    """``ours`` (the K-BERT encoder's state dict) with the ``encoder.sentence_encoder.*`` tensors of
    a fairseq RoBERTa / masked_lm ``state`` put in, and the names loaded. The layer layout is the
    same; position tables of another length are copied up to the shorter one; any other shape
    difference (another dictionary or size) is an error."""
    prefix = "encoder.sentence_encoder."
    ours, loaded = dict(ours), []
    for key, value in state.items():
        name = key[len(prefix) :]
        if not key.startswith(prefix) or name not in ours:
            continue
        target = ours[name]
        if name == "embed_positions.weight" and value.shape != target.shape:
            n = min(value.size(0), target.size(0))
            value, target = torch.cat([value[:n], target[n:]]), target
        if value.shape != target.shape:
            raise ValueError(
                f"{path}: {key} has shape {tuple(value.shape)}, the K-BERT encoder {tuple(target.shape)} "
                "(pretrain with the same dictionary and sizes)"
            )
        ours[name] = value
        loaded.append(name)
    if not any(n.startswith("layers.") for n in loaded):
        raise ValueError(f"{path}: no encoder.sentence_encoder.layers.* weights (not a RoBERTa/masked_lm model?)")
    return ours, loaded


@register_model_architecture("kbert", "kbert_base")
def kbert_base_architecture(args):
    """BERT-base sizes: 12 layers, 768 wide, 12 heads, FFN 3072, 512 positions."""
    args.encoder_layers = getattr(args, "encoder_layers", None) or 12
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", None) or 768
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", None) or 3072
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", None) or 12
    args.activation_fn = getattr(args, "activation_fn", None) or "gelu"
    for name, default in (("dropout", 0.1), ("attention_dropout", 0.1), ("activation_dropout", 0.0)):
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    if getattr(args, "pooler_dropout", None) is None:
        args.pooler_dropout = 0.1
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False) or False
    if getattr(args, "num_segments", None) is None:
        args.num_segments = 0
    args.max_positions = getattr(args, "max_positions", None) or 512
    args.no_visible_matrix = getattr(args, "no_visible_matrix", False) or False
    args.no_soft_positions = getattr(args, "no_soft_positions", False) or False
    args.kbert_pretrained = getattr(args, "kbert_pretrained", None)


@register_model_architecture("kbert", "kbert_small")
def kbert_small_architecture(args):
    """4 layers, 256 wide, 4 heads, FFN 1024 (CPU-sized; the recipe's character-level MLM matches it)."""
    args.encoder_layers = getattr(args, "encoder_layers", None) or 4
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", None) or 256
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", None) or 1024
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", None) or 4
    kbert_base_architecture(args)


@register_model("kbert_transformer")
class KBertTransformerModel(TransformerModel):
    """A transformer whose encoder is K-BERT's (Liu et al., 2020): the source is a sentence tree
    (knowledge injected by the ``kbert_translation`` task) read with soft positions and the
    visible matrix; the decoder is fairseq's, with incremental decoding, attending to every
    encoder state (sentence and knowledge tokens alike). Beyond the paper, which only encodes."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        parser.add_argument("--no-visible-matrix", action="store_true", help="ablation: no mask-self-attention")
        parser.add_argument("--no-soft-positions", action="store_true", help="ablation: hard positions")

    @classmethod
    def build_model(cls, args, task):
        """fairseq's transformer with its encoder replaced by :class:`KBertEncoder` (same,
        possibly shared, token embedding)."""
        kbert_transformer_architecture(args)
        model = super().build_model(args, task)
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
        encoder_out = self.encoder(src_tokens, soft_positions, branch_ids, mention_ids)
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
