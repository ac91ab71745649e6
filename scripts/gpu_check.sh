#!/usr/bin/env bash
# GPU check: every architecture this package registers trains on a CUDA GPU with --fp16, then --bf16,
# then --amp, and decodes (fairseq-generate, beam 4); one table at the end.
#
#   bash scripts/gpu_check.sh [OUT_DIR]                # CUDA: UPDATES=200 updates per run
#   bash scripts/gpu_check.sh --cpu-dry-run [OUT_DIR]  # (or GPU_CHECK_DRY_RUN=1) the same runs on CPU, 2 updates each
#
# The architectures are read from fairseq's registry at run time (every arch whose model class lives in
# fairseq_knowgen), so a new one is included; its task, criterion and data come from
# benchmarks/profiles.py's PROFILES (or a profiled arch of the same model), else fairseq's translation
# task on the synthetic triples. Data are made here (tiny synthetic sets, as the benchmark makes them).
# Each run trains in this one Python process (fairseq_cli.train / generate), so imports and CUDA start once.
#
# Table columns: arch, mode, loss finite (every logged training loss), words per second as a ratio against
# fairseq's `transformer` of the same size trained in the same mode in this run (words: fairseq's ntokens,
# target tokens for seq2seq models, input tokens for K-BERT's classifiers, text tokens for CoCon), peak GPU
# memory (torch.cuda.max_memory_allocated of the run, GB), decoding (hypotheses written, all scores finite;
# n/a for classifiers), seconds. With 2+ GPUs: one more c10d DDP run per arch (--fp16, fairseq-train on 2
# GPUs, wps ratio against the same arch on one GPU).
#
# Variables: UPDATES (200; dry run 2), MODES ("fp16 bf16 amp"), LAYERS/DIM/HEADS (2/256/4: model size of every
# run), BUDGET_S (540: no new run starts after that many seconds; such rows say "skipped"), ARCHS (all).
# Exit status: 0 every run passed, 1 a run failed (its log is named), 2 no CUDA device (and no dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DRY=${GPU_CHECK_DRY_RUN:-0}
if [ "${1:-}" = --cpu-dry-run ]; then
  DRY=1
  shift
fi
OUT=${1:-$(mktemp -d -t gpu_check.XXXXXX)}
mkdir -p "$OUT"
START=$(date +%s)

echo "== stage 0: CUDA device" >&2
if [ "$DRY" != 1 ]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing to check." >&2
    echo "gpu_check: on a CPU machine, GPU_CHECK_DRY_RUN=1 (or --cpu-dry-run) runs the same path on CPU." >&2
    exit 2
  fi
  "$PY" -c 'import torch; print("gpu_check:", torch.cuda.device_count(), "x", torch.cuda.get_device_name(0))' >&2
else
  echo "gpu_check: CPU dry run (--cpu, 2 updates per run): checks the script, measures nothing" >&2
fi

echo "== stage 1: data, training and decoding runs in $OUT" >&2
export GPU_CHECK_DRY="$DRY" GPU_CHECK_OUT="$OUT" GPU_CHECK_START="$START"
"$PY" - <<'PY'
import contextlib
import io
import logging
import math
import os
import subprocess
import sys
import time
import traceback

import torch
from fairseq import trainer as trainer_module
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.tasks import TASK_DATACLASS_REGISTRY

import fairseq_knowgen  # noqa: F401  (registers the archs)
from benchmarks import profiles as bm

DRY = os.environ["GPU_CHECK_DRY"] == "1"
OUT = os.environ["GPU_CHECK_OUT"]
START = float(os.environ["GPU_CHECK_START"])
UPDATES = int(os.environ.get("UPDATES", "2" if DRY else "200"))
WARMUP = 0 if DRY else 20  # updates not timed (CUDA kernels' first calls, the optimizer's first state)
MODES = os.environ.get("MODES", "fp16 bf16 amp").split()
LAYERS, DIM, HEADS = (int(os.environ.get(k, d)) for k, d in (("LAYERS", "2"), ("DIM", "256"), ("HEADS", "4")))
BUDGET_S = float(os.environ.get("BUDGET_S", "540"))
DEVICE = ["--cpu"] if DRY else []
CUDA = not DRY
TRAIN_FLAGS = {"fp16": ["--fp16"], "bf16": ["--bf16"], "amp": ["--amp"]}
# fairseq-generate casts to fp16 only (--fp16: model.half()); --bf16 and --amp are training flags there
GEN_FLAGS = {"fp16": ["--fp16"], "bf16": [], "amp": []}
# the dry run only walks the path: a fifth of the data in quarter batches (CoCon's 2 updates of 4,096 tokens in fp16
# on a CPU took 12 of its 14 s)
N_TRAIN, N_VALID = (80, 16) if DRY else (400, 32)
MAX_TOKENS = "1024" if DRY else "4096"

