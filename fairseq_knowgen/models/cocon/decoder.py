"""The CoCon decoder: the frozen LM's lower layers, the CoCon block, the LM's upper layers (Eq. 4-7)."""

from typing import List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor

from ...modules.cocon_block import CoConBlock
from .lm import lm_activation


class CoConDecoder(FairseqIncrementalDecoder):
    """The frozen LM's lower layers, the CoCon block, the LM's upper layers (Eq. 4-7).

    ``bypass = True`` skips the block: the decoder is then exactly the frozen LM (the plain and
    the prompted LM baselines decode through it; the ``cocon_generation`` task's ``--cocon-mode lm``).
    """

    def __init__(self, args, dictionary, lm):
        super().__init__(dictionary)
        self.lm = lm
        self.split = args.cocon_layer
        self.embed_dim = lm.embed_dim if lm.project_in_dim is None else lm.project_in_dim.out_features
        heads = lm.layers[0].self_attn.num_heads if len(lm.layers) else args.cocon_attention_heads
        self.block = CoConBlock(
            self.embed_dim,
            args.cocon_attention_heads or heads,
            args.cocon_ffn_dim,
            dropout=args.cocon_dropout,
            attention_dropout=args.cocon_attention_dropout,
            zero_init=bool(args.cocon_zero_init),
            activation=lm_activation(lm),
            content_kv=args.cocon_content_kv,
            content_kv_init=args.cocon_content_kv_init,
            content_prev_key=bool(args.cocon_content_prev_key),
            init=args.cocon_init,
        )
        self.lm_vocab = lm.output_projection.out_features
        self.bypass = False
        self.prefix_states = args.cocon_prefix_states
        # decoding with a fixed length (the task's --cocon-fixed-len): </s> gets no probability before each row's
        # prompt and this many new tokens, whatever step fairseq's search is at (it forces prompts of several
        # lengths for the batch's longest one, and bans </s> only after), and <s> none at all
        self.min_new_tokens = 0
        # marks checkpoints saved since --cocon-prefix-states existed (earlier ones decoded with "block")
        self.register_buffer("cocon_version", torch.tensor(2))
        # training state of the cocon criterion's --cocon-start-after-gap: the update at which the dev gap was reached
        # (-1: not yet), here so that every checkpoint keeps it
        self.register_buffer("gap_reached_at", torch.tensor(-1))

    # -- the LM's pieces ------------------------------------------------------------------
    def embed(
        self,
        tokens: Tensor,
        incremental_state=None,
        token_embeddings: Optional[Tensor] = None,
        new: Optional[int] = None,
    ):
        """The LM's input embedding (as fairseq's ``extract_features``) of the last ``new`` positions
        of ``tokens`` (default: the last one in incremental mode, else all); ``token_embeddings``
        (``B x new x C``, unscaled) replace their lookup (soft tokens). Returns ``new x B x C`` and
        the padding mask of those positions (None without padding)."""
        lm = self.lm
        if new is None:
            new = token_embeddings.size(1) if token_embeddings is not None else (1 if incremental_state else None)
        if new == 1 and incremental_state is not None:
            # fairseq's O(1) position of the one new step
            positions = lm.embed_positions(tokens, incremental_state=incremental_state) if lm.embed_positions else None
        else:
            positions = lm.embed_positions(tokens) if lm.embed_positions else None
        if new is not None:
            tokens = tokens[:, -new:]
            if positions is not None:
                positions = positions[:, -new:]
        if token_embeddings is None:
            # beam search carries -inf candidates, among them the task's extra symbols (<sep>, <prompt>),
            # which the LM has no embedding for: they never win, any embedding will do
            vocab = lm.embed_tokens.num_embeddings
            x = lm.embed_tokens(tokens.masked_fill(tokens >= vocab, lm.dictionary.unk()))
        else:
            x = token_embeddings
        x = lm.embed_scale * x
        if lm.project_in_dim is not None:
            x = lm.project_in_dim(x)
        if positions is not None:
            x = x + positions
        if lm.layernorm_embedding is not None:
            x = lm.layernorm_embedding(x)
        x = lm.dropout_module(x)
        # one new decoding step is never padding (fairseq's search feeds finished rows no more tokens);
        # otherwise the mask, whether or not it marks anything (no host-device sync to find out)
        pad = None if (new == 1 and incremental_state is not None) else tokens.eq(lm.padding_idx)
        return x.transpose(0, 1), pad

    def run_layers(self, x: Tensor, layers, incremental_state=None, padding_mask: Optional[Tensor] = None):
        # causal mask whenever several positions come at once (also the first incremental call
        # with a whole prefix: fairseq passes none in incremental mode, assuming one step)
        mask = self.lm.buffered_future_mask(x) if x.size(0) > 1 else None
        for layer in layers:
            x, _, _ = layer(x, None, None, incremental_state, self_attn_mask=mask, self_attn_padding_mask=padding_mask)
        return x

    def lower(
        self,
        tokens: Tensor,
        incremental_state=None,
        token_embeddings: Optional[Tensor] = None,
        new=None,
        padding_mask: bool = True,
    ):
        """``enc``: the states after layer ``l`` of the last ``new`` positions (see :meth:`embed`;
        ``T x B x C``) and their padding mask. ``padding_mask=False`` for right-padded rows: under
        the causal mask no real position sees a later pad, so the states of real positions are the
        same without it (and torch's attention takes its fast path)."""
        x, pad = self.embed(tokens, incremental_state, token_embeddings, new)
        return self.run_layers(x, self.lm.layers[: self.split], incremental_state, pad if padding_mask else None), pad

    def upper(self, h: Tensor, incremental_state=None, padding_mask: Optional[Tensor] = None) -> Tensor:
        """``dec`` up to the features: layers ``l..``, final LayerNorm; ``B x T x C``."""
        x = self.run_layers(h, self.lm.layers[self.split :], incremental_state, padding_mask)
        if self.lm.layer_norm is not None:
            x = self.lm.layer_norm(x)
        x = x.transpose(0, 1)
        if self.lm.project_out_dim is not None:
            x = self.lm.project_out_dim(x)
        return x

    def lm_logits(self, features: Tensor) -> Tensor:
        """Logits over the LM's vocabulary only (training)."""
        return self.lm.output_projection(features)

    def encode_content_tensor(self, content: Tensor):
        """Lower-layer states of right-padded contents ``B x L`` (no ``</s>``), each run alone
        after ``</s>``: ``L x B x C`` and the ``B x L`` padding mask."""
        eos = self.lm.dictionary.eos()
        toks = torch.cat([content.new_full((content.size(0), 1), eos), content], dim=1)
        h, _ = self.lower(toks, padding_mask=False)  # right-padded
        return h[1:], content.eq(self.lm.padding_idx)

    def encode_contents(self, contents: List[List[int]], device, soft: Optional[Tensor] = None):
        """Lower-layer states of contents run alone: ``N x Lmax x C`` and the ``N x Lmax``
        padding mask. Each content is preceded by ``</s>`` (the LM's start), whose state is
        dropped. ``soft`` (``N x L x C`` unscaled embeddings, e.g. softmax-weighted) replaces the
        token lookup of every content position (then ``contents`` is ignored)."""
        eos, pad = self.lm.dictionary.eos(), self.lm.padding_idx
        if soft is not None:
            N, L = soft.shape[:2]
            toks = torch.full((N, L + 1), eos, dtype=torch.long, device=device)
            bos = self.lm.embed_tokens(toks[:, :1])
            h, _ = self.lower(toks, token_embeddings=torch.cat([bos, soft], dim=1))
            return h[1:].transpose(0, 1), torch.zeros(N, L, dtype=torch.bool, device=device)
        Lmax = max(len(c) for c in contents)
        toks = torch.full((len(contents), Lmax + 1), pad, dtype=torch.long)
        toks[:, 0] = eos
        for i, c in enumerate(contents):
            toks[i, 1 : len(c) + 1] = torch.tensor(c, dtype=torch.long)
        toks = toks.to(device)
        h, _ = self.lower(toks, padding_mask=False)  # right-padded
        return h[1:].transpose(0, 1), toks[:, 1:].eq(pad)

    # -- fairseq decoder interface --------------------------------------------------------
    def with_prefix_states(self, h: Tensor, h_block: Tensor, prefix_len, start: int = 0) -> Tensor:
        """What ``dec`` receives (Eq. 7, ``o~_t = dec([h_{:t-2}; h'_{t-1}])``): at positions before
        ``prefix_len`` (an int or ``B`` per row: positions 0 .. prefix_len - 1 hold ``</s>`` and the
        prefix but its last token) the LM's own states ``h``, from the prefix's last token on the
        block's ``h_block`` (``T x B x C``, positions ``start`` ..). With ``--cocon-prefix-states
        block`` (or no prefix length) ``h_block`` everywhere."""
        if self.prefix_states != "lm" or prefix_len is None:
            return h_block
        pos = torch.arange(start, start + h.size(0), device=h.device)[:, None]  # T x 1
        keep = pos < (prefix_len[None, :] if torch.is_tensor(prefix_len) else prefix_len)
        return torch.where(keep.unsqueeze(-1), h, h_block)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        h, pad = self.lower(prev_output_tokens, incremental_state)
        if not self.bypass:
            content = mask = bias = rows = None
            cached = incremental_state is not None and self.block.attn.get_incremental_state(incremental_state, "cocon")
            if encoder_out is not None and not cached:  # after the first step the block has the content's K/V
                content = encoder_out["content"][0]
                mask, bias = encoder_out["content_padding_mask"][0], encoder_out["content_bias"][0]
                rows = encoder_out["content_rows"][0]
            h_block, _ = self.block(h, content, mask, bias, incremental_state=incremental_state, content_rows=rows)
            prompt = encoder_out.get("prompt_lengths") if encoder_out is not None else None
            start = prev_output_tokens.size(1) - h.size(0)  # the first new position (incremental: the last)
            h = self.with_prefix_states(h, h_block, prompt[0] if prompt else None, start)
        return self.upper(h, incremental_state, pad), {"attn": [None]}

    def output_layer(self, features):
        """The LM's logits, widened with -inf for the task's extra symbols (``<sep>``, ``<prompt>``)."""
        logits = self.lm_logits(features)
        extra = len(self.dictionary) - logits.size(-1)
        return F.pad(logits, (0, extra), value=float("-inf")) if extra > 0 else logits

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only=False, **kwargs):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if features_only:
            return x, extra
        logits = self.output_layer(x)
        if self.min_new_tokens and encoder_out is not None:
            prompt = encoder_out.get("prompt_lengths")
            lengths = prompt[0] if prompt else torch.zeros(x.size(0), dtype=torch.long, device=x.device)
            start = prev_output_tokens.size(1) - x.size(1)
            pos = torch.arange(start, start + x.size(1), device=x.device)[None, :]  # the output token each predicts
            early = pos < (lengths[:, None] + self.min_new_tokens)  # B x T
            eos = self.dictionary.eos()
            logits[:, :, eos] = logits[:, :, eos].masked_fill(early, float("-inf"))
            # nor <s> anywhere: the LM never saw it in its text, and fairseq prints it as nothing, so an output with
            # one would read a token short of the fixed length
            logits[:, :, self.dictionary.bos()] = float("-inf")
        return logits, extra

    def max_positions(self):
        return self.lm.max_positions()
