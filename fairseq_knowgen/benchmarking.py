"""Speed and memory of an architecture against fairseq's ``transformer`` of the same size.

``scripts/benchmark.py`` is the command line. Both models train and decode the same data
in separate worker processes (so each has its own peak RSS), interleaved A B B A ... so
that a slow period of the machine hits both, with one thread each (``OMP_NUM_THREADS=1``).
Reported ratios are arch / baseline: 1.0 is parity, higher is faster.

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

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

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


def make_data(kind: str, workdir: str, n_train: int, n_valid: int, vocab: int = 0):
    """``(data_dir, {"arch": [...], "baseline": [...]})`` for a profile's ``data`` entry (``vocab``: see
    :func:`make_synthetic_data`; the built-in sets only)."""
    if ":" not in kind:
        return make_synthetic_data(workdir, n_train, n_valid, kind, vocab), {}
    if vocab:
        raise ValueError(f"--vocab pads the built-in synthetic data only, not {kind}")
    out = _function(kind)(workdir, n_train, n_valid)
    return out if isinstance(out, tuple) else (out, {})


def make_synthetic_data(workdir: str, n_train: int, n_valid: int, kind: str = "triples", vocab: int = 0) -> str:
    """The built-in triples-to-text data set, binarized with a joined dictionary.

    ``kind="eki"``: sources become retrieve-and-edit inputs ``objects <sep> prototype``
    (the triples' objects as concepts, another example's target as the prototype).
    ``vocab``: pad the dictionary (a few hundred types) to ``vocab`` entries with fairseq's unused
    ``madeupword`` symbols (``fairseq-preprocess --padding-factor``), so that costs growing with the
    vocabulary (output layer, a copy head's mixture) weigh as on real data (CommonGen: 7,496 BPE types).
    """
    from .demo_data import make_dataset

    raw, out = os.path.join(workdir, "raw"), os.path.join(workdir, "bin")
    make_dataset(raw, train=n_train, valid=n_valid, test=n_valid, seed=7)
    if kind == "eki":
        for split in ("train", "valid"):
            src = open(f"{raw}/{split}.src").read().splitlines()
            tgt = open(f"{raw}/{split}.tgt").read().splitlines()
            concepts = [" ".join(w for part in s.split("<O>")[1:] for w in part.split("<S>")[0].split()) for s in src]
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


def build(prof: Dict, data: str, model_args: List[str], max_tokens: int = 2048):
    """``(task, model, criterion)`` of profile ``prof`` (:func:`profile`, :func:`baseline_profile`)
    on ``data`` (train and valid loaded), with ``model_args`` after the profile's own arguments."""
    from fairseq import options, tasks

    import fairseq_knowgen  # noqa: F401

    if "data_extra" in prof:
        model_args = _function(prof["data_extra"])(data) + list(model_args)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            data,
            "--task",
            prof["task"],
            "--arch",
            prof["arch"],
            "--criterion",
            prof["criterion"],
            "--cpu",
            "--seed",
            "1",
            "--max-tokens",
            str(max_tokens),
            *prof["extra"],
            *model_args,
        ],
    )
    task = tasks.setup_task(args)
    task.load_dataset("train")
    task.load_dataset("valid")
    return task, task.build_model(args), task.build_criterion(args)


