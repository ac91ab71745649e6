"""K-BERT: a BERT encoder over a sentence tree, with soft positions and the visible matrix.

K-BERT (Liu et al., 2020, "K-BERT: Enabling Language Representation with Knowledge Graph",
section 02): the embedding layer sums token, soft-position and
segment embeddings of the flattened sentence tree (:mod:`..modules.sentence_tree`); the
mask-Transformer applies the visible matrix in the self-attention of every layer
(:mod:`..modules.visible_attention`). Heads: a sentence classifier on the first token (``<s>``,
BERT's [CLS]) and a token tagger.

Flags for the paper's ablations: ``--no-visible-matrix`` (every token sees every token, as plain
BERT on the flattened tree) and ``--no-soft-positions`` (hard positions 0..T-1 along the flattened
tree).

Pretrained starts (``docs/pretrained_kbert.md``): ``--kbert-pretrained PATH`` starts the encoder
from a fairseq RoBERTa / masked-LM checkpoint in the released or the current layout, or from
Google's BERT converted by :mod:`fairseq_knowgen.convert.hf_bert` (same dictionary), whose layer
layout this encoder shares. The file is read by :mod:`fairseq_knowgen.convert.fairseq_legacy`,
which refuses partial loads. It is read only when a model is built for training from it: the
args record that it was loaded (``kbert_pretrained_loaded``, saved in every checkpoint, as
fairseq's wav2vec fine-tuning records ``w2v_args``), so a fine-tuned checkpoint rebuilds
without the file (``load_model_ensemble``, ``kbert_score``, ``fairseq-validate``); only a
``fairseq-train`` resumed with ``--kbert-pretrained`` on its command line reads it again before
the checkpoint's weights replace it. Settings the pretrained model fixes and the flags leave
unset are taken from it and recorded in the args: the encoder's sizes (``--encoder-layers``,
``--encoder-embed-dim``, ``--encoder-ffn-embed-dim``, ``--encoder-attention-heads``) and
``--activation-fn``, so that ``--arch kbert_base --kbert-pretrained PATH`` builds the checkpoint's
encoder whatever its size; ``--num-segments`` (BERT's token types) and ``--layer-norm-eps``
(BERT's 1e-12). A flag given on the command line that differs from the checkpoint is an error,
as is a partial load (:class:`~fairseq_knowgen.textio.DataError`, ``PATH: ...``).
"""

import logging

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.models import FairseqEncoder, FairseqEncoderModel, register_model, register_model_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from torch import Tensor, nn

from ..convert.fairseq_legacy import load_checkpoint_state, load_pretrained_part, upgrade_state
from ..modules.sentence_tree import visible_matrix
from ..modules.visible_attention import VisibleEncoderLayer
from ..textio import DataError

logger = logging.getLogger(__name__)


