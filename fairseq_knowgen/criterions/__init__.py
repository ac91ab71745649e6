"""criterions of fairseq-knowgen (imported for registration)."""
