"""tasks of fairseq-knowgen (imported for registration)."""
