"""Where the real released files are: ``../shared/released`` beside the repository root (CI has it).

Tests that read them must run, not skip, where the folder exists; where it is absent (a user's
clone) they build small stand-ins that have the same odd features, so the mechanics are still
tested. ``released("bert-base-chinese", "vocab.txt")`` is the path, or ``None`` when absent.
"""

import os

from conftest import ROOT

RELEASED = os.path.join(os.path.dirname(ROOT), "shared", "released")


def released(*parts: str):
    """The path of ``../shared/released/PARTS`` when it exists, else ``None``."""
    path = os.path.join(RELEASED, *parts)
    return path if os.path.exists(path) else None
