"""Diminishing attention (DimAttn) and dynamic diminishing attention (DyDimAttn).

Han, Lin and Joty, "Resurrecting Submodularity for Neural Text Generation". For every
cross-attention head, with raw attention probabilities a_i^t over source positions i at target
step t:

- coverage, up to *and including* the current step (the paper's footnote 1)::

      c_i^t = sum_{t'=0..t} a_i^{t'}

- submodular coverage (Eq. 3), g concave and non-decreasing, b = -g(0)::

      F(A_i^t) = g(c_i^t) + b

- diminishing attention (Eq. 4), the weight of encoder state i in the context at step t::

      DimAttn_i^t = F(A_i^t) - F(A_i^{t-1}) = g(c_i^t) - g(c_i^{t-1})

  Summed over all steps it telescopes to g(c_i^T) - g(0): the *effective* coverage is
  submodular, and the same raw attention buys less the more a state is already covered.
  It is computed as g's increment at c_i^{t-1} by a_i^t in a form without cancellation,
  e.g. log1p(a / (1 + c^{t-1})) for log (see :class:`ConcaveFunction`): in float32 the
  plain difference of two nearly equal logs is noise once the coverage is large.

- dynamic diminishing attention (Eq. 5), with g1 diminishing faster than g2 (g1' <= g2')::

      P_i^t = max_{t' <= t-1} a_i^{t'}          (0 at t = 0)
      DyDimAttn_i^t = P_i^t * DimAttn_i^t[g1] + (1 - P_i^t) * DimAttn_i^t[g2]

  :func:`check_slower_diminishing` verifies g1' <= g2' numerically (the models call it at
  build time).

Choices the text leaves open, each a flag of the architectures:

- normalization: the paper's form is unnormalized (weights sum to less than 1 once a state
  is covered); ``normalize=True`` divides the weights by their sum over source positions;
- dropout: coverage is accumulated from the raw (pre-dropout) probabilities and dropout is
  applied to the final weights, so that training noise does not leak into the coverage;
- defaults: DimAttn uses g = log(x+1); DyDimAttn uses g1 = log(x+1) and g2 = 2 sqrt(x+1)
  (``2*sqrt``), the paper's two examples. The paper requires g1' <= g2'; its examples as
  written cross at c = 3 (1/(1+c) > 0.5/sqrt(1+c) below it), so neither order holds on all
  coverages. Scaled by 2, sqrt's derivative 1/sqrt(1+c) bounds log's 1/(1+c) from above at
  every c >= 0 and equals it at c = 0: both weights start as the raw attention, and log's
  diminishes faster from there. (Checkpoints record their g2: one trained when the default
  was g2 = x keeps x.)

Training computes all steps at once with a cumulative sum and a cumulative max over target
time; incremental decoding keeps the running coverage c^{t-1} and running max per
(sentence x beam, head, source position) in fairseq's incremental state, so that every
step costs the same however many steps came before.

Memory: the weights are a chain of ``(B*H) x T x S`` operations (logits, softmax, cumulative
sum and max, g's increments, dropout), each of which autograd would keep for backward. With
gradients, the chain from the projected queries and keys to the weights after dropout runs
under ``torch.utils.checkpoint`` (non-reentrant, RNG state restored so that dropout draws the
same mask): backward recomputes it, and the layer keeps one float32 ``(B*H) x T x S`` tensor
for backward, the weights that mix the values, at the price of computing the weights twice
per training step.
"""

import math
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .cross_attention import ReweightedCrossAttention


