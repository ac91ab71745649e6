"""What the benchmark trains, and on what data: the profile of each architecture, the model sizes, the
synthetic and real data sets. ``scripts/gpu_check.sh`` reads this module alone; :mod:`benchmarks.harness`
times the runs.

Every architecture of this package has a :data:`PROFILES` entry with the task, criterion
and extra arguments it needs, so ``--arch NAME`` alone is enough. A profile may also name

- ``data``: ``"triples"`` / ``"eki"`` (the built-in synthetic sets) or ``"module:function"``, a
  function ``(workdir, n_train, n_valid)`` returning the binarized data directory, or a pair
  ``(data_dir, {"arch": [...], "baseline": [...]})`` with extra arguments for each side (a frozen
  LM's checkpoint path, say);
- ``sizes``: which size flags ``--layers/--embed-dim/--heads`` become: ``"seq2seq"`` (encoder and
  decoder, the default), ``"encoder"``, ``"decoder"`` or ``"none"`` (the arch takes its sizes from
  a checkpoint);
- ``baseline``: the model the ratios are against (default: fairseq's ``transformer`` on the same
  data); an encoder-only arch compares with itself without the feature under test, a language
  model with a plain ``transformer_lm``;
- ``generate``: ``False`` for models without a decoder (only the training ratio is reported);
- ``data_extra``: ``"module:function"``, a function ``(data_dir)`` returning more arguments for that
  model read from the data it trains on (fairseq's ``transformer_pointer_generator`` needs the
  number of ``<unk-N>`` markers that end the dictionary: ``--source-position-markers K``).

``--against NAME`` (``scripts/benchmark.py``) measures against another profiled arch instead of the
profile's baseline, on the arch's data: ``--arch copy_transformer_small --against
transformer_pointer_generator`` compares our copy model with fairseq's own pointer-generator (its
peer), both at the same size and on the same data.

A profile's key is the ``--arch`` name of the benchmark; the fairseq architecture it trains is its
``arch`` entry when it has one (default: the key). The methods composed by flags
(:mod:`fairseq_knowgen.models.eki`: ``--copy``, ``--dimattn-*``; ``copy_transformer --dimattn-*``)
have keys ``BASE+METHOD[+METHOD]``, BASE the profile they extend, METHOD one of :data:`COMPOSED_FLAGS`
(``copy``: the copy head, trained with the ``*force_copy`` criterion; ``dimattn``: diminishing
attention, DyDimAttn). Their baseline is BASE, the same model with those flags off on the same data,
so the ratios are the composition's cost (``eki_transformer+copy+dimattn`` vs ``eki_transformer``,
``copy_transformer_small+dimattn`` vs ``copy_transformer_small``); ``--against`` still overrides it.
"""

import os
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

BASELINE = "transformer"

# arch -> how to train it: task, criterion, extra arguments (model flags of that arch)
PROFILES: Dict[str, Dict] = {
    "transformer": {"task": "translation", "criterion": "label_smoothed_cross_entropy", "extra": []},
    "transformer_dimattn": {"task": "translation", "criterion": "label_smoothed_cross_entropy", "extra": []},
    "bart_dimattn_base": {"task": "translation", "criterion": "label_smoothed_cross_entropy", "extra": []},
    "bart_dimattn_large": {"task": "translation", "criterion": "label_smoothed_cross_entropy", "extra": []},
    "copy_transformer": {"task": "translation", "criterion": "force_copy", "extra": []},
    "copy_transformer_small": {"task": "translation", "criterion": "force_copy", "extra": []},
    # fairseq's own pointer-generator (fairseq_knowgen.models.fairseq_pointer_generator), the copy models' peer:
    # p_gen unsupervised, fairseq's criterion; its --source-position-markers from the data's dictionary, and its
    # decoder output tied to its input embedding (untied, it fails its own assertion on data with markers)
    "transformer_pointer_generator": {
        "task": "translation",
        "criterion": "label_smoothed_cross_entropy",
        "extra": ["--share-decoder-input-output-embed"],
        "data_extra": "fairseq_knowgen.prep.position_markers:model_args",
    },
    "eki_transformer": {
        "task": "eki_generation",
        "criterion": "eki_label_smoothed_cross_entropy",
        "extra": ["--eki-scaling-dim", "64"],
        "data": "eki",
    },
    "eki_bart_base": {
        "task": "eki_generation",
        "criterion": "eki_label_smoothed_cross_entropy",
        "extra": [],
        "data": "eki",
    },
    "eki_bart_large": {
        "task": "eki_generation",
        "criterion": "eki_label_smoothed_cross_entropy",
        "extra": [],
        "data": "eki",
    },
    # K-BERT: the ratio is the visible matrix's cost: the same encoder on the same injected input without it
    "kbert_small": {
        "task": "kbert_classification",
        "criterion": "sentence_prediction",
        "extra": [],
        "data": "fairseq_knowgen.prep.kbert:make_benchmark_data",
        "sizes": "encoder",
        "generate": False,
        "baseline": {
            "arch": "kbert_small",
            "task": "kbert_classification",
            "criterion": "sentence_prediction",
            "extra": ["--no-visible-matrix"],
            "sizes": "encoder",
            "generate": False,
        },
    },
    # CoCon: the same frozen LM decoding alone (--cocon-mode lm) with the same search is the baseline; sizes come
    # from the LM checkpoint make_benchmark_data writes (4 layers x 128)
    "cocon_lm": {
        "task": "cocon_generation",
        "criterion": "cocon",
        "extra": ["--cocon-cycle-start", "0", "--cocon-adv-start", "0", "--cocon-cycle-steps", "4"],
        "data": "fairseq_knowgen.prep.cocon:make_benchmark_data",
        "sizes": "none",
        "baseline": {
            "arch": "cocon_lm",
            "task": "cocon_generation",
            "criterion": "cocon",
            "extra": [
                "--cocon-cycle-start",
                "0",
                "--cocon-adv-start",
                "0",
                "--cocon-cycle-steps",
                "4",
                "--cocon-mode",
                "lm",
            ],
            "sizes": "none",
        },
    },
}
# the flags that switch a method on in a model that composes it (see the module docstring)
COMPOSED_FLAGS: Dict[str, List[str]] = {"copy": ["--copy"], "dimattn": ["--dimattn-type", "dydim"]}
# with the copy head, a criterion that reads it: the force-copy loss (EKI's adds lambda L_E)
COPY_CRITERION = {"eki_label_smoothed_cross_entropy": "eki_force_copy"}