# archs of ours without a profile of their own or a profiled sibling
LOCAL_PROFILES = {
    "kbert_transformer": {
        "task": "kbert_translation",
        "criterion": "label_smoothed_cross_entropy",
        "extra": ["--share-all-embeddings"],
        "data": "__main__:kbert_translation_data",
    },
}


def bf16_without_tpu():
    """fairseq 0.12's argument parser makes --bf16 imply --tpu (fairseq/options.py), so fairseq-train --bf16 on a
    GPU looks for torch_xla and stops ('NoneType' object has no attribute 'xla_device'). Here --bf16 means bf16
    on the device in use (the GPU; the CPU in the dry run), as fairseq-hydra-train's config has it."""
    from fairseq import options

    parse = options.parse_args_and_arch

    def parse_args_and_arch(*args, **kwargs):
        out = parse(*args, **kwargs)
        ns = out[0] if isinstance(out, tuple) else out
        if getattr(ns, "bf16", False) and "--tpu" not in sys.argv:
            ns.tpu = False
        return out

    options.parse_args_and_arch = parse_args_and_arch


bf16_without_tpu()
if DRY:
    # fairseq's FP16Optimizer (--fp16, --bf16) keys its fp32 master copy by torch.cuda.current_device() and
    # builds it on the parameters' device: on CPU only that call needs an answer
    torch.cuda.current_device = lambda: 0


def kbert_translation_data(workdir, n_train, n_valid):
    """The triples data and its KG (every training triple, prep.kbert webnlg-kg)."""
    data = bm.make_synthetic_data(workdir, n_train, n_valid)
    kg = os.path.join(workdir, "kg.spo")
    subprocess.run(
        [sys.executable, "-m", "fairseq_knowgen.prep.kbert", "webnlg-kg", "--src", f"{workdir}/raw/train.src", "--out", kg],
        check=True,
        capture_output=True,
    )
    return data, {"arch": ["--kg", kg]}


