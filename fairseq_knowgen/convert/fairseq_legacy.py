"""Released fairseq checkpoint layouts -> the current one, and the strict loader of a pretrained part.

The renames are those fairseq 0.12 applies itself when it loads an old checkpoint (each
module's ``upgrade_state_dict_named``), gathered here so that models of this package that start
from a released checkpoint call one function instead of carrying renaming tables:

=====================================================  ===============================================
released layout (e.g. ``roberta.base/model.pt``)       current layout
=====================================================  ===============================================
``decoder.sentence_encoder.*``, ``decoder.lm_head.*``   ``encoder.sentence_encoder.*``, ``encoder.lm_head.*``
                                                       (``RobertaModel.upgrade_state_dict_named``)
``*.emb_layer_norm.*``                                  ``*.layernorm_embedding.*`` (same)
``*.self_attn.in_proj_weight`` / ``in_proj_bias``       ``*.self_attn.{q,k,v}_proj.{weight,bias}``, the
  (fused, 3C x C: q, k, v stacked)                      three C-row blocks in that order
                                                       (``MultiheadAttention.upgrade_state_dict_named``)
``*.layer_norms.0.*`` / ``*.layer_norms.1.*``           ``*.self_attn_layer_norm.*`` / ``*.final_layer_norm.*``
                                                       (``TransformerEncoderLayer.upgrade_state_dict_named``)
=====================================================  ===============================================

A checkpoint already in the current layout passes unchanged. As a command::

    python -m fairseq_knowgen.convert.fairseq_legacy IN.pt OUT.pt

writes ``IN.pt`` with its model tensors renamed (its ``args``/``cfg`` and everything else kept; an
earlier ``OUT.pt`` is replaced only once the new one is complete, and a checkpoint that cannot be
read, cut short or refused by weights-only loading, stops with ``error: IN.pt: ...`` and exit status 2);
``python -m fairseq_knowgen.convert.fairseq_legacy --encoder-flags IN.pt`` prints the encoder's
size flags as its args give them (``--encoder-layers 12 --encoder-embed-dim 768 ...``), which is
how ``examples/kbert/run.sh`` sizes K-BERT for a ``PRETRAINED`` folder.

:func:`load_pretrained_part` copies the tensors under one prefix of such a state into a module
and refuses partial loads: a tensor of the module that the checkpoint lacks, or a checkpoint
tensor under the prefix that the module has no place for (other than the ones the caller names
as known extras, e.g. RoBERTa's LM head), stops with an error that names them, as does a
shape that differs (a dozen names of each kind and the count of the rest, not a model's every
tensor). Position tables are the one sized case: a checkpoint table longer than the
module's gives its first rows (the positions the module can address); a shorter one is an error.
"""

import argparse
import os
from typing import Dict, Iterable, List, Optional, Sequence

import torch
from torch import Tensor, nn

from ..textio import DataError, atomic_write, check_writable, cli_entry

POSITION_TABLES = ("embed_positions.weight",)
NAMES_SHOWN = 12


def some_names(names: Sequence[str], sep: str = ", ", shown: int = NAMES_SHOWN) -> str:
    """The first ``shown`` of ``names`` and how many more: a refusal stays readable when a whole
    model's tensors are at fault (``a, b, ... and 132 more``)."""
    names = list(names)
    head = sep.join(names[:shown])
    return head if len(names) <= shown else f"{head}{sep}... and {len(names) - shown} more"


