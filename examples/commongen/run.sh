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
PY=$ROOT/.venv/bin/python; BIN=$ROOT/.venv/bin
RUN=$OUT/runs/$NAME
mkdir -p "$OUT" "$RUN"
stage() { [ "$1" -ge "$STAGE" ] && [ "$1" -le "$STOP_STAGE" ]; }

if stage 1; then
  echo "== stage 1: prepare $DATA -> $OUT/raw"
  $PY -m fairseq_knowgen.prep.commongen --data "$DATA" --out "$OUT/raw"
fi

if stage 2; then
  echo "== stage 2: joint BPE ($BPE_OPS merges, subword-nmt) -> $OUT/bpe"
  mkdir -p "$OUT/bpe"
  cat "$OUT/raw/train.src" "$OUT/raw/train.tgt" | $BIN/subword-nmt learn-bpe -s "$BPE_OPS" > "$OUT/bpe/codes"
  for f in train.src train.tgt valid.src valid.tgt; do
    $BIN/subword-nmt apply-bpe -c "$OUT/bpe/codes" < "$OUT/raw/$f" > "$OUT/bpe/$f"
  done
fi

if stage 3; then
  echo "== stage 3: fairseq-preprocess -> $OUT/bin"
  rm -rf "$OUT/bin"
  $BIN/fairseq-preprocess --source-lang src --target-lang tgt --joined-dictionary \
    --trainpref "$OUT/bpe/train" --validpref "$OUT/bpe/valid" --destdir "$OUT/bin" --workers 2 \
    > "$OUT/preprocess.log" 2>&1
fi

if stage 4; then
  echo "== stage 4: train $NAME (--arch $ARCH $ARCH_ARGS; $LAYERS+$LAYERS layers x $DIM; $MINUTES min) -> $RUN"
  # shellcheck disable=SC2086
  $BIN/fairseq-train "$OUT/bin" --user-dir fairseq_knowgen --seed 1 \
    --arch "$ARCH" $ARCH_ARGS --share-all-embeddings \
    --encoder-layers "$LAYERS" --decoder-layers "$LAYERS" --encoder-embed-dim "$DIM" --decoder-embed-dim "$DIM" \
    --encoder-ffn-embed-dim $((4 * DIM)) --decoder-ffn-embed-dim $((4 * DIM)) \
    --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS" --dropout 0.2 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 1000 \
    --max-tokens 4096 --max-update "$MAX_UPDATE" --stop-time-hours "$($PY -c "print($MINUTES / 60)")" \
    --save-dir "$RUN/checkpoints" --no-epoch-checkpoints --no-progress-bar --log-interval 100 \
    $TRAIN_ARGS $([ -n "$(command -v nvidia-smi)" ] || echo --cpu) 2>&1 | tee "$RUN/train.log" | grep -E "\| (train|valid) \|" || true
  [ -f "$RUN/checkpoints/checkpoint_best.pt" ] || { echo "no checkpoint: see $RUN/train.log"; exit 1; }
fi

if stage 5; then
  echo "== stage 5: fairseq-generate --beam $BEAM on dev -> $RUN/gen.out"
  $BIN/fairseq-generate "$OUT/bin" --user-dir fairseq_knowgen --gen-subset valid \
    --path "$RUN/checkpoints/checkpoint_best.pt" --beam "$BEAM" --batch-size 128 --remove-bpe \
    $([ -n "$(command -v nvidia-smi)" ] || echo --cpu) > "$RUN/gen.out" 2> "$RUN/gen.log"
fi

if stage 6; then
  echo "== stage 6: evaluate -> $RUN/scores.json"
  $PY scripts/evaluate.py --hyp "$RUN/gen.out" --name "$NAME" --refs "$OUT/raw/valid.refs.jsonl" \
    --src "$OUT/raw/valid.src" --concepts "$OUT/raw/valid.concepts" --detok moses \
    --json-out "$RUN/scores.json"
fi
