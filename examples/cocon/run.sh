#!/usr/bin/env bash
# CoCon (content-conditioned LM, shared/seeds/cocon.zh.txt) on a small fairseq transformer_lm. Staged; rerun from any stage.
#
#   bash examples/cocon/run.sh [DATA_ROOT] [OUT_DIR]
#       DATA_ROOT: folder with wikitext-2/valid.txt, commongen/, webnlg/ (default ../shared/data)
#       OUT_DIR:   everything this recipe writes (default work/cocon)
#   Stages (STAGE=1 STOP_STAGE=7 select them):
#       1 prepare raw/: LM sentences (wikitext-2 + CommonGen train references + WebNLG train texts), held-back
#         sentences, CommonGen dev concept sets (raw/commongen/)
#       2 BPE (bpe/) and binarize: bin/lm (LM and CoCon data; its dict.txt is everyone's), bin/judge (same
#         sentences, another order), bin/gen (decoding inputs: cg[.prompt].src, ht{5,10,20}[.prompt].src)
#       3 train the base LM (runs/lm)      4 train the judge LM (runs/judge: another seed and data order)
#       5 train CoCon NAME on the frozen base LM (runs/NAME)
#       6 decode (runs/NAME/gen): the plain LM from its start symbol (SET.lm.out), the LM with the content as a
#         prompt (SET.lm-prompt.out), CoCon for each tau in TAUS (SET.tauT.out); SET = cg, ht5, ht10, ht20
#       7 score runs/NAME/scores.json, then the tables of every run so far (OUT/table.md, .json) and the plot PLOT
#   Environment (all optional):
#       BPE_OPS=8000 HELDOUT=600 VALID=1000 CONTENT_MODE=separate (one content per concept; 'joined': one content)
#       LM_LAYERS=4 LM_DIM=128 LM_HEADS=4 LM_MINUTES=15 LM_MAX_UPDATE=0 TOKENS_PER_SAMPLE=128 LM_ARGS=""
#       JUDGE_SEED=2 JUDGE_MINUTES=15
#       NAME=cocon ARCH=cocon_lm COCON_LAYER=2 COCON_MINUTES=15 COCON_MAX_UPDATE=0 CYCLE_START=100 ADV_START=100
#       COCON_MAX_TOKENS=2048 (CoCon's batches: each update runs the LM ~4 times)
#       ARGS=""      more fairseq-train flags for CoCon (ablations: "--cocon-cycle-weight 0", "--cocon-null-weight 0",
#                    "--cocon-adv-weight 0"; see fairseq_knowgen/criterions/cocon.py)
#       TAUS="0 2 5" DECODE="--sampling --sampling-topp 0.9 --beam 1" GEN_SEED=1 CG_LEN=32 HT_LEN=40
#       BASELINES=1 (0: no lm/lm-prompt rows: they are the same for every NAME)  SETS="cg ht5 ht10 ht20" (stage 6)
#       MAX_TOKENS=4096 TRAIN_ARGS="" (every fairseq-train, e.g. "--distributed-world-size 8" on GPUs)
#       PLOT=docs/cocon_coverage_ppl.png   LM_PATH="" (a pretrained transformer_lm checkpoint to use instead of
#                    stage 3: its dict.txt beside it must be bin/lm's, e.g. binarize with it)
#   Examples:
#       bash examples/cocon/run.sh                                              # everything, NAME=cocon
#       NAME=cocon-nocycle ARGS="--cocon-cycle-weight 0" STAGE=5 bash examples/cocon/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DATA=$(realpath -m "${1:-$ROOT/../shared/data}")
OUT=$(realpath -m "${2:-$ROOT/work/cocon}")
STAGE=${STAGE:-1}; STOP_STAGE=${STOP_STAGE:-7}
BPE_OPS=${BPE_OPS:-8000}; HELDOUT=${HELDOUT:-600}; VALID=${VALID:-1000}; CONTENT_MODE=${CONTENT_MODE:-separate}
LM_LAYERS=${LM_LAYERS:-4}; LM_DIM=${LM_DIM:-128}; LM_HEADS=${LM_HEADS:-4}; LM_MINUTES=${LM_MINUTES:-15}
LM_MAX_UPDATE=${LM_MAX_UPDATE:-0}; TOKENS_PER_SAMPLE=${TOKENS_PER_SAMPLE:-128}; LM_ARGS=${LM_ARGS:-}
JUDGE_SEED=${JUDGE_SEED:-2}; JUDGE_MINUTES=${JUDGE_MINUTES:-$LM_MINUTES}
NAME=${NAME:-cocon}; ARCH=${ARCH:-cocon_lm}; COCON_LAYER=${COCON_LAYER:-2}; COCON_MINUTES=${COCON_MINUTES:-15}
COCON_MAX_UPDATE=${COCON_MAX_UPDATE:-0}; CYCLE_START=${CYCLE_START:-100}; ADV_START=${ADV_START:-100}; ARGS=${ARGS:-}
TAUS=${TAUS:-0 2 5}; DECODE=${DECODE:---sampling --sampling-topp 0.9 --beam 1}; GEN_SEED=${GEN_SEED:-1}
CG_LEN=${CG_LEN:-32}; HT_LEN=${HT_LEN:-40}; BASELINES=${BASELINES:-1}; SETS=${SETS:-cg ht5 ht10 ht20}
MAX_TOKENS=${MAX_TOKENS:-4096}; COCON_MAX_TOKENS=${COCON_MAX_TOKENS:-2048}; TRAIN_ARGS=${TRAIN_ARGS:-}; PLOT=${PLOT:-$ROOT/docs/cocon_coverage_ppl.png}
LM_PATH=${LM_PATH:-}
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
. "$ROOT/examples/lib/stages.sh"
LM=${LM_PATH:-$OUT/runs/lm/checkpoints/checkpoint_best.pt}
RUN=$OUT/runs/$NAME

