"""Tasks of fairseq-knowgen (imported for registration)."""

from . import eki_generation, translation_constrained  # noqa: F401
