"""fairseq-knowgen: knowledge and content control for neural text generation.

Importing this package (``--user-dir fairseq_knowgen``) registers every model,
architecture, criterion and task it defines with fairseq, and lets torch's weights-only
loader read fairseq checkpoints (see :mod:`fairseq_knowgen.compat.checkpoint_compat`). Where torch is
not imported yet, that happens right after its first import (:mod:`fairseq_knowgen.compat.deferred_registration`),
so the text tools that never import torch start in a fraction of a second.
"""

import importlib

from .compat.deferred_registration import register_once_torch_is_imported


def _register_with_fairseq():
    from .compat import checkpoint_compat  # noqa: F401  (must run before any checkpoint is read)
    from .compat import exact_resume  # noqa: F401  (a resumed run trains on the batches of an uninterrupted one)
    from .compat import clean_exit  # noqa: F401  (no abort at exit from fairseq's prefetch thread)
    from . import criterions, models, tasks  # noqa: F401


# now when torch is imported (fairseq-train imports fairseq first), else right after torch's first import (by
# fairseq, a converter, a test); the text tools that never import torch start fast (see compat.deferred_registration)
register_once_torch_is_imported(__name__, _register_with_fairseq)


def __getattr__(name):  # fairseq_knowgen.models and the like before anything imported torch
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__version__ = "0.1.0"