class ConcaveFunction:
    """A concave non-decreasing g (Eq. 3) and its increment g(c + a) - g(c) (Eq. 4), optionally
    scaled: ``K*G`` is K times G for K > 0 (e.g. ``2*sqrt``, 2 sqrt(x+1)), still concave and
    non-decreasing.

    The increment is what DimAttn uses; it is computed in a form without cancellation, so
    that float32 keeps its precision when the coverage c is large and the attention a
    small (the plain difference g(c + a) - g(c) of two nearly equal numbers loses all of it):

    - ``log``: g = log(x+1); g(c + a) - g(c) = log((1+c+a)/(1+c)) = log1p(a / (1+c));
    - ``sqrt``: g = sqrt(x+1); the difference times the conjugate: a / (sqrt(1+c+a) + sqrt(1+c));
    - ``pow:P``: g = (x+1)^P, 0 < P < 1; (1+c)^P * expm1(P * log1p(a / (1+c)));
    - ``identity``: g = x (linear: reproduces standard attention, for ablations and tests); a.
    """

    def __init__(self, spec: str):
        self.spec = spec
        self.scale = 1.0
        self.p: Optional[float] = None
        base = spec
        if "*" in spec:
            factor, base = spec.split("*", 1)
            try:
                self.scale = float(factor)
            except ValueError:
                raise ValueError(f"g = K*G needs a number K, got {spec!r}") from None
            if not (0.0 < self.scale < math.inf):
                raise ValueError(f"g = K*G needs K > 0, got {spec!r}")
        self.base = base
        if base.startswith("pow:"):
            try:
                self.p = float(base[4:])
            except ValueError:
                raise ValueError(f"g = pow:P needs a number P, got {spec!r}") from None
            if not 0.0 < self.p < 1.0:
                raise ValueError(f"g = (x+1)^p needs 0 < p < 1, got {spec!r}")
        elif base not in ("log", "sqrt", "identity"):
            raise ValueError(f"unknown concave function {spec!r}: use {CONCAVE_CHOICES}")

    def _scaled(self, y: Tensor) -> Tensor:
        return y if self.scale == 1.0 else y * self.scale

    def __call__(self, x: Tensor) -> Tensor:
        """g(x)."""
        if self.base == "log":
            y = torch.log1p(x)
        elif self.base == "sqrt":
            y = torch.sqrt(x + 1.0)
        elif self.base == "identity":
            y = x
        else:
            y = torch.pow(x + 1.0, self.p)
        return self._scaled(y)

    def increment(self, before: Tensor, a: Tensor) -> Tensor:
        """g(before + a) - g(before) for coverage ``before`` >= 0 and attention ``a`` >= 0."""
        if self.base == "identity":
            return self._scaled(a)
        if self.base == "sqrt":
            return self._scaled(a / (torch.sqrt(before + a + 1.0) + torch.sqrt(before + 1.0)))
        rel = torch.log1p(a / (before + 1.0))  # log((1 + before + a) / (1 + before))
        if self.base == "log":
            return self._scaled(rel)
        return self._scaled(torch.pow(before + 1.0, self.p) * torch.expm1(self.p * rel))

    def derivative(self, x: Tensor) -> Tensor:
        """g'(x) by autograd (float64), for :func:`check_slower_diminishing`."""
        x = x.detach().double().requires_grad_(True)
        (grad,) = torch.autograd.grad(self(x).sum(), x)
        return grad

    def __repr__(self):
        return self.spec


CONCAVE_CHOICES = "log, sqrt, pow:P (0<P<1), identity, or K*G for K > 0 times one of them (e.g. 2*sqrt)"


def parse_concave(spec: str) -> ConcaveFunction:
    """A concave non-decreasing g from its name: ``log``: log(x+1); ``sqrt``: sqrt(x+1);
    ``pow:P``: (x+1)^P with 0 < P < 1; ``identity``: x; ``K*G``: K times G (K > 0). See
    :class:`ConcaveFunction`."""
    return ConcaveFunction(spec)


def check_slower_diminishing(
    g1: ConcaveFunction, g2: ConcaveFunction, max_coverage: float, names: Tuple[str, str] = ("g1", "g2")
):
    """Raise ``ValueError`` unless g2 diminishes more slowly than g1: g2'(c) >= g1'(c).

    DyDimAttn (Eq. 5) weights the faster-diminishing g1 by P and the slower g2 by 1 - P,
    which the paper states as g1 having the smaller derivative. The derivatives are
    compared by autograd in float64 on a grid of coverage values, 0 and 2,000 points
    spaced geometrically from 1e-4 to ``max_coverage``: the largest coverage a decoder can
    reach is its number of steps (each attention is at most 1), so the condition is only
    needed there (e.g. pow:0.1 against log(x+1) holds until c = 1e10). ``names`` are
    how the error message calls g1 and g2 (the command-line flags for a model).
    """
    grid = torch.cat(
        [
            torch.zeros(1, dtype=torch.float64),
            torch.logspace(-4, math.log10(max(max_coverage, 1e-3)), 2000, dtype=torch.float64),
        ]
    )
    d1, d2 = g1.derivative(grid), g2.derivative(grid)
    bad = (d2 < d1 * (1.0 - 1e-9)).nonzero()  # tolerance: equal functions written two ways
    if len(bad):
        i = bad[0].item()
        raise ValueError(
            f"{names[1]} {g2.spec} must diminish more slowly than {names[0]} {g1.spec} (DyDimAttn, Eq. 5: "
            f"{names[1]}'(c) >= {names[0]}'(c) for all coverage 0 <= c <= {max_coverage:g}), but at "
            f"c = {grid[i].item():.4g}: {names[1]}'(c) = {d2[i].item():.4g} < {names[0]}'(c) = {d1[i].item():.4g}. "
            f"2*sqrt suits log and sqrt; identity suits every {names[0]} whose slope at 0 is at most 1; "
            f"pow:P2 suits pow:P1 (sqrt = pow:0.5) when P1 <= P2"
        )


