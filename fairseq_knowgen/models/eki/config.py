"""EKI's flags and their defaults (the paper's, else the authors' code's): ``add_eki_args`` adds them to
fairseq's parser, ``eki_defaults`` fills what a command line or an older checkpoint leaves unset."""

import argparse

from fairseq import utils

from ...data.eki_dataset import SEPARATOR
from ...modules.scaling_module import SCALING_INITS

# parameters a pretrained (BART) checkpoint lacks: they keep their initialization on --restore-file
NEW_PARAMETER_PREFIXES = ("encoder.group_embedding.", "encoder.scaling.", "distance_embed.", "decoder.copy_generator.")
# never copied besides pad/EOS/BOS/<unk>: the separator of ``concepts <sep> prototype`` and
# BART's <mask> mark the source's layout, they are no words of it
EKI_UNCOPYABLE = (SEPARATOR, "<mask>")


# the paper's, else the authors' code's (docs/methods/eki.md); eki_scaling_dropout None: the model's --dropout
EKI_DEFAULTS = {
    "eki_group_embeddings": 1,
    "eki_group_init_std": 0.01,
    "eki_scaling": 1,
    "eki_scaling_activation": "relu",
    "eki_scaling_dim": 512,
    "eki_scaling_dropout": None,
    "eki_scaling_init_std": 1e-3,
    "eki_scaling_init": "normal",
    "eki_position_indicator": 1,
    "eki_position_layers": "all",
    "eki_max_distance": 64,
    "eki_distance_init_std": 5e-3,
}


def _at_least(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


_positive_float.__name__ = "float"


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


_non_negative_float.__name__ = "float"


def _dropout(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


_dropout.__name__ = "float"


def add_eki_args(parser):
    d = EKI_DEFAULTS
    parser.add_argument(
        "--eki-group-embeddings",
        type=int,
        choices=[0, 1],
        help=f"group embeddings E_C/E_O (Eq. 3; default {d['eki_group_embeddings']})",
    )
    parser.add_argument(
        "--eki-group-init-std",
        type=_non_negative_float,
        metavar="STD",
        help=f"E_C/E_O start at N(0, std^2) (default {d['eki_group_init_std']}, the authors' code; 0: zero, "
        "so that a fine-tuned BART's input starts unchanged)",
    )
    parser.add_argument(
        "--eki-scaling", type=int, choices=[0, 1], help="scaling module on the encoder output (Eq. 5; default 1)"
    )
    parser.add_argument(
        "--eki-scaling-activation",
        choices=utils.get_available_activation_fns(),
        help=f"activation of the scaling module (default {d['eki_scaling_activation']}, the paper's Eq. 5; the "
        "authors' code uses BART's gelu)",
    )
    parser.add_argument(
        "--eki-scaling-dim",
        type=_at_least(1),
        metavar="D_S",
        help=f"inner size d_s >= 1 of the scaling module (default {d['eki_scaling_dim']}, the authors' code)",
    )
    parser.add_argument(
        "--eki-scaling-dropout",
        type=_dropout,
        metavar="P",
        help="dropout on the scaling module's input and hidden units (default: the model's --dropout, as the "
        "authors' code)",
    )
    parser.add_argument(
        "--eki-scaling-init-std",
        type=_positive_float,
        metavar="STD",
        help=f"std of the N(0, std^2) scaling-module weights (default {d['eki_scaling_init_std']}, the authors' "
        "code); it sets how far 2*Lambda starts from 1",
    )
    parser.add_argument(
        "--eki-scaling-init",
        choices=SCALING_INITS,
        help="scaling-module start: 'normal' (default) is the paper's plain N(0, std^2) (2*Lambda ~ 1); 'mirrored' "
        "pairs hidden units with opposite output weights, so 2*Lambda = 1 exactly and a fine-tuned BART starts as BART",
    )
    parser.add_argument(
        "--eki-position-indicator",
        type=int,
        choices=[0, 1],
        help="distance embedding E_D in the cross-attention keys (Eq. 9; default 1, the paper's model; the authors' "
        "released code never feeds it distances: 0 is their model)",
    )
    parser.add_argument(
        "--eki-position-layers",
        type=str,
        metavar="L",
        help="decoder layers with E_D: 'all' (default) or a comma list of indices, negative from the end",
    )
    parser.add_argument(
        "--eki-max-distance",
        type=_at_least(1),
        help=f"distances are clipped here, >= 1 (E_D has this + 1 rows; default {d['eki_max_distance']})",
    )
    parser.add_argument(
        "--eki-distance-init-std",
        type=_non_negative_float,
        metavar="STD",
        help=f"E_D starts at N(0, std^2) (default {d['eki_distance_init_std']}, the authors' code; 0: zero)",
    )


def eki_defaults(args):
    """Fill unset EKI options (``None`` only: 0 is a value) and check them: a bad value is an
    error naming its flag, never silently replaced. A checkpoint from before the scaling module's
    activation and dropout options (its args have ``eki_scaling_dim`` and no
    ``eki_scaling_activation``) keeps the module it was trained with: ReLU, no dropout."""
    if hasattr(args, "eki_scaling_dim") and not hasattr(args, "eki_scaling_activation"):
        args.eki_scaling_dropout = 0.0
    for name, default in EKI_DEFAULTS.items():
        if getattr(args, name, None) is None and name != "eki_scaling_dropout":
            setattr(args, name, default)
    if not hasattr(args, "eki_scaling_dropout"):
        args.eki_scaling_dropout = None  # the model's --dropout
    for name in ("eki_scaling_dim", "eki_max_distance"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.eki_scaling_init_std > 0:
        raise ValueError(f"--eki-scaling-init-std must be > 0, got {args.eki_scaling_init_std}")
    for name in ("eki_group_init_std", "eki_distance_init_std"):
        if not getattr(args, name) >= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.eki_scaling_dropout is not None and not 0 <= args.eki_scaling_dropout < 1:
        raise ValueError(f"--eki-scaling-dropout must be in [0, 1), got {args.eki_scaling_dropout}")
    if args.eki_scaling_init not in SCALING_INITS:
        raise ValueError(f"--eki-scaling-init must be one of {SCALING_INITS}, got {args.eki_scaling_init!r}")


def scaling_dropout(args) -> float:
    """``--eki-scaling-dropout``, or the model's ``--dropout`` when unset (the authors' code)."""
    return args.eki_scaling_dropout if args.eki_scaling_dropout is not None else float(getattr(args, "dropout", 0.0))


def check_shared_dictionary(src_dict, tgt_dict):
    """EKI compares and scatters token ids between source and target (L_E labels, concept
    matches) and applies the target dictionary's special-symbol masks to source ids: both
    sides must use one dictionary."""
    if src_dict is tgt_dict or src_dict.symbols == tgt_dict.symbols:
        return
    n = min(len(src_dict), len(tgt_dict))
    i = next((i for i in range(n) if src_dict.symbols[i] != tgt_dict.symbols[i]), n)
    first = (
        f"first difference at id {i}: {src_dict.symbols[i]!r} vs {tgt_dict.symbols[i]!r}"
        if i < n
        else f"{len(src_dict)} vs {len(tgt_dict)} symbols"
    )
    raise ValueError(
        "EKI needs one dictionary for source and target, but the source and target dictionaries differ "
        f"({first}): binarize with fairseq-preprocess --joined-dictionary (or --srcdict and --tgtdict the same file)"
    )
