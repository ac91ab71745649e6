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
REQ_HASH=$(cat requirements.txt setup.py scripts/setup_env.sh | sha1sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_HASH" ] && "$VENV/bin/python" -c "import fairseq, fairseq_knowgen" 2>/dev/null; then
  exit 0
fi

echo "[setup] creating/updating $VENV" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade "pip>=23" wheel "setuptools<81"
# torch first and pinned: every later step sees it installed and installs no other
$PIP install -q "torch==2.13.0" "numpy<2.3" cython
$PIP install -q -r requirements.txt "torch==2.13.0"
if ! "$VENV/bin/python" -c "import fairseq" 2>/dev/null; then
  echo "[setup] installing fairseq-fixed==0.12.3.1 (first build compiles C++ extensions, ~6 min)" >&2
  $PIP install --no-deps --no-build-isolation "fairseq-fixed==0.12.3.1"
fi
$PIP install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import torch, fairseq, fairseq_knowgen; print('[setup] torch', torch.__version__, 'fairseq', fairseq.__version__)" >&2
echo "$REQ_HASH" > "$STAMP"
