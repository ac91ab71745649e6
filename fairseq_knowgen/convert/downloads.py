"""A downloaded model's files, read so that a damaged copy stops with one line instead of a traceback.

A half-finished download is the common way a released model goes wrong: a ``model.safetensors`` or
``pytorch_model.bin`` cut short, a ``config.json``, ``vocab.json`` or ``tokenizer.json`` that ends
mid-way. The converters read every such file inside :func:`download`, which turns what the reading
library raises (``json``, UTF-8 decoding, ``safetensors``, ``torch.load``) into a
:class:`~fairseq_knowgen.textio.DataError` that names the file (and the line of a JSON or UTF-8 error)
and ends with ``re-download NAME``; :func:`~fairseq_knowgen.textio.cli_entry` prints it as
``error: PATH[:LINE]: ...`` with exit status 2::

    error: hf/model.safetensors: not a complete safetensors file (incomplete metadata, file not fully
    covered): re-download model.safetensors
    error: hf/tokenizer.json:1: not valid JSON (Expecting value: column 21): re-download tokenizer.json

Each converter reads and checks all its inputs before it writes anything, and writes through
:func:`~fairseq_knowgen.textio.output_folder`, so a failure leaves an earlier output as it was.

- :func:`read_json`: a JSON file (``config.json``, ``vocab.json``, ``tokenizer.json``...);
- :func:`read_text`: a text file (``merges.txt``);
- :func:`check_weights`: opens the weights ``transformers`` will read from a ``save_pretrained`` folder,
  in the order it picks them (``model.safetensors``, its shards, ``pytorch_model.bin``, its shards),
  before it reads them: ``safetensors`` checks that the tensors its header lists fill the file, torch
  that its zip archive ends with a central directory;
- :func:`load_config`: ``config.json`` through :func:`read_json`, then ``transformers``' config class;
- :func:`load_model`: ``from_pretrained`` after :func:`check_weights`, refusing weights that lack a
  tensor of the model (``transformers`` would start it at random) or hold one of another shape than
  ``config.json`` gives;
- :func:`read_fairseq_checkpoint`, :func:`read_fairseq_dictionary`: a released fairseq checkpoint
  (weights-only ``torch.load``, as :mod:`fairseq_knowgen.compat.checkpoint_compat` allows it) and its ``dict.txt``;
- :func:`check_vocab_size`: a vocabulary of another size than the model's embedding is another model's,
  refused naming both sizes (the converters' ``--allow-vocab-mismatch`` says when it is meant).
"""

import contextlib
import json
import os
import zipfile
from typing import Iterator, List, Sequence

from ..compat.checkpoint_compat import check_checkpoint_file, describe_load_error
from ..textio import BOM, DataError
from .fairseq_legacy import some_names


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


@contextlib.contextmanager
def download(path: str) -> Iterator[None]:
    """Read the downloaded file ``path`` inside the block: a JSON or UTF-8 error, a safetensors or
    torch file that cannot be read become a :class:`DataError` naming ``path`` that ends with
    ``re-download NAME`` (a torch file that weights-only loading refuses is no damaged download: its
    message says what it names, without the advice)."""
    name = os.path.basename(path)
    fix = f"re-download {name}"
    try:
        yield
    except DataError:
        raise
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, f"not valid JSON ({e.msg}: column {e.colno}): {fix}") from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1 if isinstance(e.object, bytes) else 0
        raise DataError(path, line, f"not valid UTF-8 ({e.reason}): {fix}") from None
    except Exception as e:  # safetensors and torch raise many kinds for a file cut short
        if type(e).__name__ == "SafetensorError":
            reason = _first_line(str(e)).replace("Error while deserializing header: ", "")
            raise DataError(path, 0, f"not a complete safetensors file ({reason}): {fix}") from None
        if isinstance(e, OSError) and e.filename is not None:
            raise DataError(e.filename, 0, f"cannot be read ({e.strerror})") from None
        message = describe_load_error(e)
        if _cut_zip(path):  # torch's reader fails in several ways on a zip archive cut short
            message = "cannot be read: truncated, or not a torch checkpoint (a zip archive without its end)"
        raise DataError(path, 0, message if message.startswith("refused") else f"{message}: {fix}") from None


