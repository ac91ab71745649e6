#!/usr/bin/env bash
# CoCon (content-conditioned LM; Chan et al., "CoCon: A Self-Supervised Approach for Controlled Text Generation",
# ICLR 2021) on a frozen fairseq transformer_lm: one this recipe trains (stage 3), or a pretrained one (LM_PATH:
# e.g. GPT-2 converted by fairseq_knowgen.convert.hf_gpt2, see docs/pretrained_cocon.md). Staged; rerun from any
# stage. What it does as the authors and what it changes for one CPU core: docs/methods/cocon.md.
#
#   bash examples/cocon/run.sh DATA_ROOT [OUT_DIR]
#       DATA_ROOT: folder with wikitext-2/valid.txt, commongen/, webnlg/ (required)
#       OUT_DIR:   everything this recipe writes (default work/cocon)
#   Stages (STAGE=1 STOP_STAGE=7 select them):
#       1 prepare raw/: running text (WikiText-2 articles, WebNLG training texts, CommonGen training references,
#         one paragraph or text a line), held-back sentences, CommonGen dev concept sets (raw/commongen/), prompts
#       2 BPE (bpe/) and binarize: bin/lm (LM and CoCon data; its dict.txt is everyone's), bin/judge (same
#         text, another order), bin/sent (the same text one sentence a line), bin/gen (decoding inputs:
#         cg[.prompt].src, ht{5,10,20}[.prompt].src). Without LM_PATH it learns a BPE (bpe/codes) and builds the
#         dictionary; with LM_PATH it applies the LM's BPE and binarizes with the LM's dict.txt (--srcdict)
#       3 train the base LM (runs/lm; skipped with LM_PATH) on the token stream
#       4 train the judge LM (runs/judge: another seed and data order, the LM's dictionary and BPE)
#       5 train CoCon NAME on the frozen base LM (runs/NAME): 30-token windows of running text, the cycle and
#         adversarial losses on from update 2,000 (the authors'), dev losses every VALIDATE_EVERY updates
#       6 decode (runs/NAME/gen) from CHECKPOINT, every system from the same prompts for FIXED_LEN tokens: the plain LM
#         (SET.lm.out), the LM with the content before the prompt (SET.lm-prompt.out), CoCon for each tau in TAUS
#         (SET.tauT.out); SET = cg (CommonGen dev concept sets, prompts from a fixed list), ht5/ht10/ht20
#         (contents of held-back sentences, prompts their first PROMPT_WORDS words)
#       7 score runs/NAME/scores.json, then the tables of every run so far (OUT/table.md, .json), the plot PLOT
#         and the dev gap of every run over its updates (OUT/gap.json, the plot GAP_PLOT)
#   Environment (all optional):
#       BPE_OPS=8000 HELDOUT=600 VALID=1000 CONTENT_MODE=separate (one content per concept; 'joined': one content)
#       PROMPT_WORDS=3
#       LM_LAYERS=4 LM_DIM=128 LM_HEADS=4 LM_MAX_UPDATE=1500 LM_MINUTES=75 TOKENS_PER_SAMPLE=128 LM_ARGS=""
#       JUDGE_SEED=2 JUDGE_MINUTES=LM_MINUTES
#       NAME=cocon ARCH=cocon_lm COCON_LAYER="" (the model's default: the authors' relative depth, round(7/24 x
#                    layers): 1 of 4) COCON_MAX_UPDATE=4500 COCON_MINUTES=65 VALIDATE_EVERY=250
#       COCON_LR: 2e-3 (5e-5, the authors', with LM_PATH) COCON_WARMUP: 200 (0 with LM_PATH)
#       CYCLE_START, ADV_START: the criterion's (update 2,000, the authors'); GAP=BITS: both start instead once the
#                    dev gap L_null - L_self reaches BITS per token (--cocon-start-after-gap)
#       SAMPLE_MODE=window (30-token windows of running text, as the authors; 'lines': each sentence line with
#                    its </s>, from bin/sent: the earlier samples)
#       COCON_BATCH=16 (samples per update, the authors'; each update runs the LM ~4 times)
#       ARGS=""      more fairseq-train flags for CoCon (ablations: "--cocon-content-prev-key 1",
#                    "--cocon-cycle-weight 0 --cocon-adv-weight 0"; see fairseq_knowgen/criterions/cocon.py)
#       TAUS="0 2 5" DECODE="--sampling --sampling-topp 0.9 --sampling-topk -1 --temperature 1 --beam 1"
#       CHECKPOINT=last (the end of training, as the authors decode; best: the lowest dev L_self + L_null, which
#                    the cycle and adversarial losses never lower: their runs' best is from before they start)
#       FIXED_LEN=50 (tokens after the prompt, no </s> before them, as the authors; 0: stop at </s> within
#                    CG_LEN / HT_LEN) GEN_SEED=1 CG_LEN=32 HT_LEN=40
#       BASELINES=1 (0: no lm/lm-prompt rows: they are the same for every NAME)  SETS="cg ht5 ht10 ht20" (stage 6)
#       MAX_TOKENS=4096 TRAIN_ARGS="" (every fairseq-train, e.g. "--distributed-world-size 8" on GPUs)
#       PLOT=OUT/cocon_coverage_ppl.png (docs/cocon_coverage_ppl.png is the README's copy)
#       LM_PATH=""   a pretrained fairseq transformer_lm instead of stage 3: its folder (checkpoint.pt, model.pt or
#                    checkpoint_best.pt in it) or the checkpoint itself, with beside it its dict.txt and its BPE:
#                    encoder.json + vocab.bpe (GPT-2's BPE, applied with fairseq's encoder) or codes / bpecodes
#                    (subword-nmt). CoCon then trains as the authors: AdamW, lr 5e-5 decaying linearly, clip 1.0.
#   Smoke run (minutes, not a result): LM_MAX_UPDATE=50 COCON_MAX_UPDATE=40 HELDOUT=100 SETS=ht5 TAUS=0
#   Examples:
#       bash examples/cocon/run.sh DATA                                         # everything, NAME=cocon
#       LM_PATH=work/gpt2-fairseq TOKENS_PER_SAMPLE=256 bash examples/cocon/run.sh DATA  # inside a converted GPT-2
#       NAME=cocon-nocycle ARGS="--cocon-cycle-weight 0 --cocon-adv-weight 0" STAGE=5 bash examples/cocon/run.sh DATA
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
usage() { { echo "usage:"; sed -n '/^#   bash examples/,/^#   [A-Z]/p' "$0" | sed '$d; s/^#//'; } >&2; exit 2; }
[ $# -ge 1 ] || usage
DATA=$(realpath -m "$1")
OUT=$(realpath -m "${2:-$ROOT/work/cocon}")
STAGE=${STAGE:-1}; STOP_STAGE=${STOP_STAGE:-7}
BPE_OPS=${BPE_OPS:-8000}; HELDOUT=${HELDOUT:-600}; VALID=${VALID:-1000}; CONTENT_MODE=${CONTENT_MODE:-separate}
PROMPT_WORDS=${PROMPT_WORDS:-3}
LM_LAYERS=${LM_LAYERS:-4}; LM_DIM=${LM_DIM:-128}; LM_HEADS=${LM_HEADS:-4}; LM_MINUTES=${LM_MINUTES:-75}
LM_MAX_UPDATE=${LM_MAX_UPDATE:-1500}; TOKENS_PER_SAMPLE=${TOKENS_PER_SAMPLE:-128}; LM_ARGS=${LM_ARGS:-}
JUDGE_SEED=${JUDGE_SEED:-2}; JUDGE_MINUTES=${JUDGE_MINUTES:-$LM_MINUTES}
NAME=${NAME:-cocon}; ARCH=${ARCH:-cocon_lm}; COCON_LAYER=${COCON_LAYER:-}; COCON_MINUTES=${COCON_MINUTES:-65}
COCON_MAX_UPDATE=${COCON_MAX_UPDATE:-4500}; VALIDATE_EVERY=${VALIDATE_EVERY:-250}
LM_PATH=${LM_PATH:-}
if [ -n "$LM_PATH" ]; then COCON_LR=${COCON_LR:-5e-5}; COCON_WARMUP=${COCON_WARMUP:-0}
else COCON_LR=${COCON_LR:-2e-3}; COCON_WARMUP=${COCON_WARMUP:-200}; fi
CYCLE_START=${CYCLE_START:-}; ADV_START=${ADV_START:-$CYCLE_START}; GAP=${GAP:-}
SAMPLE_MODE=${SAMPLE_MODE:-window}; ARGS=${ARGS:-}
TAUS=${TAUS:-0 2 5}; DECODE=${DECODE:---sampling --sampling-topp 0.9 --sampling-topk -1 --temperature 1 --beam 1}
FIXED_LEN=${FIXED_LEN:-50}; GEN_SEED=${GEN_SEED:-1}; CHECKPOINT=${CHECKPOINT:-last}
CG_LEN=${CG_LEN:-32}; HT_LEN=${HT_LEN:-40}; BASELINES=${BASELINES:-1}; SETS=${SETS:-cg ht5 ht10 ht20}
MAX_TOKENS=${MAX_TOKENS:-4096}; COCON_BATCH=${COCON_BATCH:-16}; TRAIN_ARGS=${TRAIN_ARGS:-}; PLOT=${PLOT:-$OUT/cocon_coverage_ppl.png}
GAP_PLOT=${GAP_PLOT:-$OUT/cocon_dev_gap.png}
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
. "$ROOT/examples/lib/stages.sh"
RUN=$OUT/runs/$NAME
FILES="train.txt train.judge.txt valid.txt train.sent.txt valid.sent.txt heldout.txt cg.concepts.txt cg.ref.txt prompts.txt"

# the LM (LM), its folder (LM_DIR: dict.txt) and its BPE (LM_BPE: gpt2 with LM_DIR/encoder.json + vocab.bpe, or
# subword-nmt with CODES)
if [ -z "$LM_PATH" ]; then
  LM_DIR=$OUT/runs/lm/checkpoints; LM=$LM_DIR/checkpoint_best.pt; LM_BPE=subword-nmt; CODES=$OUT/bpe/codes
else
  if [ -d "$LM_PATH" ]; then
    LM_DIR=$(realpath "$LM_PATH"); LM=""
    for f in checkpoint.pt model.pt checkpoint_best.pt; do
      if [ -f "$LM_DIR/$f" ]; then LM=$LM_DIR/$f; break; fi
    done
    [ -n "$LM" ] || { echo "LM_PATH=$LM_PATH: no checkpoint.pt, model.pt or checkpoint_best.pt in it"; exit 2; }
  else
    [ -f "$LM_PATH" ] || { echo "LM_PATH=$LM_PATH: not found"; exit 2; }
    LM=$(realpath "$LM_PATH"); LM_DIR=$(dirname "$LM")
  fi
  [ -f "$LM_DIR/dict.txt" ] || { echo "$LM_DIR/dict.txt: missing (LM_PATH: the LM's dictionary goes beside it)"; exit 2; }
  if [ -f "$LM_DIR/encoder.json" ] && [ -f "$LM_DIR/vocab.bpe" ]; then LM_BPE=gpt2
  elif [ -f "$LM_DIR/codes" ]; then LM_BPE=subword-nmt; CODES=$LM_DIR/codes
  elif [ -f "$LM_DIR/bpecodes" ]; then LM_BPE=subword-nmt; CODES=$LM_DIR/bpecodes
  else
    echo "LM_PATH=$LM_PATH: no BPE beside the LM in $LM_DIR (encoder.json + vocab.bpe: GPT-2's; codes or bpecodes:"
    echo "subword-nmt's)"; exit 2
  fi
fi

# copy_lm_files DIR: the dictionary and the BPE of bin/lm beside a checkpoint (LM_PATH=DIR reuses it)
copy_lm_files() {
  cp "$OUT/bin/lm/dict.txt" "$1/dict.txt"
  if [ "$LM_BPE" = gpt2 ]; then cp "$LM_DIR/encoder.json" "$LM_DIR/vocab.bpe" "$1/"; else cp "$CODES" "$1/codes"; fi
}

# train_lm RUN_DIR DATA_BIN SEED MINUTES: a fairseq transformer_lm on the running text (blocks of TOKENS_PER_SAMPLE
# tokens cut from the token stream: --sample-break-mode none, as fairseq's WikiText LMs); its dict.txt and BPE are
# copied beside the checkpoints
train_lm() {
  local run=$1 bin=$2 seed=$3 minutes=$4
  # shellcheck disable=SC2086
  train_logged "$run" "$bin" --task language_modeling --arch transformer_lm --seed "$seed" \
    --decoder-layers "$LM_LAYERS" --decoder-embed-dim "$LM_DIM" --decoder-ffn-embed-dim $((4 * LM_DIM)) \
    --decoder-attention-heads "$LM_HEADS" --share-decoder-input-output-embed --dropout 0.1 \
    --sample-break-mode none --tokens-per-sample "$TOKENS_PER_SAMPLE" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 500 \
    --max-tokens "$MAX_TOKENS" --max-update "$LM_MAX_UPDATE" --stop-time-hours "$(hours "$minutes")" \
    --log-interval 100 $LM_ARGS $TRAIN_ARGS
  copy_lm_files "$run/checkpoints"
}

if stage 1; then
  echo "== stage 1: prepare $DATA -> $OUT/raw"
  $PY -m fairseq_knowgen.prep.cocon corpus --wikitext "$DATA/wikitext-2/valid.txt" --commongen "$DATA/commongen" \
    --webnlg "$DATA/webnlg" --heldout "$HELDOUT" --valid "$VALID" --out "$OUT/raw"
fi
# need_bin KIND: the binarized data OUT/bin/KIND of stage 2 (lm, judge, sent: fairseq-preprocess writes valid.idx
# last; gen: dict.txt is copied in last)
need_bin() {
  if [ "$1" = gen ]; then needs 2 "BPE and binarize" "$OUT/bin/gen/dict.txt"
  else needs 2 "BPE and binarize" "$OUT/bin/$1/dict.txt" "$OUT/bin/$1/valid.idx"; fi
}
if stage 2; then
  # shellcheck disable=SC2086
  needs 1 prepare $(for f in $FILES; do echo "$OUT/raw/$f"; done)
  mkdir -p "$OUT/bpe" "$OUT/bin"
  if [ -z "$LM_PATH" ]; then
    echo "== stage 2: BPE ($BPE_OPS merges) -> $OUT/bpe; binarize -> $OUT/bin/{lm,judge,gen}"
    into "$OUT/bpe/codes" $BIN/subword-nmt learn-bpe -s "$BPE_OPS" --input "$OUT/raw/train.txt" 2> "$OUT/bpe/learn.log"
    dict=()
  else
    echo "== stage 2: the LM's BPE ($LM_BPE, $LM_DIR) -> $OUT/bpe; binarize with its dict.txt -> $OUT/bin/{lm,judge,gen}"
    dict=(--srcdict "$LM_DIR/dict.txt")
  fi
  if [ "$LM_BPE" = gpt2 ]; then
    # shellcheck disable=SC2086
    $PY -m fairseq_knowgen.prep.cocon gpt2-bpe --gpt2-dir "$LM_DIR" --raw "$OUT/raw" --out "$OUT/bpe" $FILES
  else
    for f in $FILES; do
      into "$OUT/bpe/$f" $BIN/subword-nmt apply-bpe -c "$CODES" --glossaries '<sep>' '<prompt>' --input "$OUT/raw/$f"
    done
  fi
  rm -rf "$OUT/bin/lm" "$OUT/bin/judge" "$OUT/bin/sent" "$OUT/bin/gen"
  $BIN/fairseq-preprocess --only-source "${dict[@]}" --trainpref "$OUT/bpe/train.txt" \
    --validpref "$OUT/bpe/valid.txt" --destdir "$OUT/bin/lm" --workers 2 > "$OUT/bin/lm.log" 2>&1 \
    || { echo "fairseq-preprocess failed: see $OUT/bin/lm.log"; exit 1; }
  $BIN/fairseq-preprocess --only-source --srcdict "$OUT/bin/lm/dict.txt" --trainpref "$OUT/bpe/train.judge.txt" \
    --validpref "$OUT/bpe/valid.txt" --destdir "$OUT/bin/judge" --workers 2 > "$OUT/bin/judge.log" 2>&1 \
    || { echo "fairseq-preprocess failed: see $OUT/bin/judge.log"; exit 1; }
  # the same text one sentence a line (CoCon's sentence-line ablation: --cocon-sample-mode lines)
  $BIN/fairseq-preprocess --only-source --srcdict "$OUT/bin/lm/dict.txt" --trainpref "$OUT/bpe/train.sent.txt" \
    --validpref "$OUT/bpe/valid.sent.txt" --destdir "$OUT/bin/sent" --workers 2 > "$OUT/bin/sent.log" 2>&1 \
    || { echo "fairseq-preprocess failed: see $OUT/bin/sent.log"; exit 1; }
  gpt2=(); [ "$LM_BPE" != gpt2 ] || gpt2=(--gpt2-bpe "$LM_DIR")
  $PY -m fairseq_knowgen.prep.cocon inputs --bpe-dir "$OUT/bpe" --out "$OUT/bin/gen" --content-mode "$CONTENT_MODE" \
    --prompt-words "$PROMPT_WORDS" "${gpt2[@]}"
  cp "$OUT/bin/lm/dict.txt" "$OUT/bin/gen/dict.txt"
fi
if stage 3; then
  if [ -n "$LM_PATH" ]; then
    echo "== stage 3: LM_PATH=$LM_PATH given: no LM trained"
  else
    need_bin lm
    echo "== stage 3: train the base LM ($LM_LAYERS layers x $LM_DIM, $LM_MINUTES min) -> $OUT/runs/lm"
    train_lm "$OUT/runs/lm" "$OUT/bin/lm" 1 "$LM_MINUTES"
  fi
fi
if stage 4; then
  need_bin judge
  echo "== stage 4: train the judge LM (seed $JUDGE_SEED, another data order, $JUDGE_MINUTES min) -> $OUT/runs/judge"
  train_lm "$OUT/runs/judge" "$OUT/bin/judge" "$JUDGE_SEED" "$JUDGE_MINUTES"
fi
if stage 5; then
  layer=(); [ -z "$COCON_LAYER" ] || layer=(--cocon-layer "$COCON_LAYER")
  schedule=()
  [ -z "$CYCLE_START" ] || schedule+=(--cocon-cycle-start "$CYCLE_START")
  [ -z "$ADV_START" ] || schedule+=(--cocon-adv-start "$ADV_START")
  [ -z "$GAP" ] || schedule+=(--cocon-start-after-gap "$GAP")
  data=$OUT/bin/lm; [ "$SAMPLE_MODE" != lines ] || data=$OUT/bin/sent
  need_bin "$(basename "$data")"
  [ -n "$LM_PATH" ] || needs 3 "train the base LM" "$LM"
  if [ -n "$LM_PATH" ]; then  # the authors': AdamW (no weight decay), linear decay from COCON_LR, clip 1.0
    optim=(--optimizer adam --adam-betas '(0.9, 0.999)' --adam-eps 1e-8 --lr-scheduler polynomial_decay
      --total-num-update "$COCON_MAX_UPDATE" --warmup-updates "$COCON_WARMUP")
  else  # one CPU core: a higher rate for a budget of ~2,000 updates (docs/methods/cocon.md)
    optim=(--optimizer adam --adam-betas '(0.9, 0.999)' --adam-eps 1e-8 --lr-scheduler inverse_sqrt
      --warmup-updates "$COCON_WARMUP")
  fi
  echo "== stage 5: train CoCon $NAME (--arch $ARCH ${layer[*]} ${schedule[*]} $ARGS; $SAMPLE_MODE samples;" \
    "$COCON_MAX_UPDATE updates, at most $COCON_MINUTES min) on $LM -> $RUN"
  # shellcheck disable=SC2086
  train_logged "$RUN" "$data" --task cocon_generation --arch "$ARCH" --seed 1 --cocon-sample-mode "$SAMPLE_MODE" \
    --cocon-lm-path "$LM" "${layer[@]}" --tokens-per-sample "$TOKENS_PER_SAMPLE" \
    --criterion cocon "${schedule[@]}" --validate-interval-updates "$VALIDATE_EVERY" \
    --save-interval-updates "$VALIDATE_EVERY" --keep-interval-updates 1 \
    "${optim[@]}" --lr "$COCON_LR" --clip-norm 1.0 \
    --batch-size "$COCON_BATCH" --max-update "$COCON_MAX_UPDATE" --stop-time-hours "$(hours "$COCON_MINUTES")" \
    --log-interval 100 $ARGS $TRAIN_ARGS
fi
if stage 6; then
  need_bin gen
  needs 5 "train CoCon" "$RUN/checkpoints/checkpoint_best.pt"
  mkdir -p "$RUN/gen"
  # gen SUBSET OUTFILE MAXLEN [flags]: fairseq-generate from CoCon's best checkpoint (BPE kept for the judge), into
  # OUTFILE only when complete
  gen() {
    local subset=$1 out=$2 len=$3; shift 3
    # shellcheck disable=SC2086
    $BIN/fairseq-generate "$OUT/bin/gen" --user-dir fairseq_knowgen --task cocon_generation --gen-subset "$subset" \
      --path "$RUN/checkpoints/checkpoint_$CHECKPOINT.pt" --model-overrides "{'cocon_lm_path': '$LM'}" \
      --cocon-fixed-len "$FIXED_LEN" --max-len-a 0 --max-len-b "$len" --batch-size 64 --seed "$GEN_SEED" \
      $DECODE "$@" $DEVICE_ARGS > "$out.part" 2> "$out.log" \
      || { rm -f "$out.part"; echo "fairseq-generate failed: see $out.log"; return 1; }
    mv "$out.part" "$out"
  }
  for set in $SETS; do
    # EOS-stopped decoding (FIXED_LEN=0) of the prompted LM writes the content too: room for it
    if [ "$set" = cg ]; then len=$CG_LEN; plen=$((len + 12)); else len=$HT_LEN; plen=$((len + ${set#ht})); fi
    if [ "$BASELINES" = 1 ]; then
      echo "== stage 6: $set: the frozen LM alone from the prompt, and with the content before the prompt"
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
  needs 4 "train the judge LM" "$OUT/runs/judge/checkpoints/checkpoint_best.pt"
  needs 6 "generate" "$RUN/gen"
  echo "== stage 7: score $NAME -> $RUN/scores.json; tables of every run -> $OUT/table.md, plot -> $PLOT"
  gpt2=(); [ "$LM_BPE" != gpt2 ] || gpt2=(--gpt2-bpe "$LM_DIR")  # outputs in GPT-2 BPE ids: decoded
  $PY scripts/cocon_score.py score --gen-dir "$RUN/gen" --inputs "$OUT/bin/gen" --name "$NAME" \
    --concepts "$OUT/raw/commongen/valid.concepts" --judge "$OUT/runs/judge/checkpoints/checkpoint_best.pt" \
    --fixed-len "$FIXED_LEN" --json-out "$RUN/scores.json" "${gpt2[@]}" > "$RUN/scores.log"
  # shellcheck disable=SC2046
  $PY scripts/cocon_score.py table --scores $(ls "$OUT"/runs/*/scores.json) \
    --judge "$OUT/runs/judge/checkpoints/checkpoint_best.pt" --refs-bpe "$OUT/bpe/cg.ref.txt" \
    --out-md "$OUT/table.md" --plot "$PLOT"
  # shellcheck disable=SC2046
  $PY scripts/cocon_score.py gap --logs $(ls "$OUT"/runs/*/train.log | grep -v -e /lm/ -e /judge/) \
    --json-out "$OUT/gap.json" --plot "$GAP_PLOT"
fi