# train_lm RUN_DIR DATA_BIN SEED MINUTES: a fairseq transformer_lm (its dict.txt copied beside the checkpoints)
train_lm() {
  local run=$1 bin=$2 seed=$3 minutes=$4
  # shellcheck disable=SC2086
  train_logged "$run" "$bin" --task language_modeling --arch transformer_lm --seed "$seed" \
    --decoder-layers "$LM_LAYERS" --decoder-embed-dim "$LM_DIM" --decoder-ffn-embed-dim $((4 * LM_DIM)) \
    --decoder-attention-heads "$LM_HEADS" --share-decoder-input-output-embed --dropout 0.1 \
    --sample-break-mode complete --tokens-per-sample "$TOKENS_PER_SAMPLE" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 500 \
    --max-tokens "$MAX_TOKENS" --max-update "$LM_MAX_UPDATE" --stop-time-hours "$(hours "$minutes")" \
    --log-interval 100 $LM_ARGS $TRAIN_ARGS
  cp "$bin/dict.txt" "$run/checkpoints/dict.txt"
}

if stage 1; then
  echo "== stage 1: prepare $DATA -> $OUT/raw"
  $PY -m fairseq_knowgen.prep.cocon corpus --wikitext "$DATA/wikitext-2/valid.txt" --commongen "$DATA/commongen" \
    --webnlg "$DATA/webnlg" --heldout "$HELDOUT" --valid "$VALID" --out "$OUT/raw"
fi
if stage 2; then
  echo "== stage 2: BPE ($BPE_OPS merges) -> $OUT/bpe; binarize -> $OUT/bin/{lm,judge,gen}"
  mkdir -p "$OUT/bpe" "$OUT/bin"
  $BIN/subword-nmt learn-bpe -s "$BPE_OPS" < "$OUT/raw/train.txt" > "$OUT/bpe/codes" 2> "$OUT/bpe/learn.log"
  for f in train.txt train.judge.txt valid.txt heldout.txt cg.concepts.txt cg.ref.txt; do
    $BIN/subword-nmt apply-bpe -c "$OUT/bpe/codes" --glossaries '<sep>' '<prompt>' < "$OUT/raw/$f" > "$OUT/bpe/$f"
  done
  rm -rf "$OUT/bin/lm" "$OUT/bin/judge" "$OUT/bin/gen"
  $BIN/fairseq-preprocess --only-source --trainpref "$OUT/bpe/train.txt" --validpref "$OUT/bpe/valid.txt" \
    --destdir "$OUT/bin/lm" --workers 2 > "$OUT/bin/lm.log" 2>&1 || { echo "fairseq-preprocess failed: see $OUT/bin/lm.log"; exit 1; }
  $BIN/fairseq-preprocess --only-source --srcdict "$OUT/bin/lm/dict.txt" --trainpref "$OUT/bpe/train.judge.txt" \
    --validpref "$OUT/bpe/valid.txt" --destdir "$OUT/bin/judge" --workers 2 > "$OUT/bin/judge.log" 2>&1 \
    || { echo "fairseq-preprocess failed: see $OUT/bin/judge.log"; exit 1; }
  $PY -m fairseq_knowgen.prep.cocon inputs --bpe-dir "$OUT/bpe" --out "$OUT/bin/gen" --content-mode "$CONTENT_MODE"
  cp "$OUT/bin/lm/dict.txt" "$OUT/bin/gen/dict.txt"
