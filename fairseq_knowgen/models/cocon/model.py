"""The CoCon model and its registered architectures, ``cocon_lm`` and ``cocon_lm_small``."""

import torch
from fairseq.models import FairseqEncoderDecoderModel, register_model, register_model_architecture

from ...modules.cocon_block import CONTENT_KV, CONTENT_KV_INIT, INITS
from .config import PREFIX_STATES, CoConSetupError, default_cocon_layer
from .decoder import CoConDecoder
from .encoder import CoConEncoder
from .lm import load_frozen_lm


@register_model("cocon_lm")
class CoConModel(FairseqEncoderDecoderModel):
    """CoCon: the content encoder (LM lower layers on the content) and the CoCon decoder; see
    the module docstring."""

    def __init__(self, args, encoder, decoder):
        super().__init__(encoder, decoder)
        self.args = args

    @staticmethod
    def add_args(parser):
        parser.add_argument("--cocon-lm-path", type=str, metavar="PT", help="frozen fairseq transformer_lm checkpoint")
        parser.add_argument(
            "--cocon-lm-dict", type=str, metavar="TXT", help="its dictionary (default: dict.txt beside it)"
        )
        parser.add_argument(
            "--cocon-layer",
            type=int,
            metavar="L",
            help="the block sits after LM layer L (0 <= L <= layers); default: round(7/24 x layers), the authors' "
            "relative depth (after layer 7 of GPT-2 medium's 24)",
        )
        parser.add_argument("--cocon-ffn-dim", type=int, metavar="N", help="inner size of the block's FFN")
        parser.add_argument(
            "--cocon-attention-heads", type=int, metavar="N", help="heads of the block (default: the LM's)"
        )
        parser.add_argument("--cocon-dropout", type=float, metavar="P", help="dropout in the block")
        parser.add_argument(
            "--cocon-attention-dropout", type=float, metavar="P", help="attention dropout (default 0.1, the authors')"
        )
        parser.add_argument(
            "--cocon-init",
            choices=INITS,
            help="the block's weights: xavier (default; measured better on the toy copy task: docs/methods/cocon.md) "
            "or normal (N(0, 0.02^2), the authors' GPT-2 initializer)",
        )
        parser.add_argument(
            "--cocon-zero-init",
            type=int,
            choices=[0, 1],
            help="1: the block's output projections start at zero (CoCon starts as the LM, but no gradient reaches "
            "the attention until W_o has grown: in the toy probe it learned to read its content within 800 updates "
            "at one seed of three); default 0",
        )
        parser.add_argument(
            "--cocon-content-kv",
            choices=CONTENT_KV,
            help="content keys/values: separate (their own projections on the raw content states, as the "
            "authors' code; default) or shared (the text's projections and LayerNorm)",
        )
        parser.add_argument(
            "--cocon-content-kv-init",
            choices=CONTENT_KV_INIT,
            help="separate content K/V start fresh (default) or as copies of the text's",
        )
        parser.add_argument(
            "--cocon-content-prev-key",
            type=int,
            choices=[0, 1],
            help="1: each content key also reads the previous content column (K_j += h_{j-1} W', W' starting at "
            "zero; beyond the paper and the authors' code), where the query may see that column; 0 (default): "
            "the authors' keys",
        )
        parser.add_argument(
            "--cocon-prefix-states",
            choices=PREFIX_STATES,
            help="what the upper layers read before the prefix's (prompt's) last token: lm (the LM's own states, as "
            "Eq. 7 and the authors; default) or block (the block's output at every position; checkpoints saved "
            "before the flag load with it)",
        )

    @classmethod
    def build_model(cls, args, task):
        cocon_lm_architecture(args)
        lm = load_frozen_lm(args.cocon_lm_path, task.target_dictionary, args.cocon_lm_dict)
        n = len(lm.layers)
        if args.cocon_layer is None:  # the authors' relative depth, recorded in the checkpoint's args
            args.cocon_layer = default_cocon_layer(n)
        if not 0 <= args.cocon_layer <= n:
            raise CoConSetupError(
                f"--cocon-layer {args.cocon_layer} is outside the LM {args.cocon_lm_path} (it has {n} layers: "
                f"0 <= L <= {n})"
            )
        dim = lm.embed_dim if lm.project_in_dim is None else lm.project_in_dim.out_features
        if args.cocon_ffn_dim is None:
            mult = getattr(args, "cocon_ffn_mult", None)
            args.cocon_ffn_dim = mult * dim if mult else (lm.layers[0].fc1.out_features if n else 4 * dim)
        decoder = CoConDecoder(args, task.target_dictionary, lm)
        encoder = CoConEncoder(task.source_dictionary, decoder)
        return cls(args, encoder, decoder)

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        content_tau=None,
        prompt_lengths=None,
        cocon_loss=None,
        **kwargs,
    ):
        """The decoder's output for ``prev_output_tokens`` given the contents in ``src_tokens``;
        with ``cocon_loss`` (the ``cocon`` criterion's), that function of this model instead, so
        that a DDP wrapper sees the whole loss computation in one forward."""
        if cocon_loss is not None:
            return cocon_loss(self)
        encoder_out = self.encoder(
            src_tokens, src_lengths=src_lengths, content_tau=content_tau, prompt_lengths=prompt_lengths
        )
        return self.decoder(prev_output_tokens, encoder_out=encoder_out)

    def train(self, mode: bool = True):
        """The frozen LM always stays in eval mode (its states are a fixed function)."""
        super().train(mode)
        self.decoder.lm.eval()
        return self

    def upgrade_state_dict_named(self, state_dict, name):
        """A checkpoint saved before ``--cocon-content-kv`` existed has no content key/value projections:
        its block used the text's (``shared``); one saved before ``--cocon-content-prev-key`` has no
        W' (its keys read one column). The block is switched to that before the weights load (and the
        flags recorded, so that a checkpoint saved again says so)."""
        prefix = (name + "." if name else "") + "decoder.block.attn."
        has_text = prefix + "k_proj.weight" in state_dict
        has_content = any(k.startswith(prefix + "content_k_proj.") for k in state_dict)
        if has_text and not has_content and self.decoder.block.attn.content_kv_mode == "separate":
            self.decoder.block.attn.share_content_kv()
            self.args.cocon_content_kv = "shared"
        has_prev = any(k.startswith(prefix + "content_prev_k_proj.") for k in state_dict)
        if has_text and not has_prev and hasattr(self.decoder.block.attn, "content_prev_k_proj"):
            self.decoder.block.attn.drop_content_prev_key()
            self.args.cocon_content_prev_key = 0
        # a checkpoint saved before --cocon-prefix-states existed decoded with the block's states everywhere
        version = (name + "." if name else "") + "decoder.cocon_version"
        if version not in state_dict:
            state_dict[version] = self.decoder.cocon_version.clone()
            self.decoder.prefix_states = self.args.cocon_prefix_states = "block"
        gap = (name + "." if name else "") + "decoder.gap_reached_at"
        if gap not in state_dict:
            state_dict[gap] = torch.tensor(-1)
        # a checkpoint whose model held the discriminator: it is the criterion's now
        disc_prefix = (name + "." if name else "") + "discriminator."
        for k in [k for k in state_dict if k.startswith(disc_prefix)]:
            del state_dict[k]
        super().upgrade_state_dict_named(state_dict, name)

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]

    def max_positions(self):
        # one number for source (content) and output alike: both go through the LM's positions
        return self.decoder.max_positions()