def _cut_zip(path: str) -> bool:
    """Whether ``path`` starts as a zip archive (torch's format) but lacks the directory a zip ends with."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04" and not zipfile.is_zipfile(path)
    except OSError:
        return False


def read_json(path: str, what: str = "JSON file"):
    """The JSON value of ``path`` (a leading byte-order mark ignored); :func:`download`'s errors."""
    if not os.path.isfile(path):
        raise DataError(path, 0, f"{what} not found")
    with open(path, "rb") as f:
        data = f.read()
    with download(path):
        return json.loads(data.decode("utf-8").lstrip(BOM))


def read_text(path: str) -> str:
    """The UTF-8 text of ``path``; :func:`download`'s errors."""
    with open(path, "rb") as f:
        data = f.read()
    with download(path):
        return data.decode("utf-8")


def read_config(hf_dir: str, model: str) -> dict:
    """``HF_DIR/config.json`` as a dict, checked before ``transformers`` reads it (``model``: the
    kind of folder, for the message when there is none)."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise DataError(path, 0, f"not found (a save_pretrained {model} folder has config.json)")
    config = read_json(path)
    if not isinstance(config, dict):
        raise DataError(path, 0, f"holds a JSON {type(config).__name__}, not a model configuration: re-download it")
    return config


def load_config(config_class, hf_dir: str, model: str):
    """``config_class.from_pretrained(hf_dir)`` (local files only) once :func:`read_config` passed; a
    value ``transformers`` refuses (a size that is not a number...) names ``config.json``."""
    read_config(hf_dir, model)
    try:
        return config_class.from_pretrained(hf_dir, local_files_only=True)
    except Exception as e:  # the file is there and is JSON: what transformers refuses is its content
        message = " ".join(str(e).split())
        raise DataError(os.path.join(hf_dir, "config.json"), 0, f"not a {model} configuration ({message})") from None


def weights_files(hf_dir: str) -> List[str]:
    """The weights files ``transformers`` reads from ``hf_dir``: the first of ``model.safetensors``,
    the shards its ``.index.json`` names, ``pytorch_model.bin``, the shards of its index."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME):
        path = os.path.join(hf_dir, name)
        if not os.path.isfile(path):
            continue
        if not name.endswith(".index.json"):
            return [path]
        index = read_json(path)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(shards, dict) or not shards:
            raise DataError(path, 0, f"no weight_map of tensor names to files: re-download {name}")
        return [os.path.join(hf_dir, f) for f in sorted(set(map(str, shards.values())))]
    raise DataError(
        hf_dir, 0, f"no weights: neither {SAFE_WEIGHTS_NAME} nor {WEIGHTS_NAME} (nor their .index.json shards)"
    )


def check_weights(hf_dir: str) -> List[str]:
    """Open every file of :func:`weights_files`: a missing shard, a safetensors file whose tensors run
    past its end, a torch file that cannot be read stop with :func:`download`'s errors. Returns the
    files."""
    import torch
    from safetensors import safe_open

    files = weights_files(hf_dir)
    for path in files:
        if not os.path.isfile(path):
            raise DataError(path, 0, f"not found, though the index names it: download {os.path.basename(path)}")
        with download(path):
            if path.endswith(".safetensors"):
                with safe_open(path, "pt") as f:
                    f.keys()
            else:
                if os.path.getsize(path) == 0:
                    raise DataError(path, 0, f"empty file: re-download {os.path.basename(path)}")
                # a whole zip archive (torch's format) is read without its tensors, which stay on disk; anything
                # else (a cut archive, torch's pre-zip format) is read as transformers would read it
                zipped = zipfile.is_zipfile(path)
                torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    return files