def diminishing_weights(
    probs: Tensor,
    g: ConcaveFunction,
    g2: Optional[ConcaveFunction] = None,
    prev_coverage: Optional[Tensor] = None,
    prev_max: Optional[Tensor] = None,
    normalize: bool = False,
    eps: float = 1e-9,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Diminishing (g2 None) or dynamic diminishing (g2 given) attention weights.

    Training (T steps at once) and incremental decoding (T = 1, ``prev_*`` from the last
    step) run the same code: a running sum (and max) over the carried state followed by
    the T steps, and g's cancellation-free increment (:meth:`ConcaveFunction.increment`).

    Args:
        probs: raw attention probabilities a, ``N x T x S`` (N = batch x heads).
        g, g2: concave functions; with ``g2`` the weights are DyDimAttn with g1 = ``g``.
        prev_coverage: c^{t0-1} before the first of these T steps, ``N x 1 x S`` (None: 0).
        prev_max: max of a over all steps before them, ``N x 1 x S`` (None: 0).
        normalize: divide the weights by their sum over S.

    Returns:
        weights ``N x T x S``, the coverage after the last step ``N x 1 x S`` and the
        running max after the last step ``N x 1 x S`` (the next call's ``prev_*``; None
        for DimAttn, which does not need it).
    """
    first = prev_coverage if prev_coverage is not None else torch.zeros_like(probs[:, :1])
    running = torch.cat([first, probs], dim=1).cumsum(dim=1)  # N x (T+1) x S: c^{t0-1}, c^{t0}, ...
    before = running[:, :-1]  # c^{t-1} of every step t
    dim = g.increment(before, probs)  # Eq. 4: g(c^t) - g(c^{t-1}), c^t = c^{t-1} + a^t
    run_max_last: Optional[Tensor] = None
    if g2 is not None:
        first_max = prev_max if prev_max is not None else torch.zeros_like(probs[:, :1])
        run_max = torch.cat([first_max, probs], dim=1).cummax(dim=1).values
        p = run_max[:, :-1]  # P^t = max over t' <= t-1 (0 at t = 0), Eq. 5
        dim = p * dim + (1.0 - p) * g2.increment(before, probs)
        run_max_last = run_max[:, -1:]
    if normalize:
        dim = dim / (dim.sum(dim=-1, keepdim=True) + eps)
    return dim, running[:, -1:], run_max_last


class DiminishingMultiheadAttention(ReweightedCrossAttention):
    """Encoder-decoder multi-head attention whose context uses diminishing weights.

    A drop-in replacement for fairseq's encoder-decoder ``MultiheadAttention``: the same
    parameters (so BART / transformer checkpoints load into it unchanged), the same cached
    keys and values during incremental decoding; only the weights that mix the values
    differ (see the module docstring). The attention weights it returns (when asked) are
    the diminishing weights it used.

    Args (besides MultiheadAttention's):
        dim_type: ``dim`` (DimAttn, Eq. 4) or ``dydim`` (DyDimAttn, Eq. 5).
        g: concave function (g1 for ``dydim``), see :func:`parse_concave`.
        g2: the slower-diminishing function of ``dydim`` (the models check g2' >= g1' with
            :func:`check_slower_diminishing`; this module does not).
        normalize: renormalize the weights to sum to 1 over source positions.
    """

    def __init__(self, embed_dim, num_heads, dim_type="dim", g="log", g2="2*sqrt", normalize=False, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        if dim_type not in ("dim", "dydim"):
            raise ValueError(f"dim_type must be 'dim' or 'dydim', got {dim_type!r}")
        self.dim_type, self.g_spec, self.g2_spec = dim_type, g, g2
        self.g = parse_concave(g)
        self.g2 = parse_concave(g2) if dim_type == "dydim" else None
        self.normalize = normalize

    def extra_repr(self):
        g2 = f", g2={self.g2_spec}" if self.g2 is not None else ""
        return f"type={self.dim_type}, g={self.g_spec}{g2}, normalize={self.normalize}"

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = True,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
        key_offset: Optional[Callable[[int], Tensor]] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """query: ``T x B x C``; key/value: ``S x B x C`` (None once cached).

        ``key_offset``: added to the projected keys before they are cached (see
        :meth:`~fairseq_knowgen.modules.cross_attention.ReweightedCrossAttention.masked_logits_and_values`);
        EKI's position indicator (E_D, Eq. 9 of the EKI paper) passes it when a layer has both.

        Returns the attention output ``T x B x C`` and, with ``need_weights``, the
        diminishing weights ``B x T x S`` (``H x B x T x S`` with ``need_head_weights``).
        """
        if attn_mask is not None or before_softmax:
            raise ValueError("diminishing attention is encoder-decoder attention: no attn_mask")
        tgt_len, bsz, _ = query.size()
        # the parent projects q, k, v, reads/writes the cached keys and values
        q, k, v, pad, _ = self.project(query, key, value, key_padding_mask, incremental_state, key_offset=key_offset)
        if incremental_state is None and torch.is_grad_enabled():
            # recomputed in backward, dropout's mask with it (the RNG state is restored; see the module docstring)
            weights, dropped = checkpoint(self.dropped_weights, q, k, pad, bsz, use_reentrant=False)
            return self.attend(weights, v, bsz, tgt_len, need_weights, need_head_weights, dropped=dropped)
        if incremental_state is None:
            weights = self.weights(q, k, pad, bsz)[0]
        else:
            state = self._get_coverage_state(incremental_state)
            weights, cov, run_max = self.weights(q, k, pad, bsz, state.get("coverage"), state.get("max"))
            self._set_coverage_state(incremental_state, {"coverage": cov, "max": run_max})
        return self.attend(weights.to(q.dtype), v, bsz, tgt_len, need_weights, need_head_weights)

    def dropped_weights(
        self, q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], bsz: int
    ) -> Tuple[Tensor, Tensor]:
        """The weights of a whole sequence (:meth:`weights`) and the same after dropout."""
        weights = self.weights(q, k, key_padding_mask, bsz)[0].to(q.dtype)
        return weights, self.dropout_module(weights)

    def weights(
        self,
        q: Tensor,
        k: Tensor,
        key_padding_mask: Optional[Tensor],
        bsz: int,
        prev_coverage: Optional[Tensor] = None,
        prev_max: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """:func:`diminishing_weights` of the softmax of the masked logits of :meth:`project`'s
        queries and keys (float32 ``(B*H) x T x S``), with the coverage state after them."""
        probs = F.softmax(self.masked_logits(q, k, key_padding_mask, bsz).float(), dim=-1)
        if prev_coverage is None:
            probs = probs.nan_to_num(0.0)  # rows whose whole source is padding
        return diminishing_weights(probs, self.g, self.g2, prev_coverage, prev_max, self.normalize)

    def _get_coverage_state(self, incremental_state) -> Dict[str, Tensor]:
        if incremental_state is None:
            return {}
        state = self.get_incremental_state(incremental_state, "coverage_state")
        return {k: v for k, v in (state or {}).items() if v is not None}

    def _set_coverage_state(self, incremental_state, state: Dict[str, Tensor]):
        self.set_incremental_state(incremental_state, "coverage_state", state)

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Reorder cached keys/values (parent) and the per-hypothesis coverage state.

        The coverage differs between the beams of one sentence, so unlike the cached
        encoder keys it is always reordered with ``new_order`` itself.
        """
        super().reorder_incremental_state(incremental_state, new_order)
        state = self.get_incremental_state(incremental_state, "coverage_state")
        if state is not None:
            heads = self.num_heads
            for k, t in state.items():
                if t is not None:
                    t = t.view(-1, heads, *t.shape[1:]).index_select(0, new_order)
                    state[k] = t.view(-1, *t.shape[2:])
            self.set_incremental_state(incremental_state, "coverage_state", state)
        return incremental_state


__all__ = [
    "CONCAVE_CHOICES",
    "ConcaveFunction",
    "DiminishingMultiheadAttention",
    "check_slower_diminishing",
    "diminishing_weights",
    "parse_concave",
]
