"""Tasks of fairseq-knowgen (imported for registration)."""

from . import eki_generation  # noqa: F401