@register_model_architecture("cocon_lm", "cocon_lm")
def cocon_lm_architecture(args):
    args.cocon_lm_path = getattr(args, "cocon_lm_path", None)
    args.cocon_lm_dict = getattr(args, "cocon_lm_dict", None)
    args.cocon_layer = getattr(args, "cocon_layer", None)  # None: default_cocon_layer of the LM (build_model)
    args.cocon_ffn_dim = getattr(args, "cocon_ffn_dim", None)
    args.cocon_attention_heads = getattr(args, "cocon_attention_heads", None)
    args.cocon_dropout = getattr(args, "cocon_dropout", None)
    if args.cocon_dropout is None:
        args.cocon_dropout = 0.1
    ad = getattr(args, "cocon_attention_dropout", None)
    args.cocon_attention_dropout = 0.1 if ad is None else ad
    args.cocon_init = getattr(args, "cocon_init", None) or "xavier"
    zi = getattr(args, "cocon_zero_init", None)
    args.cocon_zero_init = 0 if zi is None else zi
    # the discriminator is the cocon criterion's (its config reads these from the same namespace)
    args.cocon_disc_dim = getattr(args, "cocon_disc_dim", None) or 128
    args.cocon_prefix_states = getattr(args, "cocon_prefix_states", None) or "lm"
    # (a checkpoint saved before the flag existed is turned to "shared" as it loads: upgrade_state_dict_named)
    args.cocon_content_kv = getattr(args, "cocon_content_kv", None) or "separate"
    args.cocon_content_kv_init = getattr(args, "cocon_content_kv_init", None) or "fresh"
    # (a checkpoint saved before this flag existed has no W': upgrade_state_dict_named turns it off as it loads)
    prev_key = getattr(args, "cocon_content_prev_key", None)
    args.cocon_content_prev_key = 0 if prev_key is None else prev_key


@register_model_architecture("cocon_lm", "cocon_lm_small")
def cocon_lm_small_architecture(args):
    """The block's FFN 2 x d wide (instead of the LM's), the discriminator 64 wide."""
    args.cocon_disc_dim = getattr(args, "cocon_disc_dim", None) or 64
    args.cocon_ffn_mult = 2  # used when --cocon-ffn-dim is not given
    cocon_lm_architecture(args)