def our_archs():
    chosen = os.environ.get("ARCHS", "").split()
    archs = sorted(a for a, cls in ARCH_MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_knowgen."))
    return [a for a in archs if not chosen or a in chosen]


def profile_for(arch):
    if arch in bm.PROFILES:
        return bm.profile(arch)
    model = ARCH_MODEL_NAME_REGISTRY[arch]
    for other in bm.PROFILES:  # a profiled arch of the same model (kbert_base: kbert_small's)
        if "+" not in other and ARCH_MODEL_NAME_REGISTRY.get(bm.PROFILES[other].get("arch", other)) == model:
            return {**bm.profile(other), "arch": arch, "name": arch}
    return {**LOCAL_PROFILES.get(model, bm.BASELINE_PROFILE), "arch": arch, "name": arch}


_data = {}


def data_for(prof):
    """(data dir, extra arguments) of a profile's data kind, made once."""
    kind = prof.get("data", "triples")
    if kind not in _data:
        workdir = os.path.join(OUT, "data", kind.replace(":", "_").replace(".", "_"))
        data, extra = bm.make_data(kind, workdir, N_TRAIN, N_VALID)
        extra = list(extra.get("arch", []))
        if "data_extra" in prof:
            extra += bm._function(prof["data_extra"])(data)
        _data[kind] = (str(data), [str(x) for x in extra])
    return _data[kind]


def task_flags(task, args):
    """The flags of ``args`` (with their values) that the task's config knows: fairseq-generate needs them."""
    fields = set(TASK_DATACLASS_REGISTRY[task].__dataclass_fields__)
    out, i = [], 0
    while i < len(args):
        a = args[i]
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        if a.startswith("--") and a[2:].replace("-", "_") in fields:
            out += args[i : i + 1 + takes_value]
        i += 1 + takes_value
    return out


class Recorder:
    """Observes fairseq's Trainer (not changed): each update's loss and, after WARMUP updates, the
    tokens trained on and the time they took (the device synchronized at both ends)."""

    def __init__(self):
        self.losses, self.words, self.t0, self.t1 = [], 0, None, None
        self._step = trainer_module.Trainer.train_step

    def __enter__(self):
        rec = self

        def train_step(trainer, samples, *args, **kwargs):
            if trainer.get_num_updates() == WARMUP and rec.t0 is None:
                rec.t0 = clock()
            out = rec._step(trainer, samples, *args, **kwargs)
            if out is not None:
                rec.losses.append(float(out.get("loss", float("nan"))))
            if rec.t0 is not None:
                rec.words += sum(int(s.get("ntokens", 0)) for s in samples if s)
            return out

        trainer_module.Trainer.train_step = train_step
        return self

    def __exit__(self, *exc):
        trainer_module.Trainer.train_step = self._step
        self.t1 = clock()

    def wps(self):
        return self.words / (self.t1 - self.t0) if self.t0 is not None and self.t1 > self.t0 else float("nan")


def clock():
    if CUDA:
        torch.cuda.synchronize()
    return time.perf_counter()


@contextlib.contextmanager
def logged_to(path):
    """fairseq's log records (and anything printed) of one run go to ``path``, not the console."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    root = logging.getLogger()
    consoles = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    levels = [h.level for h in consoles]
    root.addHandler(handler)
    for h in consoles:
        h.setLevel(logging.CRITICAL + 1)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            yield out
    finally:
        root.removeHandler(handler)
        handler.close()
        for h, level in zip(consoles, levels):
            h.setLevel(level)
        with open(path, "a") as f:
            f.write(out.getvalue())


def cli(tool, argv):
    """``fairseq-TOOL ARGV`` in this process; SystemExit with a non-zero code is an error."""
    import importlib

    module = importlib.import_module(f"fairseq_cli.{tool}")
    saved = sys.argv
    sys.argv = [f"fairseq-{tool}", *map(str, argv)]
    try:
        module.cli_main()
    except SystemExit as e:
        if e.code not in (0, None):
            raise RuntimeError(f"fairseq-{tool} exited with {e.code}") from e
    finally:
        sys.argv = saved


def run(arch, prof, mode):
    """Train one (arch, mode) and decode it; the table row as a dict."""
    row = {"arch": arch, "mode": mode, "finite": "-", "wps": float("nan"), "peak": "-", "decode": "-", "secs": 0.0}
    if time.time() - START > BUDGET_S:
        row["status"] = "skipped (budget)"
        return row
    t_start = time.time()
    name = f"{arch}.{mode}"
    run_dir = os.path.join(OUT, "runs", name)
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "train.log")
    try:
        data, data_args = data_for(prof)
        extra = [*prof["extra"], *data_args]
        sizes = bm.size_args(LAYERS, DIM, HEADS, sizes=prof.get("sizes", "seq2seq"))
        train = [data, "--user-dir", "fairseq_knowgen", "--task", prof["task"], "--arch", arch]
        train += ["--criterion", prof["criterion"], *extra, *sizes, *TRAIN_FLAGS[mode], *DEVICE]
        train += ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt"]
        train += ["--warmup-updates", "50", "--clip-norm", "1.0", "--max-tokens", MAX_TOKENS, "--max-update", UPDATES]
        train += ["--seed", "1", "--disable-validation", "--save-dir", os.path.join(run_dir, "ckpt")]
        train += ["--no-epoch-checkpoints", "--save-interval", "1000000", "--log-format", "simple", "--log-interval", "50"]
        train += ["--num-workers", "0", "--data-buffer-size", "0"]
        if CUDA:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        with logged_to(log), Recorder() as rec:
            cli("train", train)
        row["finite"] = "yes" if rec.losses and all(math.isfinite(x) for x in rec.losses) else "NO"
        row["wps"] = rec.wps()
        if CUDA:
            row["peak"] = f"{torch.cuda.max_memory_allocated() / 1e9:.2f}"
        if prof.get("generate", True):
            gen = [data, "--user-dir", "fairseq_knowgen", "--task", prof["task"], *task_flags(prof["task"], extra)]
            gen += ["--path", os.path.join(run_dir, "ckpt", "checkpoint_last.pt"), "--gen-subset", "valid"]
            gen += ["--beam", "4", "--batch-size", "64", "--max-len-a", "0", "--max-len-b", "20", *GEN_FLAGS[mode]]
            gen += [*DEVICE, "--num-workers", "0"]
            with logged_to(os.path.join(run_dir, "generate.log")) as out:
                cli("generate", gen)
            hyps = [line.split("\t") for line in out.getvalue().splitlines() if line.startswith("H-")]
            ok = hyps and all(math.isfinite(float(h[1])) for h in hyps)
            row["decode"] = f"{len(hyps)} ok" if ok else f"{len(hyps)} FAILED"
        else:
            row["decode"] = "n/a"
        row["status"] = "ok" if row["finite"] == "yes" and "FAILED" not in row["decode"] else f"FAILED: see {run_dir}"
    except Exception:
        with open(log, "a") as f:
            f.write(traceback.format_exc())
        row["status"] = f"FAILED: {traceback.format_exc().strip().splitlines()[-1][:80]} (see {log})"
    row["secs"] = time.time() - t_start
    print(f"gpu_check: {name}: {row['status']} in {row['secs']:.0f}s (elapsed {time.time() - START:.0f}s)", file=sys.stderr)
    return row


def run_ddp(arch, prof, single):
    """c10d DDP (fairseq's default backend) on 2 GPUs, --fp16, as a fairseq-train process."""
    row = {"arch": arch, "mode": "fp16 ddp2", "finite": "-", "wps": float("nan"), "peak": "-", "decode": "n/a", "secs": 0.0}
    if time.time() - START > BUDGET_S:
        row["status"] = "skipped (budget)"
        return row
    t_start = time.time()
    run_dir = os.path.join(OUT, "runs", f"{arch}.ddp2")
    os.makedirs(run_dir, exist_ok=True)
    data, data_args = data_for(prof)
    cmd = [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), data, "--user-dir", "fairseq_knowgen"]
    cmd += ["--task", prof["task"], "--arch", arch, "--criterion", prof["criterion"], *prof["extra"], *data_args]
    cmd += [*bm.size_args(LAYERS, DIM, HEADS, sizes=prof.get("sizes", "seq2seq")), "--fp16"]
    cmd += ["--distributed-world-size", "2", "--ddp-backend", "c10d", "--optimizer", "adam", "--lr", "5e-4"]
    cmd += ["--max-tokens", "4096", "--max-update", str(UPDATES), "--disable-validation", "--no-save"]
    cmd += ["--log-format", "simple", "--log-interval", "10", "--num-workers", "0"]
    with open(os.path.join(run_dir, "train.log"), "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(60, BUDGET_S + 60 - (time.time() - START)))
    text = open(os.path.join(run_dir, "train.log")).read()
    losses = [float(x.split("=")[1].split(",")[0]) for x in text.split() if x.startswith("loss=")]
    wps = [float(x.split("=")[1].split(",")[0]) for x in text.split() if x.startswith("wps=")]
    row["finite"] = "yes" if losses and all(math.isfinite(x) for x in losses) else "NO"
    row["wps"] = (wps[-1] / single) if wps and single else float("nan")
    row["status"] = "ok" if proc.returncode == 0 and row["finite"] == "yes" else f"FAILED: see {run_dir}/train.log"
    row["secs"] = time.time() - t_start
    print(f"gpu_check: {arch}.ddp2: {row['status']} in {row['secs']:.0f}s", file=sys.stderr)
    return row


archs = our_archs()
print(f"gpu_check: {len(archs)} architectures: {' '.join(archs)}; modes {' '.join(MODES)}; {UPDATES} updates each", file=sys.stderr)
rows, base_wps = [], {}
for mode in MODES:
    base = run(bm.BASELINE, bm.profile(bm.BASELINE), mode)
    base_wps[mode] = base["wps"]
    rows.append(base)
    rows += [run(arch, profile_for(arch), mode) for arch in archs]
for r in rows:
    r["ratio"] = r["wps"] / base_wps[r["mode"]] if base_wps.get(r["mode"]) else float("nan")
if CUDA and torch.cuda.device_count() >= 2:
    single = {r["arch"]: r["wps"] for r in rows if r["mode"] == "fp16"}
    rows += [dict(run_ddp(arch, profile_for(arch), single.get(arch)), ratio=float("nan")) for arch in archs]
    for r in rows[-len(archs):]:
        r["ratio"] = r["wps"]  # already against the same arch on one GPU

header = ["arch", "mode", "loss finite", "wps vs transformer", "peak GB", "decode", "s", "status"]
table = [header] + [
    [r["arch"], r["mode"], r["finite"], "-" if math.isnan(r["ratio"]) else f"{r['ratio']:.2f}", r["peak"], r["decode"],
     f"{r['secs']:.0f}", r["status"]]
    for r in rows
]
widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
print()
for i, row in enumerate(table):
    print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    if i == 0:
        print("-+-".join("-" * w for w in widths))
print(f"\ngpu_check: {'CPU dry run' if DRY else 'CUDA'}; {len(rows)} runs; elapsed {time.time() - START:.0f}s; logs in {OUT}/runs")
failed = [r for r in rows if r["status"].startswith("FAILED")]
sys.exit(1 if failed else 0)
PY