def upgrade_state(state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """A model state dict in the current fairseq layout (see the module docstring); a new dict,
    the tensors are shared with ``state``."""
    out = dict(state)
    if any(k.startswith("decoder.sentence_encoder.") for k in out):  # RoBERTa / masked_lm: its encoder was "decoder"
        out = {("encoder" + k[len("decoder") :] if k.startswith("decoder.") else k): v for k, v in out.items()}
    out = {k.replace(".emb_layer_norm.", ".layernorm_embedding."): v for k, v in out.items()}
    out = {k.replace(".layer_norms.0.", ".self_attn_layer_norm.").replace(".layer_norms.1.", ".final_layer_norm."): v
           for k, v in out.items()}
    for key in [k for k in out if k.endswith(".in_proj_weight")]:
        base = key[: -len("in_proj_weight")]
        for kind in ("weight", "bias"):
            fused = out.pop(f"{base}in_proj_{kind}", None)
            if fused is None:
                continue
            if fused.size(0) % 3:
                raise ValueError(f"{base}in_proj_{kind}: {fused.size(0)} rows, not three equal q, k, v blocks")
            for name, part in zip("qkv", fused.chunk(3, dim=0)):  # q, k, v stacked: 3C x C -> three C x C
                out[f"{base}{name}_proj.{kind}"] = part
    return out


def load_checkpoint_state(path: str):
    """``(model state in the current layout, the checkpoint's model args or None)`` of a fairseq
    checkpoint (read with fairseq's own weights-only loader)."""
    from fairseq import checkpoint_utils

    import fairseq_knowgen  # noqa: F401  (the weights-only allow-list)

    if not os.path.isfile(path):
        raise DataError(path, 0, "checkpoint not found")
    ckpt = checkpoint_utils.load_checkpoint_to_cpu(path)
    args = ckpt.get("args")
    if args is None and ckpt.get("cfg") is not None:
        args = ckpt["cfg"].get("model")
    return upgrade_state(ckpt["model"]), args


def load_pretrained_part(
    module: nn.Module,
    state: Dict[str, Tensor],
    prefix: str,
    source: str,
    extras: Sequence[str] = (),
    new: Iterable[str] = (),
) -> Dict[str, Tensor]:
    """Load ``state[prefix + name]`` into ``module``'s tensor ``name``, every one of them.

    Args:
        module: where the tensors go (its ``state_dict`` names, e.g. ``layers.0.fc1.weight``)
        state: a checkpoint's model state in the current layout (:func:`upgrade_state`)
        prefix: the pretrained part's prefix in ``state`` (e.g. ``encoder.sentence_encoder.``)
        source: the file name, for the errors
        extras: prefixes of ``state`` keys that are known and not wanted (e.g. ``encoder.lm_head.``);
            any other key outside ``prefix`` is ignored too (another part of the checkpoint)
        new: names of ``module`` that the checkpoint may lack (the caller initializes them)

    Returns:
        the loaded tensors (name -> tensor as it was copied in)

    Raises:
        DataError (a ValueError, ``source: ...``) naming the tensors of ``module`` left unloaded,
        the tensors under ``prefix`` with no place in ``module``, and the shapes that differ (of
        each kind the first dozen and the count of the rest).
    """
    ours = module.state_dict()
    theirs = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    theirs = {k: v for k, v in theirs.items() if k.rsplit(".", 1)[-1] != "version"}  # fairseq's layout-version buffers
    if not theirs:
        raise DataError(source, 0, f"no {prefix}* tensors (not this kind of model?)")
    new = set(new)
    unloaded = sorted(k for k in ours if k not in theirs and k not in new)
    unused = sorted(prefix + k for k in theirs if k not in ours and not any((prefix + k).startswith(e) for e in extras))
    shapes, loaded = [], {}
    for name, value in theirs.items():
        if name not in ours:
            continue
        target = ours[name]
        if name in POSITION_TABLES and value.size(0) > target.size(0) and value.shape[1:] == target.shape[1:]:
            value = value[: target.size(0)]  # positions beyond the module's table are never addressed
        if value.shape != target.shape:
            shapes.append(f"{prefix}{name} {tuple(value.shape)} -> {tuple(target.shape)}")
            continue
        loaded[name] = value.to(target.dtype)
    problems = []
    if unloaded:
        problems.append(f"{len(unloaded)} tensor(s) of the model not in the checkpoint: {some_names(unloaded)}")
    if unused:
        problems.append(f"{len(unused)} checkpoint tensor(s) with no place in the model: {some_names(unused)}")
    if shapes:
        problems.append(f"shapes differ (checkpoint -> model): {some_names(shapes, sep='; ')}")
    if problems:
        raise DataError(source, 0, "refusing a partial load: " + " | ".join(problems))
    module.load_state_dict({**ours, **loaded})
    return loaded


ENCODER_FLAGS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads")


def encoder_flags(args) -> List[str]:
    """The encoder size flags (``--encoder-layers N ...``, and ``--activation-fn``) of a
    checkpoint's model args."""
    if args is None or any(getattr(args, k, None) is None for k in ENCODER_FLAGS):
        raise ValueError(f"the checkpoint's args do not give its encoder sizes ({', '.join(ENCODER_FLAGS)})")
    out = []
    for k in ENCODER_FLAGS + ("activation_fn",):
        if getattr(args, k, None) is not None:
            out += ["--" + k.replace("_", "-"), str(getattr(args, k))]
    return out


def main(argv: Optional[Sequence[str]] = None):
    import fairseq_knowgen  # noqa: F401  (the weights-only allow-list)

    from .downloads import read_fairseq_checkpoint

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("input", help="a fairseq checkpoint in a released (older) layout")
    p.add_argument("output", nargs="?", help="where to write it in the current layout")
    p.add_argument("--encoder-flags", action="store_true", help="print the encoder's size flags instead")
    a = p.parse_args(argv)
    if not os.path.isfile(a.input):
        raise DataError(a.input, 0, "checkpoint not found")
    if a.encoder_flags:
        try:
            print(" ".join(encoder_flags(load_checkpoint_state(a.input)[1])))
        except ValueError as e:
            raise DataError(a.input, 0, str(e)) from None
        return
    if not a.output:
        p.error("OUT is needed (or --encoder-flags)")
    check_writable(a.output)
    ckpt = read_fairseq_checkpoint(a.input)  # as written (fairseq's loader would rewrite args into cfg)
    before = set(ckpt["model"])
    try:
        ckpt["model"] = upgrade_state(ckpt["model"])
    except ValueError as e:
        raise DataError(a.input, 0, str(e)) from None
    with atomic_write(a.output, "wb") as f:  # an earlier OUT stays until the new one is complete
        torch.save(ckpt, f)
    print(f"{a.output}: {len(ckpt['model'])} tensors, {len(before - set(ckpt['model']))} renamed or split")


if __name__ == "__main__":
    cli_entry(main)
