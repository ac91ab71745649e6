"""Shared fixtures: tiny data made by the tests themselves, and fairseq CLI runners."""

import os
import random
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # benchmarks/ and dev/ are folders of the repository, not of the installed package
    sys.path.insert(0, ROOT)
BIN = os.path.dirname(sys.executable)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def tiny_model(layers=2, dim=16, heads=2):
    """Model-size flags of the tiny models the tests train (ffn = 2 x dim)."""
    from benchmarks.profiles import size_args

    return size_args(layers, dim, heads, ffn_mult=2)


TINY_MODEL = tiny_model()
TINY_BART = tiny_model(layers=1)
TRAIN_COMMON = [
    "--user-dir",
    "fairseq_knowgen",
    "--cpu",
    "--seed",
    "1",
    "--optimizer",
    "adam",
    "--lr",
    "1e-3",
    "--max-tokens",
    "1000",
    "--no-progress-bar",
    "--log-interval",
    "1",
    "--no-epoch-checkpoints",
]


# fairseq prefetches batches in a daemon thread (--data-buffer-size, default 10). A training that stops
# within a second (the tests' --max-update 1-9) can exit while that thread is inside torch's C++ code;
# Python 3.11's shutdown then ends the thread with pthread_exit, which aborts the process (SIGABRT,
# "terminate called without an active exception", exit -6) after every file is written: a flaky failure
# under load (CI, 2026-12-02). Without the buffer the batches are the same, read in the main thread.
NO_PREFETCH_THREAD = ["--data-buffer-size", "0"]


# the files whose tests train and decode through fairseq's command lines or run whole recipes: marked ``slow``, so
# that ``bash scripts/test.sh -m "not slow"`` is the quick subset (README, "Extending and testing")
SLOW_FILES = {
    "test_recipes.py", "test_recipes_commongen.py", "test_cocon_recipe.py", "test_kbert_recipe.py", "test_commongen_pretrained.py",
    "test_cocon.py", "test_cocon_learning.py", "test_cocon_ddp.py", "test_ddp.py", "test_ddp_c10d.py",
    "test_eki_interactive.py", "test_interactive.py", "test_kbert_pretrained.py", "test_kbert_generation.py",
    "test_gpu_check.py", "test_constrained_decoding_docs.py", "test_convert_gpt2.py", "test_checkpoints.py",
    "test_eki.py", "test_dimattn_models.py", "test_kbert_model.py", "test_force_copy.py", "test_composed.py",
    "test_demo_data.py", "test_profile_cocon_decode.py", "test_clean_exit.py", "test_readme_own_data.py",
    "test_pointer_generator_peer.py", "test_constraints.py",
}  # fmt: skip