def load_model(model_class, hf_dir: str, missing_ok: Sequence[str] = (), unexpected_ok: bool = True):
    """``model_class.from_pretrained(hf_dir)`` (local files only) once :func:`check_weights` passed;
    refused (naming the tensors) when the weights lack a tensor of the model (other than those
    starting with a prefix of ``missing_ok``), hold one of another shape, or (``unexpected_ok``
    false) hold one the model has no place for."""
    check_weights(hf_dir)
    # weights of other shapes than config.json's are listed in the loading info (refused below), not raised
    model, info = model_class.from_pretrained(
        hf_dir, local_files_only=True, output_loading_info=True, ignore_mismatched_sizes=True
    )
    missing = sorted(k for k in info.get("missing_keys") or [] if not k.startswith(tuple(missing_ok)))
    problems = []
    if missing:
        problems.append(
            f"the weights lack {len(missing)} tensor(s), which transformers would start at random: "
            f"{some_names(missing)}"
        )
    unexpected = sorted(info.get("unexpected_keys") or [])
    if unexpected and not unexpected_ok:
        problems.append(
            f"the weights hold {len(unexpected)} tensor(s) the model has no place for: {some_names(unexpected)}"
        )
    mismatched = sorted(_shapes(k) for k in info.get("mismatched_keys") or [])
    if mismatched:
        problems.append(f"{len(mismatched)} tensor(s) of other shapes than config.json's: {some_names(mismatched)}")
    if problems:
        raise DataError(hf_dir, 0, "; ".join(problems))
    return model


def _shapes(key) -> str:
    """``name (weights' shape -> config.json's)`` of a ``mismatched_keys`` entry (a name, or name and shapes)."""
    if isinstance(key, (tuple, list)) and len(key) == 3:
        name, theirs, ours = key
        return f"{name} {tuple(theirs)} -> {tuple(ours)}"
    return str(key)


def read_fairseq_checkpoint(path: str) -> dict:
    """A fairseq checkpoint (a dict with ``"model"``), read weights-only; what cannot be read stops
    with :func:`download`'s errors."""
    import torch

    check_checkpoint_file(path)
    with download(path):  # importing checkpoint_compat allow-listed the types fairseq checkpoints hold
        state = torch.load(path, map_location="cpu")
    if not isinstance(state, dict) or "model" not in state:
        what = "a dict without 'model'" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise DataError(path, 0, f"holds {what}, not a fairseq checkpoint")
    return state


def check_vocab_size(vocab_path: str, n_tokens: int, config_path: str, n_rows: int, allowed: str = "") -> None:
    """Refuse a vocabulary of ``n_tokens`` beside a model of ``n_rows`` embedding rows (``vocab_size``
    of ``config_path``): a tokenizer of another model. ``allowed``: what ``--allow-vocab-mismatch``
    does with the difference (empty: the converter offers no such flag for this case)."""
    if n_tokens == n_rows:
        return
    fix = "use the vocabulary released with this model"
    if allowed:
        fix += f", or pass --allow-vocab-mismatch if the sizes differ on purpose ({allowed})"
    raise DataError(
        vocab_path,
        0,
        f"{n_tokens} tokens for the {n_rows} embedding rows of the model (vocab_size in {config_path}): "
        f"not this model's vocabulary; {fix}",
    )


def read_fairseq_dictionary(path: str):
    """fairseq's ``Dictionary.load`` of a released ``dict.txt``; what it cannot read stops naming the file."""
    from fairseq.data import Dictionary

    if not os.path.isfile(path):
        raise DataError(path, 0, "dictionary not found")
    read_text(path)  # bytes that are not UTF-8: named by line
    try:
        return Dictionary.load(path)
    except (ValueError, RuntimeError) as e:
        raise DataError(path, 0, f"not a fairseq dict.txt ({e}): re-download {os.path.basename(path)}") from None
