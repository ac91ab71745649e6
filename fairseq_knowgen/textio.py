"""Reading and writing line-aligned text files with errors that name the file and line.

Every script and recipe stage of this package reads its inputs through these helpers, so
that bad data stops with ``error: path:line: what is wrong`` and exit status 2 instead of a
traceback deep inside fairseq, and writes its outputs through :func:`atomic_write` (one file)
or :func:`output_folder` (every output of a run, swapped in at once), so that a failed or
killed run never leaves a half-written or mixed output in place of a good one.

Readers strip a UTF-8 byte-order mark at the start of a file and the ``\\r`` of CRLF line
ends. Writers create their temporary files and folders beside the target as
``.tmp-PID-RANDOM-NAME``, with the permissions the umask gives (as ``open`` would); they remove
them when they fail, and a later write of the same target removes those that a killed process
left (its PID no longer runs).
"""

import contextlib
import errno
import fnmatch
import json
import os
import re
import secrets
import shutil
import signal
import sys
from typing import IO, Iterator, List, Sequence

BOM = "\ufeff"


class DataError(ValueError):
    """Malformed or missing input data, or an output that cannot be written; the message starts
    with ``path:line:`` (``path:`` when no line is at fault)."""

    def __init__(self, path: str, line: int, message: str):
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = path, line


def decode_line(raw: bytes, path: str, n: int) -> str:
    """Line ``n`` of ``path`` as read in binary: UTF-8 without its line end (``\\n`` or ``\\r\\n``)
    and, on line 1, without a byte-order mark."""
    try:
        line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise DataError(path, n, f"not valid UTF-8 ({e.reason})") from None
    return line[1:] if n == 1 and line.startswith(BOM) else line


def read_lines(path: str, what: str = "input", allow_empty_lines: bool = True) -> List[str]:
    """All lines of a UTF-8 text file without their newline (see :func:`decode_line`).

    Raises :class:`DataError` for a missing file or a folder, undecodable bytes (naming the
    line), an empty file, or (with ``allow_empty_lines=False``) an empty line.
    """
    if os.path.isdir(path):
        raise DataError(path, 0, f"is a folder, not a {what} file")
    if not os.path.isfile(path):
        raise DataError(path, 0, f"{what} file not found")
    lines = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            line = decode_line(raw, path, n)
            if not allow_empty_lines and not line.strip():
                raise DataError(path, n, f"empty line in {what} file")
            lines.append(line)
    if not lines:
        raise DataError(path, 0, f"{what} file is empty")
    return lines


def stream_lines(path: str, what: str = "input") -> Iterator[str]:
    """The lines of a file (:func:`read_lines`), or of standard input (``-``, named ``<stdin>`` in
    errors) one at a time as they arrive, decoded alike."""
    if path != "-":
        yield from read_lines(path, what)
        return
    for n, raw in enumerate(sys.stdin.buffer, start=1):
        yield decode_line(raw, "<stdin>", n)


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


def _temp_path(path: str) -> str:
    """``.tmp-PID-RANDOM-NAME`` beside ``path``."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".tmp-{os.getpid()}-{secrets.token_hex(4)}-{name}")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_strays(path: str):
    """Remove the temporary files and folders of ``path`` (``.tmp-PID-RANDOM-NAME`` beside it) whose
    process no longer runs: what a killed writer left."""
    directory, name = os.path.split(os.path.abspath(path))
    stray = re.compile(r"\.tmp-(\d+)-[0-9a-f]{8}-" + re.escape(name))
    with contextlib.suppress(OSError):
        for entry in os.listdir(directory):
            m = stray.fullmatch(entry)
            if m and not _running(int(m.group(1))):
                _remove(os.path.join(directory, entry))


def _remove(path: str):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _make_parent(path: str):
    """Create the folder that will hold ``path``; a :class:`DataError` naming it when it cannot be."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        # the path itself or one above it is a file, or a folder above is read-only
        raise DataError(directory, 0, f"cannot create the output folder ({e.strerror})") from None


def _open_temp(path: str, mode: str):
    """(file object, its path): a new temporary file beside ``path``."""
    tmp = _temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask, as open() does
    except OSError as e:
        raise DataError(path, 0, f"cannot be written ({e.strerror})") from None
    return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8"), tmp


def _check_target(path: str):
    if os.path.isdir(path):
        raise DataError(path, 0, "is a folder: the output file cannot be written there")


@contextlib.contextmanager
def atomic_files(paths: Sequence[str], mode: str = "w") -> Iterator[List[IO]]:
    """Open temporary files beside ``paths`` and rename them all into place once the block
    succeeds (one rename after another, at the very end); on any failure they are removed and
    every earlier file stays as it was. For outputs that must agree (a file and its map)."""
    for path in paths:
        _make_parent(path)
        _check_target(path)
        remove_strays(path)
    opened = []  # (file, temporary path)
    try:
        for path in paths:
            opened.append(_open_temp(path, mode))
        yield [f for f, _ in opened]
        for f, _ in opened:
            f.close()
        for (_, tmp), path in zip(opened, paths):
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise DataError(path, 0, f"cannot be written ({e.strerror})") from None
    finally:
        for f, tmp in opened:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w") -> Iterator[IO]:
    """Write to a temporary file beside ``path`` and rename it into place on success only."""
    with atomic_files([path], mode) as (f,):
        yield f