class KBertEncoder(FairseqEncoder):
    """Token + soft-position (+ segment) embeddings and :class:`VisibleEncoderLayer` s.

    The parameter names are those of fairseq's RoBERTa sentence encoder (``embed_tokens``,
    ``embed_positions``, ``layernorm_embedding``, ``layers.*``; ``segment_embeddings`` as in
    fairseq's ``TransformerSentenceEncoder``), so pretrained encoders load by name.

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
        eps = getattr(args, "layer_norm_eps", None) or 1e-5
        # fairseq's learned positions: index p + padding_idx + 1 for position p, padding at padding_idx
        self.embed_positions = nn.Embedding(self.max_positions_ + self.padding_idx + 1, dim, self.padding_idx)
        num_segments = getattr(args, "num_segments", None) or 0
        self.segment_embeddings = nn.Embedding(num_segments, dim) if num_segments > 0 else None  # token types
        self.layernorm_embedding = None if args.encoder_normalize_before else nn.LayerNorm(dim, eps=eps)
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
                eps,
            )
            for _ in range(args.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim, eps=eps) if args.encoder_normalize_before else None
        self.apply(init_bert_params)
        self.embed_tokens = (
            embed_tokens if embed_tokens is not None else nn.Embedding(len(dictionary), dim, self.padding_idx)
        )
        if embed_tokens is None:
            init_bert_params(self.embed_tokens)

    def add_segment_embeddings(self, num_segments: int):
        """Create the segment (token-type) table, zero: the encoder computes what it did without one."""
        self.segment_embeddings = nn.Embedding(num_segments, self.embed_tokens.embedding_dim)
        nn.init.zeros_(self.segment_embeddings.weight)

    def set_layer_norm_eps(self, eps: float):
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                m.eps = eps

    def attention_mask(self, src_tokens: Tensor, branch_ids: Tensor, mention_ids: Tensor) -> Tensor:
        """bool B x T x T visible matrix, or B x 1 x T key-padding mask with ``--no-visible-matrix``."""
        padding_mask = src_tokens.eq(self.padding_idx)
        if not self.use_visible_matrix:
            return ~padding_mask.unsqueeze(1)
        return visible_matrix(branch_ids, mention_ids, padding_mask)

    def forward(
        self,
        src_tokens,
        soft_positions=None,
        branch_ids=None,
        mention_ids=None,
        segment_ids=None,
        token_embeddings=None,
        **unused,
    ):
        """
        Args:
            src_tokens: B x T (right-padded flattened sentence trees)
            soft_positions, branch_ids, mention_ids: B x T small ints (see ``sentence_tree``);
                ``None`` means a plain sentence (positions 0..T-1, all trunk)
            segment_ids: B x T segment (token-type) ids: 0 for ``<s>`` a ``</s>``, 1 for b ``</s>`` of a
                sentence pair; read when the encoder has segment embeddings; ``None``: all 0
            token_embeddings: B x T x C, used instead of ``embed_tokens(src_tokens)`` when given

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
        tok = self.embed_tokens(src_tokens) if token_embeddings is None else token_embeddings
        x = tok + self.embed_positions(positions)  # B x T x C
        if self.segment_embeddings is not None:
            x = x + self.segment_embeddings(segment_ids if segment_ids is not None else torch.zeros_like(src_tokens))
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
        parser.add_argument(
            "--num-segments",
            type=int,
            metavar="N",
            help="segment (token-type) embeddings; unset: those of --kbert-pretrained (BERT: 2, RoBERTa: none), "
            "2 for sentence-pair data, else none",
        )
        parser.add_argument(
            "--layer-norm-eps",
            type=float,
            metavar="E",
            help="LayerNorm epsilon; unset: --kbert-pretrained's, else 1e-5",
        )
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
            help="start the encoder from this fairseq RoBERTa/masked_lm checkpoint (released or current layout) or "
            "converted BERT (python -m fairseq_knowgen.convert.hf_bert); the same dictionary; read only when "
            "training starts from it",
        )

    @classmethod
    def build_model(cls, args, task):
        # a model rebuilt from a checkpoint has its weights there (the record is saved with the args)
        state = None
        if pretrained_pending(args):
            state, pretrained_args = load_checkpoint_state(args.kbert_pretrained)
            adopt_pretrained_sizes(args, pretrained_args, args.kbert_pretrained)
            _set_defaults(args, BASE_SIZES)  # what the checkpoint's args do not give
        else:
            pretrained_args = None
        kbert_base_architecture(args)  # --max-positions (the position table) is the task's flag
        model = cls(args, KBertEncoder(args, task.source_dictionary))
        if state is not None:
            model.load_pretrained_encoder(state, pretrained_args, args.kbert_pretrained)
        return model

    def load_pretrained_encoder(self, state: dict, pretrained_args, source: str, adopt: bool = True):
        """Load a RoBERTa / masked-LM / converted BERT encoder (``state`` in fairseq's current
        layout, :func:`~fairseq_knowgen.convert.fairseq_legacy.upgrade_state`) into the encoder,
        every tensor of it (:func:`~fairseq_knowgen.convert.fairseq_legacy.load_pretrained_part`;
        the LM head is not K-BERT's). Unset settings that the pretrained model fixes are taken
        from it: its segment table (``--num-segments``) and its LayerNorm epsilon
        (``--layer-norm-eps``); set ones that differ are an error. A segment table the
        pretrained model lacks (RoBERTa) starts at zero. ``adopt=False`` (``--restore-file``, where
        the model is already wrapped for training) creates no table: an unset one is an error."""
        prefix = ENCODER_PREFIX
        segments = state.get(prefix + "segment_embeddings.weight")
        unset = self.encoder.segment_embeddings is None and self.args.num_segments is None
        if adopt and segments is not None and unset:
            self.encoder.add_segment_embeddings(segments.size(0))
        eps = getattr(pretrained_args, "layer_norm_eps", None) if pretrained_args is not None else None
        if eps is not None and eps != (self.args.layer_norm_eps or 1e-5):
            if self.args.layer_norm_eps is not None:
                raise DataError(source, 0, f"LayerNorm epsilon {eps}, --layer-norm-eps {self.args.layer_norm_eps}")
            self.encoder.set_layer_norm_eps(eps)
        act = getattr(pretrained_args, "activation_fn", None) if pretrained_args is not None else None
        if act is not None and act != self.args.activation_fn:
            raise DataError(source, 0, f"pretrained with --activation-fn {act}, not {self.args.activation_fn}")
        new = ["segment_embeddings.weight"] if segments is None else []
        if segments is None and self.encoder.segment_embeddings is not None:
            nn.init.zeros_(self.encoder.segment_embeddings.weight)  # RoBERTa has no token types: start without them
        loaded = load_pretrained_part(self.encoder, state, prefix, source, extras=(LM_HEAD_PREFIX,), new=new)
        # recorded in the args (saved with every checkpoint): what was taken, and that it was
        table = self.encoder.segment_embeddings
        self.args.num_segments = table.num_embeddings if table is not None else 0
        self.args.layer_norm_eps = eps or self.args.layer_norm_eps
        self.args.kbert_pretrained_loaded = True
        logger.info(f"K-BERT encoder from {source}: all {len(loaded)} tensors loaded")

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
        """A RoBERTa / masked-LM checkpoint (released or current layout) or a converted BERT given
        to ``--restore-file`` (with ``--reset-optimizer --reset-dataloader --reset-meters
        --reset-lr-scheduler``) becomes a K-BERT state: its encoder loaded as by
        ``--kbert-pretrained`` (all of it, or an error), our heads as initialized."""
        prefix = name + "." if name else ""
        if any(k.startswith(prefix + p) for k in state_dict for p in (ENCODER_PREFIX, "decoder.sentence_encoder.")):
            theirs = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
            for k in [k for k in state_dict if k.startswith(prefix)]:
                del state_dict[k]
            self.load_pretrained_encoder(upgrade_state(theirs), None, "--restore-file", adopt=False)
            state_dict.update({prefix + k: v for k, v in self.state_dict().items()})
        super().upgrade_state_dict_named(state_dict, name)