def composed_profile(base: str, *methods: str) -> Dict:
    """The profile of ``base`` with ``methods`` (keys of :data:`COMPOSED_FLAGS`) switched on by
    their flags, measured against ``base`` (same data, same sizes, flags off)."""
    prof = {k: v for k, v in PROFILES[base].items() if k != "baseline"}
    prof["arch"] = prof.get("arch", base)
    for m in methods:
        prof["extra"] = [*prof["extra"], *COMPOSED_FLAGS[m]]
        if m == "copy":
            prof["criterion"] = COPY_CRITERION[prof["criterion"]]
    prof["baseline"] = base
    return prof


COMPOSED = {
    "eki_transformer+copy": ("eki_transformer", "copy"),
    "eki_transformer+dimattn": ("eki_transformer", "dimattn"),
    "eki_transformer+copy+dimattn": ("eki_transformer", "copy", "dimattn"),
    # copy_transformer_small has its copy head already
    "copy_transformer_small+dimattn": ("copy_transformer_small", "dimattn"),
}
PROFILES.update({name: composed_profile(*parts) for name, parts in COMPOSED.items()})

# the default baseline trains on the same data as the arch (for EKI: the concatenated inputs)
BASELINE_PROFILE = {
    "arch": BASELINE,
    "task": "translation",
    "criterion": "label_smoothed_cross_entropy",
    "extra": [],
}
SIDES = {"seq2seq": ("encoder", "decoder"), "encoder": ("encoder",), "decoder": ("decoder",), "none": ()}


def profile(name: str) -> Dict:
    """``PROFILES[name]`` with its fairseq ``arch`` (default ``name``) and its ``name``."""
    return {"arch": name, **PROFILES[name], "name": name}


def baseline_profile(arch: str, against: Optional[str] = None) -> Dict:
    """The profile the ratios of ``arch`` are measured against: ``against``'s (another profiled
    arch) when given, else the one ``arch``'s profile names (a profile, or a profile's key)."""
    if against is not None:
        return profile(against)
    base = PROFILES[arch].get("baseline", BASELINE_PROFILE)
    return profile(base) if isinstance(base, str) else base


def describe(name: str) -> str:
    """One line of ``--help`` for a composed profile: its model, flags, criterion and baseline."""
    base, *methods = COMPOSED[name]
    prof, flags = PROFILES[name], " ".join(f for m in methods for f in COMPOSED_FLAGS[m])
    return f"{name} = --arch {prof['arch']} {flags} --criterion {prof['criterion']} (vs {base})"


def _function(spec: str):
    """The function a profile names as ``"module:function"``."""
    import importlib

    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


def size_args(layers: int, dim: int, heads: int, ffn_mult: int = 4, sizes: str = "seq2seq") -> List[str]:
    """Model-size flags for the ``sizes`` sides of a profile (ffn = ffn_mult x dim)."""
    flags = []
    for side in SIDES[sizes]:
        flags += [f"--{side}-layers", str(layers), f"--{side}-embed-dim", str(dim)]
        flags += [f"--{side}-ffn-embed-dim", str(ffn_mult * dim), f"--{side}-attention-heads", str(heads)]
    return flags


