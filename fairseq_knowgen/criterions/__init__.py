"""Criterions of fairseq-knowgen (imported for registration)."""
from . import force_copy  # noqa: F401