fi
if stage 3; then
  if [ -n "$LM_PATH" ]; then
    echo "== stage 3: LM_PATH=$LM_PATH given: no LM trained"
  else
    echo "== stage 3: train the base LM ($LM_LAYERS layers x $LM_DIM, $LM_MINUTES min) -> $OUT/runs/lm"
    train_lm "$OUT/runs/lm" "$OUT/bin/lm" 1 "$LM_MINUTES"
  fi
fi
if stage 4; then
  echo "== stage 4: train the judge LM (seed $JUDGE_SEED, another data order, $JUDGE_MINUTES min) -> $OUT/runs/judge"
  train_lm "$OUT/runs/judge" "$OUT/bin/judge" "$JUDGE_SEED" "$JUDGE_MINUTES"
fi
if stage 5; then
  echo "== stage 5: train CoCon $NAME (--arch $ARCH --cocon-layer $COCON_LAYER $ARGS; $COCON_MINUTES min) -> $RUN"
  # shellcheck disable=SC2086
  train_logged "$RUN" "$OUT/bin/lm" --task cocon_generation --arch "$ARCH" --seed 1 \
    --cocon-lm-path "$LM" --cocon-layer "$COCON_LAYER" --tokens-per-sample "$TOKENS_PER_SAMPLE" \
    --criterion cocon --cocon-cycle-start "$CYCLE_START" --cocon-adv-start "$ADV_START" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 200 \
    --max-tokens "$COCON_MAX_TOKENS" --max-update "$COCON_MAX_UPDATE" --stop-time-hours "$(hours "$COCON_MINUTES")" \
    --log-interval 100 $ARGS $TRAIN_ARGS
fi
if stage 6; then
  mkdir -p "$RUN/gen"
  # gen SUBSET OUTFILE MAXLEN [flags]: fairseq-generate from CoCon's best checkpoint (BPE kept for the judge)
  gen() {
    local subset=$1 out=$2 len=$3; shift 3
    # shellcheck disable=SC2086
    $BIN/fairseq-generate "$OUT/bin/gen" --user-dir fairseq_knowgen --task cocon_generation --gen-subset "$subset" \
      --path "$RUN/checkpoints/checkpoint_best.pt" --model-overrides "{'cocon_lm_path': '$LM'}" \
      --max-len-a 0 --max-len-b "$len" --batch-size 64 --seed "$GEN_SEED" $DECODE "$@" $DEVICE_ARGS \
      > "$out" 2> "$out.log" || { echo "fairseq-generate failed: see $out.log"; return 1; }
  }
  for set in $SETS; do
    # prompted decoding writes the prompt too: room for it (cg: up to 12 BPE tokens of concepts)
    if [ "$set" = cg ]; then len=$CG_LEN; plen=$((len + 12)); else len=$HT_LEN; plen=$((len + ${set#ht})); fi
    if [ "$BASELINES" = 1 ]; then
      echo "== stage 6: $set: the frozen LM alone, from its start symbol and with the content as a prompt"
      gen "$set" "$RUN/gen/$set.lm.out" "$len" --cocon-mode lm
      gen "$set.prompt" "$RUN/gen/$set.lm-prompt.out" "$plen" --cocon-mode lm
    fi
    for tau in $TAUS; do
      echo "== stage 6: $set: CoCon $NAME, content bias tau=$tau -> $RUN/gen/$set.tau$tau.out"
      gen "$set" "$RUN/gen/$set.tau$tau.out" "$len" --cocon-content-bias "$tau"
    done
  done
fi
if stage 7; then
  echo "== stage 7: score $NAME -> $RUN/scores.json; tables of every run -> $OUT/table.md, plot -> $PLOT"
  $PY scripts/cocon_score.py score --gen-dir "$RUN/gen" --inputs "$OUT/bin/gen" --name "$NAME" \
    --concepts "$OUT/raw/commongen/valid.concepts" --judge "$OUT/runs/judge/checkpoints/checkpoint_best.pt" \
    --json-out "$RUN/scores.json" > "$RUN/scores.log"
  # shellcheck disable=SC2046
  $PY scripts/cocon_score.py table --scores $(ls "$OUT"/runs/*/scores.json) \
    --judge "$OUT/runs/judge/checkpoints/checkpoint_best.pt" --refs-bpe "$OUT/bpe/cg.ref.txt" \
    --out-md "$OUT/table.md" --plot "$PLOT"
fi
