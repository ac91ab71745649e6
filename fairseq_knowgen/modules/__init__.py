"""modules of fairseq-knowgen (imported for registration)."""