# the files that take longest, longest first (264 down to 41 s each on 2 cores, pytest --durations=0, 2026-12-07).
# scripts/test.sh hands whole files to the workers in collection order (--dist loadfile --no-loadscope-reorder): the
# long files start first and short ones fill in at the end, so no long file runs alone at the end on one core. (In
# xdist's default order, most tests first, the few-test recipe files came last; in two runs they still ended even.)
LONGEST_FIRST = (
    "test_recipes_commongen.py", "test_cocon_recipe.py", "test_kbert_recipe.py", "test_ddp_c10d.py",
    "test_constraints.py", "test_gpu_check.py", "test_ddp.py", "test_recipes.py", "test_commongen_pretrained.py",
    "test_kbert_pretrained.py", "test_interactive.py", "test_cocon_learning.py", "test_demo_data.py", "test_cocon.py",
    "test_checkpoints.py", "test_composed.py", "test_kbert_generation.py", "test_constrained_decoding_docs.py",
    "test_force_copy.py", "test_readme_own_data.py", "test_dimattn_models.py", "test_kbert.py", "test_kbert_model.py",
    "test_clean_exit.py", "test_eki.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


def run_cli(tool, *args, check=True, timeout=600, env=None):
    """Run a fairseq-* entry point (or a python script) from the repository root; fairseq-train
    without its prefetch thread (NO_PREFETCH_THREAD) unless the caller sets --data-buffer-size."""
    cmd = [os.path.join(BIN, tool)] if tool.startswith("fairseq-") else [sys.executable, tool]
    if tool == "-m":
        cmd = [sys.executable, "-m"]
    if tool == "fairseq-train" and "--data-buffer-size" not in map(str, args):
        args = (*args, *NO_PREFETCH_THREAD)
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    # its own process group, killed whole on timeout (subprocess.run would kill only the direct child)
    with subprocess.Popen(
        cmd + [str(a) for a in args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        start_new_session=True,
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise
    proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def preprocess(raw, out, *splits, dictionary="joined"):
    """fairseq-preprocess RAW/SPLIT.{src,tgt} (splits: train, valid, test prefixes) into OUT;
    ``dictionary``: ``"joined"`` (one dictionary built from the data), ``"separate"`` (one per
    side), or the path of a dictionary file used for both sides."""
    prefixes = []
    for flag, split in zip(("--trainpref", "--validpref", "--testpref"), splits):
        prefixes += [flag, raw / split]
    if dictionary == "joined":
        dict_args = ["--joined-dictionary"]
    elif dictionary == "separate":
        dict_args = []
    else:
        dict_args = ["--srcdict", dictionary, "--tgtdict", dictionary]
    run_cli(
        "fairseq-preprocess",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        *dict_args,
        *prefixes,
        "--destdir",
        out,
        "--workers",
        "1",
    )


def pretrain_tiny_bart(data, save_dir, updates):
    """A tiny BART checkpoint in fairseq's own format (``fairseq-train --arch bart_base``);
    returns its path and its model weights."""
    import torch

    run_cli(
        "fairseq-train",
        data,
        *TRAIN_COMMON,
        "--arch",
        "bart_base",
        *TINY_BART,
        "--max-update",
        str(updates),
        "--save-dir",
        save_dir,
    )
    path = save_dir / "checkpoint_last.pt"
    return path, torch.load(path)["model"]


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test starts from torch's seed 0, so that the random weights it draws are the same whatever ran before
    it in its process (an xdist worker runs many files; a test whose start came from the one before it failed 2 of
    400 starts). A test that has not imported torch yet gets torch's fixed start when it does."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory):
    from fairseq_knowgen.demo_data import make_dataset

    out = tmp_path_factory.mktemp("raw")
    make_dataset(str(out), train=200, valid=24, test=24, seed=3)
    return out


@pytest.fixture(scope="session")
def tiny_bin(tiny_raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("bin")
    preprocess(tiny_raw, out, "train", "valid", "test")
    return out


WORDS = "dog cat ball park run jump play throw catch field river boat sit swim".split()


@pytest.fixture(scope="session")
def eki_bin(tmp_path_factory):
    rng = random.Random(0)
    raw = tmp_path_factory.mktemp("ekiraw")
    for split, n in (("train", 160), ("valid", 16)):
        src, tgt = [], []
        for _ in range(n):
            a, b, c = rng.sample(WORDS, 3)
            proto = f"the {rng.choice(WORDS)} and the {a} are near the {rng.choice(WORDS)}"
            src.append(f"{a} {b} {c} <sep> {proto}")
            tgt.append(f"the {a} and the {b} {c} in the {rng.choice(WORDS)}")
        (raw / f"{split}.src").write_text("\n".join(src) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
    out = tmp_path_factory.mktemp("ekibin")
    preprocess(raw, out, "train", "valid")
    return out


@pytest.fixture(scope="session")
def word_level_bin(tiny_raw, tmp_path_factory):
    """Tiny demo data at word level with a vocabulary of frequent words only: most names
    become <unk-N> placeholders."""
    out = tmp_path_factory.mktemp("copybin")
    run_cli(
        "-m",
        "fairseq_knowgen.prep.placeholders",
        "encode",
        "--train-prefix",
        tiny_raw / "train",
        "--splits",
        tiny_raw / "train",
        tiny_raw / "valid",
        tiny_raw / "test",
        "--out-dir",
        out / "text",
        "--min-count",
        "25",
        "--min-source-df",
        "1000",
        "--max-positions",
        "40",
    )
    preprocess(out / "text", out / "bin", "train", "valid", "test", dictionary=out / "text" / "dict.txt")
    return out