def worker(
    arch: str,
    data: str,
    model_args: List[str],
    updates: int,
    gen_sents: int,
    max_tokens: int,
    beam: int,
    gen_len: int = 20,
    baseline: bool = False,
    against: Optional[str] = None,
) -> Dict:
    """Train ``arch`` (when ``baseline``: the model of :func:`baseline_profile` of ``arch`` and
    ``against``) ``updates`` steps and decode ``gen_sents`` valid sentences (unless the profile
    says ``generate: False``); return timings.
    Training goes through ``task.train_step``, so tasks that update more than one module per
    step (a discriminator) are timed whole."""
    import torch

    torch.set_num_threads(1)
    from fairseq.dataclass.configs import GenerationConfig

    prof = baseline_profile(arch, against) if baseline else profile(arch)
    task, model, criterion = build(prof, data, model_args, max_tokens)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    class Backward:  # the one optimizer method task.train_step calls
        @staticmethod
        def backward(loss):
            loss.backward()

    batches = task.get_batch_iterator(
        task.dataset("train"), max_tokens=max_tokens, seed=1, ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=True)
    batches = list(batches)

    def step(sample, update_num):
        task.train_step(sample, model, criterion, Backward, update_num)
        opt.step()
        opt.zero_grad()
        return sample["ntokens"]

    model.train()
    for i in range(3):  # warm-up, not timed
        step(batches[i % len(batches)], i)
    words, t0 = 0, time.perf_counter()
    for i in range(updates):
        words += step(batches[(i + 3) % len(batches)], i + 3)
    train_s = time.perf_counter() - t0
    result = {
        "arch": prof["arch"],
        "profile": prof.get("name", prof["arch"]),
        "train_words": words,
        "train_s": train_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if not prof.get("generate", True):
        return result

    model.eval()
    # an untrained model would stop at once: fix the output length so both models decode
    # the same number of steps (a typical sentence length of the data sets here)
    generator = task.build_generator(
        [model], GenerationConfig(beam=beam, min_len=gen_len, max_len_a=0, max_len_b=gen_len)
    )
    gen_batches = list(
        task.get_batch_iterator(task.dataset("valid"), max_sentences=32, ignore_invalid_inputs=True).next_epoch_itr(
            shuffle=False
        )
    )
    with torch.no_grad():
        task.inference_step(generator, [model], gen_batches[0])  # warm-up
        sents, t0 = 0, time.perf_counter()
        for b in gen_batches:
            if sents >= gen_sents:
                break
            task.inference_step(generator, [model], b)
            sents += b["nsentences"]
        gen_s = time.perf_counter() - t0
    result.update(gen_sents=sents, gen_s=gen_s)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def run_worker_process(script: str, baseline: bool, opts) -> Dict:
    cmd = [
        sys.executable,
        script,
        "--worker",
        "--arch",
        opts.arch,
        "--data",
        opts.data,
        "--updates",
        str(opts.updates),
        "--gen-sents",
        str(opts.gen_sents),
        "--max-tokens",
        str(opts.max_tokens),
        "--beam",
        str(opts.beam),
        "--gen-len",
        str(opts.gen_len),
        "--layers",
        str(opts.layers),
        "--embed-dim",
        str(opts.embed_dim),
        "--heads",
        str(opts.heads),
    ]
    if opts.model_args:
        cmd += ["--model-args", opts.model_args]
    if opts.data_args:
        cmd += ["--data-args", json.dumps(opts.data_args)]
    if baseline:
        cmd += ["--baseline"]
    if getattr(opts, "against", None):
        cmd += ["--against", opts.against]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark worker ({'baseline of ' if baseline else ''}{opts.arch}) failed:\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(script: str, opts) -> Dict:
    """Interleave workers A B B A (x rounds/2) and return the summary dict."""
    own_tmp = None
    if not opts.data:
        own_tmp = tempfile.TemporaryDirectory(prefix="knowgen-bench-")
        opts.data, opts.data_args = make_data(
            PROFILES[opts.arch].get("data", "triples"), own_tmp.name, opts.n_train, opts.n_valid,
            getattr(opts, "vocab", 0),
        )
    runs = {"arch": [], "base": []}
    order = []
    for r in range(opts.rounds):
        order += ["arch", "base"] if r % 2 == 0 else ["base", "arch"]
    for role in order:
        res = run_worker_process(script, role == "base", opts)
        runs[role].append(res)
        print(json.dumps(res), file=sys.stderr)
    if own_tmp is not None:
        own_tmp.cleanup()

    def rates(rs):
        gen = [r for r in rs if "gen_s" in r]
        return (
            sum(r["train_words"] for r in rs) / sum(r["train_s"] for r in rs),
            sum(r["gen_sents"] for r in gen) / sum(r["gen_s"] for r in gen) if gen else None,
            max(r["peak_rss_mb"] for r in rs),
        )

    base = baseline_profile(opts.arch, getattr(opts, "against", None))
    a_wps, a_sps, a_rss = rates(runs["arch"])
    b_wps, b_sps, b_rss = rates(runs["base"])
    return {
        "arch": opts.arch,
        "baseline": base.get("name", base.get("arch", BASELINE)),
        "train_wps_ratio": round(a_wps / b_wps, 4),
        "generate_sents_per_s_ratio": round(a_sps / b_sps, 4) if a_sps and b_sps else None,
        "peak_rss_mb": round(a_rss, 1),
        "baseline_peak_rss_mb": round(b_rss, 1),
        "train_wps": round(a_wps, 1),
        "baseline_train_wps": round(b_wps, 1),
        "beam": opts.beam,
        "rounds": opts.rounds,
    }
