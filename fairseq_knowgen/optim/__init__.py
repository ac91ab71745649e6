"""Optimizers of fairseq-knowgen (imported for registration)."""

from . import kbert_adam  # noqa: F401  (K-BERT: the authors' BertAdam settings)
