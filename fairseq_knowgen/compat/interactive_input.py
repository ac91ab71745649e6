"""fairseq-interactive's input, one error per bad line: the other lines are decoded, the exit status tells.

fairseq-interactive reads its input (``--input``, default ``-``: standard input) in buffers of
``--buffer-size`` lines (``fairseq_cli.interactive.buffered_read``) and hands each buffer to the
task. A bad line stops the whole run there, or passes unseen: a line that is not UTF-8 ends in a
``UnicodeDecodeError`` traceback (from a file, or from standard input in a UTF-8 locale) or becomes
``<unk>`` (standard input in the C locale: Python reads it with ``surrogateescape``); a line longer
than the model's positions ends in fairseq's ``Exception: Size of sample #0 is invalid`` unless
``--skip-invalid-size-inputs-valid-test`` is given, which skips it with a warning that names no line.

A task that reads its input through :func:`use_for_interactive` (``eki_generation`` does, in
``setup_task``) gets instead:

- every line decoded on its own, as :func:`fairseq_knowgen.textio.decode_line` decodes a file's (a
  byte-order mark on line 1 and the ``\\r`` of CRLF dropped), and stripped, as fairseq strips it; a line
  that is not UTF-8 is kept as text (U+FFFD for its bad bytes) and marked, for the task to refuse;
- :meth:`InputLines.refuse`, which the task calls for each bad line before the buffer is batched:
  ``error: INPUT:LINE: what is wrong`` on stderr, and the line is left out of the batches (fairseq
  prints no ``S-``/``H-`` lines for its id; the ids of the others stay their line number - 1);
- once the input ends, after the last line was decoded, exit status 2 when a line was refused.

``INPUT`` is ``<stdin>`` or the ``--input`` file. Only ``fairseq_cli.interactive.buffered_read`` is
replaced, and only in a process where such a task is set up while fairseq-interactive runs; the
replacement reads what fairseq's would (the same lines, stripped), so another task set up in the
same process later reads its input as before.
"""

import sys
from typing import Dict, Iterator, List

from ..textio import decode_line


class InputLines:
    """The input of one fairseq-interactive run: its name, the lines that are not UTF-8 (line number ->
    reason), and how many lines the task refused."""

    def __init__(self, name: str = "input"):
        self.name = name
        self.not_utf8: Dict[int, str] = {}
        self.refused = 0
        self.lines = 0

    def refuse(self, line: int, message: str) -> None:
        """``error: INPUT:LINE: message`` on stderr; the run ends with exit status 2 once the input ends."""
        print(f"error: {self.name}:{line}: {message}", file=sys.stderr, flush=True)
        self.refused += 1

    def problem(self, line: int, text: str):
        """What is wrong with the encoding of line ``line`` (``text`` as the task got it), or None: bytes
        that are not UTF-8, seen by :func:`buffered_read` or, without it, as the lone surrogates that
        Python's ``surrogateescape`` makes of them."""
        if line in self.not_utf8:
            return f"not valid UTF-8 ({self.not_utf8[line]})"
        if any("\udc80" <= ch <= "\udcff" for ch in text):
            return "not valid UTF-8"
        return None


_current = InputLines()


def current() -> InputLines:
    """The input of the fairseq-interactive run in progress (an unnamed one outside such a run)."""
    return _current


def buffered_read(input: str, buffer_size: int) -> Iterator[List[str]]:
    """``fairseq_cli.interactive.buffered_read`` with the lines decoded one at a time (see the module
    docstring); ends the program with exit status 2 after the last buffer when a line was refused."""
    global _current
    run = _current = InputLines("<stdin>" if input == "-" else input)
    try:
        stream = sys.stdin.buffer if input == "-" else open(input, "rb")
    except OSError as e:
        print(f"error: {input}: cannot be read ({e.strerror})", file=sys.stderr)
        sys.exit(2)
    buffer = []
    try:
        for n, raw in enumerate(stream, start=1):
            run.lines = n
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:  # kept as text, for the task to refuse with its line number
                run.not_utf8[n] = e.reason
                raw = raw.decode("utf-8", "replace").encode("utf-8")
            buffer.append(decode_line(raw, run.name, n).strip())
            if len(buffer) >= buffer_size:
                yield buffer
                buffer = []
        if buffer:
            yield buffer
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    if run.refused:
        print(
            f"error: {run.name}: {run.refused} of {run.lines} line(s) refused (each named above); the others were "
            "decoded",
            file=sys.stderr,
        )
        sys.exit(2)


def use_for_interactive() -> None:
    """Read fairseq-interactive's input with :func:`buffered_read`, when fairseq-interactive runs."""
    module = sys.modules.get("fairseq_cli.interactive")
    if module is not None and module.buffered_read is not buffered_read:
        module.buffered_read = buffered_read