def check_writable(path: str):
    """Stop early (:class:`DataError`) when the output file ``path`` could not be written: a folder
    in its place, a file in the way of its folder, a read-only folder."""
    _make_parent(path)
    _check_target(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DataError(path, 0, f"cannot be written (the folder {directory} is read-only)")


@contextlib.contextmanager
def output_folder(out: str, owned: Sequence[str] = ("*",)) -> Iterator[str]:
    """A run that writes a whole folder of outputs replaces the previous one only when complete.

    Yields a new temporary folder ``.tmp-PID-RANDOM-NAME`` beside ``out``; the run writes every
    output there (with :func:`atomic_write` or plain ``open``, under the same names as in
    ``out``). When the block ends without an error, the entries of the previous ``out`` that the
    run does not own (names matching none of the ``owned`` glob patterns, e.g. a user's notes or
    a later stage's files) are carried over (hard links), and the temporary folder takes the place
    of ``out`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames). Old
    outputs the run did not write again (a split that no longer exists, files of a flag that is now
    off) are gone with the old folder. When the block fails (bad data, Ctrl-C, SIGTERM through
    :func:`cli_entry`), the temporary folder is removed and ``out`` is as it was, or absent if it
    never existed; a SIGKILL leaves the temporary folder, which the next run of any writer of
    ``out`` removes. Problems with ``out`` itself (a file in its place, a read-only folder or
    parent) stop the run before it reads anything, with a :class:`DataError` naming ``out``.

    How a prep module uses it (``prep.webnlg``, ``prep.placeholders encode``, ``demo_data``)::

        def prepare(data, out):
            with output_folder(out, owned=("*.src", "*.tgt", "eval_splits")) as tmp:
                rows = read_everything(data)           # DataError: the old `out` is untouched
                write_lines(f"{tmp}/train.src", rows)  # into tmp, never into out
                ...

    Messages should name ``out``'s paths, not ``tmp``'s. A module whose outputs go to several
    places, or to a folder another stage also writes (a single file into a binarized-data
    folder), uses :func:`atomic_files` / :func:`atomic_write` instead.
    """
    out = os.path.realpath(out) if os.path.islink(out) else os.path.abspath(out)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise DataError(out, 0, "a file is in the way of the output folder")
    _make_parent(out)
    if os.path.isdir(out) and not os.access(out, os.W_OK | os.X_OK):
        raise DataError(out, 0, "the output folder is read-only")
    remove_strays(out)
    tmp = _temp_path(out)
    try:
        os.mkdir(tmp, 0o777)  # & ~umask
    except OSError as e:
        raise DataError(out, 0, f"cannot write beside the output folder ({e.strerror})") from None
    try:
        yield tmp
        if os.path.isdir(out):
            _carry_over(out, tmp, owned)
        _swap(tmp, out)
    finally:
        _remove(tmp)


def _carry_over(old: str, new: str, owned: Sequence[str]):
    """Hard-link (or copy) into ``new`` the entries of ``old`` that match no ``owned`` pattern and
    that ``new`` does not have."""

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for entry in os.listdir(old):
        if any(fnmatch.fnmatchcase(entry, p) for p in owned) or os.path.lexists(os.path.join(new, entry)):
            continue
        src, dst = os.path.join(old, entry), os.path.join(new, entry)
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True, copy_function=link)
        elif os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            link(src, dst)


def _swap(new: str, out: str):
    """Put folder ``new`` in the place of ``out``; the old ``out`` (if any) ends up at ``new``."""
    if not os.path.lexists(out):
        os.rename(new, out)
        return
    if _exchange(new, out):
        return
    old = _temp_path(out)  # a kill between the two renames leaves no `out`, the old one at `old`
    os.rename(out, old)
    os.rename(new, out)
    os.rename(old, new)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # glibc < 2.28, musl
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the file system cannot exchange
        return False
    raise OSError(err, os.strerror(err), b)


def cli_entry(main):
    """Run a command-line ``main`` the way every entry point of the package ends:

    - bad data (:class:`DataError`): ``error: path:line: what is wrong`` on stderr, exit status 2;
    - an operating-system error on a named file (a read-only folder, a folder where a file
      should be...): ``error: path: reason``, exit status 2;
    - Ctrl-C (SIGINT): exit status 130 without a traceback; SIGTERM: exit status 143. Both unwind
      the program first, so that :func:`atomic_write` and :func:`output_folder` remove their
      temporary files;
    - a closed standard output (``... | head``): exit status 141, quietly.

    Returns what ``main`` returns (``sys.exit(cli_entry(main))`` passes an exit status on)."""

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate) if _main_thread() else None
    try:
        return main()
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # no more flushing into the closed pipe at exit
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except OSError as e:
        if e.filename is None:
            raise
        print(f"error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