def make_data(
    kind: str,
    workdir: str,
    n_train: int,
    n_valid: int,
    vocab: int = 0,
    real: Optional[Tuple] = None,
    sizes: Optional[Tuple[int, int, int]] = None,
):
    """``(data_dir, {"arch": [...], "baseline": [...]})`` for a profile's ``data`` entry (``vocab``, ``real``:
    see :func:`make_synthetic_data`; the built-in sets only). ``sizes`` (layers, width, heads) goes to a data
    function that takes a ``sizes`` argument (CoCon's, whose frozen LM comes with its data)."""
    if ":" not in kind:
        return make_synthetic_data(workdir, n_train, n_valid, kind, vocab, real), {}
    if vocab:
        raise ValueError(f"--vocab pads the built-in synthetic data only, not {kind}")
    import inspect

    function = _function(kind)
    extra = {"sizes": sizes} if sizes and "sizes" in inspect.signature(function).parameters else {}
    out = function(workdir, n_train, n_valid, **extra)
    return out if isinstance(out, tuple) else (out, {})


REAL_SETS = ("commongen", "webnlg")


def real_pairs(root: str, name: str):
    """(source, target) lines of a real data set's dev split under ``root`` (``shared/data``'s
    layout, see its README), whitespace-tokenized as the files have them: CommonGen concept sets
    and references; WebNLG triples linearized ``<S> s <P> p <O> o`` and their texts."""
    if name == "commongen":
        base = os.path.join(root, "commongen", "commongen.dev")
        src = open(f"{base}.src_alpha.txt").read().splitlines()
        tgt = open(f"{base}.tgt.txt").read().splitlines()
        return list(zip(src, tgt))
    if name == "webnlg":
        import glob
        import xml.etree.ElementTree as ET

        pairs = []
        for path in sorted(glob.glob(os.path.join(root, "webnlg", "dev", "*triples", "*.xml"))):
            for entry in ET.parse(path).getroot().iter("entry"):
                triples = [t.text.split(" | ") for t in entry.iter("mtriple")]
                src = " ".join(f"<S> {a} <P> {b} <O> {c}".replace("_", " ") for a, b, c in triples)
                pairs += [(src, lex.text.strip()) for lex in entry.iter("lex") if lex.text]
        return pairs
    raise ValueError(f"unknown real data set {name!r}: one of {REAL_SETS}")


def make_synthetic_data(
    workdir: str, n_train: int, n_valid: int, kind: str = "triples", vocab: int = 0, real: Optional[Tuple] = None
) -> str:
    """The built-in triples-to-text data set, binarized with a joined dictionary.

    ``kind="eki"``: sources become retrieve-and-edit inputs ``objects <sep> prototype``
    (the triples' objects as concepts, another example's target as the prototype).
    ``vocab``: pad the dictionary (a few hundred types) to ``vocab`` entries with fairseq's unused
    ``madeupword`` symbols (``fairseq-preprocess --padding-factor``), so that costs growing with the
    vocabulary (output layer, a copy head's mixture) weigh as on real data (CommonGen: 7,496 BPE types).
    """
    from fairseq_knowgen.demo_data import make_dataset

    raw, out = os.path.join(workdir, "raw"), os.path.join(workdir, "bin")
    if real is None:
        make_dataset(raw, train=n_train, valid=n_valid, test=n_valid, seed=7)
    else:  # real lengths: the pairs of a real set (``real = (root, name)``), cycled to the sizes asked
        pairs = real_pairs(*real)
        os.makedirs(raw, exist_ok=True)
        for split, n, start in (("train", n_train, 0), ("valid", n_valid, n_train)):
            chosen = [pairs[(start + i) % len(pairs)] for i in range(n)]
            for side, k in (("src", 0), ("tgt", 1)):
                with open(f"{raw}/{split}.{side}", "w") as f:
                    f.writelines(p[k] + "\n" for p in chosen)
    if kind == "eki":
        for split in ("train", "valid"):
            src = open(f"{raw}/{split}.src").read().splitlines()
            tgt = open(f"{raw}/{split}.tgt").read().splitlines()
            if real is not None and real[1] == "commongen":
                concepts = src
            else:
                concepts = [
                    " ".join(w for part in line.split("<O>")[1:] for w in part.split("<S>")[0].split()) for line in src
                ]
            protos = tgt[1:] + tgt[:1]
            with open(f"{raw}/{split}.src", "w") as f:
                f.writelines(f"{c} <sep> {p}\n" for c, p in zip(concepts, protos))
    subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess"),
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--joined-dictionary",
            "--trainpref",
            f"{raw}/train",
            "--validpref",
            f"{raw}/valid",
            "--destdir",
            out,
            "--workers",
            "1",
            *(["--padding-factor", str(vocab)] if vocab else []),
        ],
        check=True,
        capture_output=True,
    )
    return out
