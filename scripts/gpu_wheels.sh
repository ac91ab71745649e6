#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs on a GPU machine that has Python 3.12, torch (CUDA), NumPy 2.x and no
# fairseq, and no network: fairseq-fixed (its cp312 manylinux wheel), a NumPy < 2 (fairseq 0.12 reads
# np.compat.long), hydra-core, omegaconf and antlr4 (fairseq's config), bitarray (fairseq's data code) and this
# package's light dependencies (sacremoses, subword-nmt), each with --no-deps. simplemma (64 MiB of lemma data, read
# only by the evaluation's concept coverage) stays behind: the check trains and decodes, it does not score. What that machine
# already holds (torch, scipy, scikit-learn, sacrebleu, regex, tqdm, PyYAML, ...) is not fetched.
#
#   bash scripts/gpu_wheels.sh [--dry-run] [WHEEL_DIR]     # WHEEL_DIR: .whl (ignored by git)
#
# --dry-run lists each wheel, its file and size from the registry, and the total, and downloads nothing. Without
# it the wheels go to WHEEL_DIR (antlr4-python3-runtime 4.9.3 has no wheel on the registry: it is built here from
# its source, pure Python), their total is checked against LIMIT_MIB (default 48: what travels to the device
# machine, the working tree included, may be 64 MiB), and the one command that installs them there and runs the
# check is printed (docs/gpu.md). Exit status: 0 done, 1 a download or the size check failed, 2 bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = --dry-run ]; then
  DRY=1
  shift
fi
case "${1:-}" in -*) echo "usage: bash scripts/gpu_wheels.sh [--dry-run] [WHEEL_DIR]" >&2; exit 2 ;; esac
DIR=${1:-.whl}
LIMIT_MIB=${LIMIT_MIB:-48}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
# name==version of every wheel (one version each: two of a name stop the whole install there)
WHEELS=(
  fairseq-fixed==0.12.3.1
  numpy==1.26.4
  hydra-core==1.3.2
  omegaconf==2.3.0
  antlr4-python3-runtime==4.9.3
  bitarray==2.9.3
  sacremoses==0.1.1
  subword-nmt==0.3.8
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
INSTALL="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
$DIR/*.whl && export PYTHONPATH=/tmp/site:\$PWD && PYTHON=python3 bash scripts/gpu_check.sh"

if [ "$DRY" = 1 ]; then
  "$PY" - "$LIMIT_MIB" "${WHEELS[@]}" <<'PY'
"""Each wheel pip would fetch for CPython 3.12 on manylinux x86_64, read from the registry's JSON API."""
import json
import re
import sys
import urllib.request

limit, specs = float(sys.argv[1]), sys.argv[2:]
platform = re.compile(r"manylinux(1|2010|2014|_2_\d+)_x86_64")


def pick(files):
    """The cp312 manylinux x86_64 wheel, else a pure-Python one, else the source (built there into a wheel)."""
    wheels = [f for f in files if f["filename"].endswith(".whl")]
    for f in wheels:
        name = f["filename"]
        if "-cp312-cp312-" in name and platform.search(name):
            return f, "wheel"
    for f in wheels:
        if f["filename"].endswith("-none-any.whl") and "py3" in f["filename"]:
            return f, "wheel"
    sdists = [f for f in files if f["packagetype"] == "sdist"]
    return (sdists[0], "built here from source") if sdists else (None, None)


total, ok = 0, True
for spec in specs:
    name, version = spec.split("==")
    try:
        with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as r:
            files = json.load(r)["releases"].get(version, [])
    except OSError as e:
        print(f"{spec}: registry not reachable ({e})", file=sys.stderr)
        sys.exit(1)
    f, how = pick(files)
    if f is None:
        print(f"{spec}: no cp312 manylinux x86_64 wheel, pure-Python wheel or source on the registry")
        ok = False
        continue
    total += f["size"]
    print(f"{spec:34s} {f['size'] / 2**20:7.2f} MiB  {f['filename']}" + ("" if how == "wheel" else f"  ({how})"))
print(f"total {total / 2**20:.2f} MiB of at most {limit:g} MiB (nothing downloaded)")
sys.exit(0 if ok and total <= limit * 2**20 else 1)
PY
  exit $?
fi

mkdir -p "$DIR"
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}
  if [ "$name" = antlr4-python3-runtime ]; then  # source only on the registry: a pure-Python wheel, built here
    "$PY" -m pip wheel -q --no-deps -w "$DIR" "$spec"
  else
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${platform_args[@]}" -d "$DIR" "$spec"
  fi
done
total=$(du -cb "$DIR"/*.whl | tail -n 1 | cut -f1)
ls -l "$DIR"/*.whl | awk '{printf "%8.2f MiB  %s\n", $5 / 1048576, $NF}'
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "error: $DIR: the wheels take $((total / 1048576)) MiB, more than LIMIT_MIB=$LIMIT_MIB" >&2
  exit 1
fi
echo "total $((total / 1048576)) MiB in $DIR. On the GPU machine, from the repository root, with $DIR carried:"
echo "  $INSTALL"
