"""CoCon's symbols, its choices of prefix states, the default depth of the block and the set-up error."""

SEP, PROMPT = "<sep>", "<prompt>"
PREFIX_STATES = ("lm", "block")


def default_cocon_layer(n_layers: int) -> int:
    """The authors' relative depth: their block reads the output of GPT-2 medium's 7th layer of 24
    (``--output_hidden_for_cocon_after_block_ind 6``), so after round(7/24 x layers) layers, at
    least 1 (a 4-layer LM: 1; GPT-2 small's 12: 4; medium's 24: 7)."""
    return min(n_layers, max(1, round(7 * n_layers / 24))) if n_layers else 0


class CoConSetupError(ValueError):
    """The LM checkpoint or the CoCon flags do not fit (the task exits with status 2)."""
