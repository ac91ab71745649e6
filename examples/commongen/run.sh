#!/usr/bin/env bash
# CommonGen: concept set -> everyday sentence. Staged recipe; rerun from any stage.
#
#   bash examples/commongen/run.sh [DATA_DIR] [OUT_DIR]
#       DATA_DIR: the raw CommonGen files (default ../shared/data/commongen)
#       OUT_DIR:  everything this recipe writes (default work/commongen)
#   Environment (all optional):
#       STAGE=1 STOP_STAGE=6       stages to run (1 prepare, 2 bpe, 3 binarize, 4 train, 5 generate, 6 evaluate)
#       NAME=transformer ARCH=transformer ARCH_ARGS=""   the system to train (run folder $OUT/runs/$NAME)
#       LAYERS=2 DIM=128 HEADS=4   model size (ffn 4*DIM); scale up on GPUs
#       MINUTES=30                 training budget (--stop-time-hours); MAX_UPDATE=0 for no update cap
#       BPE_OPS=8000 BEAM=5 TRAIN_ARGS=""   (TRAIN_ARGS e.g. "--distributed-world-size 8" on GPUs)
#   Examples:
#       bash examples/commongen/run.sh
#       NAME=dimattn ARCH=transformer_dimattn STAGE=4 bash examples/commongen/run.sh
#       NAME=dydimattn ARCH=transformer_dimattn ARCH_ARGS="--dimattn-type dydim" STAGE=4 bash examples/commongen/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DATA=$(realpath -m "${1:-$ROOT/../shared/data/commongen}")
OUT=$(realpath -m "${2:-$ROOT/work/commongen}")
STAGE=${STAGE:-1}; STOP_STAGE=${STOP_STAGE:-6}
NAME=${NAME:-transformer}; ARCH=${ARCH:-transformer}; ARCH_ARGS=${ARCH_ARGS:-}
LAYERS=${LAYERS:-2}; DIM=${DIM:-128}; HEADS=${HEADS:-4}
MINUTES=${MINUTES:-30}; MAX_UPDATE=${MAX_UPDATE:-0}; BPE_OPS=${BPE_OPS:-8000}; BEAM=${BEAM:-5}
TRAIN_ARGS=${TRAIN_ARGS:-}
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
RUN=$OUT/runs/$NAME
mkdir -p "$OUT"
. "$ROOT/examples/lib/stages.sh"
stage() { [ "$1" -ge "$STAGE" ] && [ "$1" -le "$STOP_STAGE" ]; }

if stage 1; then
  echo "== stage 1: prepare $DATA -> $OUT/raw"
  $PY -m fairseq_knowgen.prep.commongen --data "$DATA" --out "$OUT/raw"
fi
if stage 2; then
  echo "== stage 2: joint BPE ($BPE_OPS merges, subword-nmt) -> $OUT/bpe"
  stage_bpe train valid
fi
if stage 3; then
  echo "== stage 3: fairseq-preprocess -> $OUT/bin"
  stage_binarize
fi
if stage 4; then
  echo "== stage 4: train $NAME (--arch $ARCH $ARCH_ARGS; $LAYERS+$LAYERS layers x $DIM; $MINUTES min) -> $RUN"
  stage_train
fi
if stage 5; then
  echo "== stage 5: fairseq-generate --beam $BEAM on dev -> $RUN/valid.out"
  stage_generate valid "$RUN/valid.out"
fi
if stage 6; then
  echo "== stage 6: evaluate -> $RUN/valid.scores.json"
  $PY scripts/evaluate.py --hyp "$RUN/valid.out" --name "$NAME" --refs "$OUT/raw/valid.refs.jsonl" \
    --src "$OUT/raw/valid.src" --concepts "$OUT/raw/valid.concepts" --detok moses \
    --json-out "$RUN/valid.scores.json"
fi
