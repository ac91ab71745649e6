#!/usr/bin/env bash
# Creates .venv/ inside the repository and installs everything fairseq-knowgen needs.
#
#   bash scripts/setup_env.sh        # idempotent: seconds when everything is installed
#
# - torch 2.13.0 (CPU build; pinned so that no other install pulls a second torch),
# - fairseq-fixed 0.12.3.1 (import name `fairseq`; a Python 3.11+ build of fairseq main),
#   installed with --no-deps --no-build-isolation so that it neither pulls torchaudio nor
#   rebuilds against another torch. Its C++ extensions take ~6 minutes to compile the first
#   time; pip's wheel cache (~/.cache/pip) makes later installs on the same machine fast.
# - the tools the recipes, scripts and tests use (see requirements.txt),
# - this package in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
VENV=$ROOT/.venv
STAMP=$VENV/.knowgen-installed
FAIRSEQ_VERSION=0.12.3.1
REQ_HASH=$(cat requirements.txt setup.py scripts/setup_env.sh | sha1sum | cut -d' ' -f1)

# installed: this set-up finished for these requirements, the package imports, and the `fairseq` import name is
# fairseq-fixed's, at its version (read from the installed distributions' metadata: a fifth of a second, where importing
# fairseq took 3-4 s at every recipe run and test command)
installed() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_HASH" ] \
    && "$VENV/bin/python" -c "
import importlib.metadata as m, sys, fairseq_knowgen
owners = m.packages_distributions().get('fairseq')
sys.exit(owners != ['fairseq-fixed'] or m.version('fairseq-fixed') != '$FAIRSEQ_VERSION')
" 2>/dev/null
}
installed && exit 0

# one installer at a time: demo.sh and test.sh started together must not both build .venv
exec 9>"$ROOT/.setup.lock"
if ! flock -n 9; then
  echo "[setup] another set-up is running in $ROOT; waiting for it" >&2
  flock 9
fi
installed && exit 0

if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    found=$("$PYTHON" --version 2>&1 || echo "no $PYTHON")
    echo "[setup] fairseq-fixed needs Python 3.10 or newer; found: $found (set PYTHON=/path/to/python3.11)" >&2
    exit 2
  fi
fi
echo "[setup] creating/updating $VENV" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade "pip>=23" wheel "setuptools<81"
# torch first and pinned: every later step sees it installed and installs no other. NumPy is
# requirements.txt's (< 2: fairseq 0.12 still reads np.compat.long); fairseq's extensions compile against it
NUMPY=$(sed -n 's/^\(numpy[^ #]*\).*/\1/p' requirements.txt)
$PIP install -q "torch==2.13.0" "$NUMPY" cython
$PIP install -q -r requirements.txt "torch==2.13.0"
have=$("$VENV/bin/python" -c "import fairseq; print(fairseq.__version__)" 2>/dev/null || true)
if [ "$have" != "$FAIRSEQ_VERSION" ]; then
  [ -z "$have" ] || echo "[setup] replacing fairseq $have by fairseq-fixed $FAIRSEQ_VERSION" >&2
  $PIP uninstall -q -y fairseq fairseq-fixed 2>/dev/null || true
  echo "[setup] installing fairseq-fixed==$FAIRSEQ_VERSION (first build compiles C++ extensions, ~6 min)" >&2
  $PIP install --no-deps --no-build-isolation "fairseq-fixed==$FAIRSEQ_VERSION"
fi
$PIP install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import torch, fairseq, fairseq_knowgen; print('[setup] torch', torch.__version__, 'fairseq', fairseq.__version__)" >&2
echo "$REQ_HASH" > "$STAMP"
