"""Reading and writing line-aligned text files with errors that name the file and line.

Every script and recipe stage of this package reads its inputs through these helpers, so
that bad data stops with ``DataError: path:line: what is wrong`` instead of a traceback
deep inside fairseq, and writes its outputs through :func:`atomic_write`, so that a failed
run never leaves a half-written file in place of a good one.
"""

import contextlib
import json
import os
import tempfile
from typing import Iterator, List, Sequence


class DataError(ValueError):
    """Malformed or missing input data; the message starts with ``path:line:``."""

    def __init__(self, path: str, line: int, message: str):
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = path, line


def read_lines(path: str, what: str = "input", allow_empty_lines: bool = True) -> List[str]:
    """All lines of a UTF-8 text file without their newline.

    Raises :class:`DataError` for a missing file, undecodable bytes (naming the line), an
    empty file, or (with ``allow_empty_lines=False``) an empty line.
    """
    if not os.path.isfile(path):
        raise DataError(path, 0, f"{what} file not found")
    lines = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise DataError(path, n, f"not valid UTF-8 ({e.reason})") from None
            if not allow_empty_lines and not line.strip():
                raise DataError(path, n, f"empty line in {what} file")
            lines.append(line)
    if not lines:
        raise DataError(path, 0, f"{what} file is empty")
    return lines


def check_same_length(paths: Sequence[str], lines: Sequence[Sequence[str]]):
    """Raise :class:`DataError` naming the shorter file and the first line it lacks."""
    counts = [len(x) for x in lines]
    if len(set(counts)) > 1:
        longest = max(range(len(paths)), key=lambda i: counts[i])
        shortest = min(range(len(paths)), key=lambda i: counts[i])
        raise DataError(
            paths[shortest],
            counts[shortest] + 1,
            f"line-count mismatch: {counts[shortest]} lines here but {counts[longest]} in "
            f"{paths[longest]} (the files must be line-aligned)",
        )


def read_parallel(*paths: str, what: str = "input") -> List[List[str]]:
    """Read line-aligned files, checking that they have the same number of lines."""
    lines = [read_lines(p, what) for p in paths]
    check_same_length(paths, lines)
    return lines


def read_jsonl_lists(path: str, what: str = "references") -> List[List[str]]:
    """One JSON list of strings per line (e.g. all references of one input)."""
    out = []
    for n, line in enumerate(read_lines(path, what), start=1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, n, f"not a JSON line ({e.msg})") from None
        if not isinstance(item, list) or not item or not all(isinstance(x, str) for x in item):
            raise DataError(path, n, "expected a non-empty JSON list of strings")
        out.append(item)
    return out


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w") -> Iterator:
    """Write to a temporary file beside ``path`` and rename it into place on success only."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def cli_entry(main):
    """Run a command-line ``main``; bad data ends it with ``error: path:line: ...`` and exit
    status 2 instead of a traceback."""
    import sys

    try:
        return main()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