ENCODER_PREFIX = "encoder.sentence_encoder."  # RoBERTa's / masked_lm's encoder in fairseq's current layout
LM_HEAD_PREFIX = "encoder.lm_head."  # its masked-LM head, not part of K-BERT


BASE_SIZES = {
    "encoder_layers": 12,
    "encoder_embed_dim": 768,
    "encoder_ffn_embed_dim": 3072,
    "encoder_attention_heads": 12,
    "activation_fn": "gelu",
}
SMALL_SIZES = {**BASE_SIZES, "encoder_layers": 4, "encoder_embed_dim": 256, "encoder_ffn_embed_dim": 1024}
SMALL_SIZES["encoder_attention_heads"] = 4


def pretrained_pending(args) -> bool:
    """Whether ``--kbert-pretrained`` is still to be read (training starts from it): then the
    encoder's sizes are the checkpoint's, and the arch functions leave unset ones unset."""
    return bool(getattr(args, "kbert_pretrained", None)) and not getattr(args, "kbert_pretrained_loaded", False)


def adopt_pretrained_sizes(args, pretrained_args, source: str):
    """Sizes and activation (:data:`BASE_SIZES`' keys) that the flags leave unset <- the pretrained
    checkpoint's args; one given on the command line that differs from them is an error. So
    ``--arch kbert_base --kbert-pretrained DIR/model.pt`` builds the checkpoint's encoder, whatever
    its size (BERT-base, a 6 x 384 MiniLM, the recipe's 4 x 256 masked LM)."""
    for key in BASE_SIZES:
        theirs = getattr(pretrained_args, key, None) if pretrained_args is not None else None
        ours = getattr(args, key, None)
        if ours is None:
            setattr(args, key, theirs)  # None when the checkpoint does not say: the arch's default follows
        elif theirs is not None and ours != theirs:
            flag = "--" + key.replace("_", "-")
            raise DataError(source, 0, f"the pretrained encoder has {flag} {theirs}, the command line says {ours}")


def _set_defaults(args, defaults: dict):
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


@register_model_architecture("kbert", "kbert_base")
def kbert_base_architecture(args):
    """BERT-base sizes: 12 layers, 768 wide, 12 heads, FFN 3072, 512 positions; heads without
    dropout (``--pooler-dropout 0``, as the authors' classifier and tagger). With ``--kbert-pretrained``
    the sizes are the checkpoint's (:func:`adopt_pretrained_sizes`)."""
    if not pretrained_pending(args):
        _set_defaults(args, BASE_SIZES)
    for name, default in (("dropout", 0.1), ("attention_dropout", 0.1), ("activation_dropout", 0.0)):
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    if getattr(args, "pooler_dropout", None) is None:
        args.pooler_dropout = 0.0  # the authors' heads: no dropout between the encoder and the output layers
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False) or False
    # num_segments and layer_norm_eps stay unset (None) until a pretrained start or the data fix them
    args.num_segments = getattr(args, "num_segments", None)
    args.layer_norm_eps = getattr(args, "layer_norm_eps", None)
    args.max_positions = getattr(args, "max_positions", None) or 512
    args.no_visible_matrix = getattr(args, "no_visible_matrix", False) or False
    args.no_soft_positions = getattr(args, "no_soft_positions", False) or False
    args.kbert_pretrained = getattr(args, "kbert_pretrained", None)


@register_model_architecture("kbert", "kbert_small")
def kbert_small_architecture(args):
    """4 layers, 256 wide, 4 heads, FFN 1024 (CPU-sized; the recipe's character-level MLM matches it),
    ``--pooler-dropout 0.1``. With ``--kbert-pretrained`` the sizes are the checkpoint's, as for ``kbert_base``."""
    if not pretrained_pending(args):
        _set_defaults(args, SMALL_SIZES)
    if getattr(args, "pooler_dropout", None) is None:
        args.pooler_dropout = 0.1  # the recipe's CPU-sized runs (docs/results/kbert.md) were measured with it
    kbert_base_architecture(args)
