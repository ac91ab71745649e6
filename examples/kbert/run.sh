#!/usr/bin/env bash
# K-BERT (Liu et al., 2020) on book_review (sentence classification, HowNet.spo) and medical_ner (character BIO
# tagging, Medical.spo), or on any K-BERT TSV task (TASK_TYPE, KG=PATH; sentence pairs: label/text_a/text_b), from
# the raw TSVs, from scratch, from the task's own masked LM or from a released model (PRETRAINED=DIR, e.g. Google's
# Chinese BERT converted by python -m fairseq_knowgen.convert.hf_bert; docs/pretrained_kbert.md). Staged recipe;
# rerun from any stage.
#
#   bash examples/kbert/run.sh TASK DATA_DIR [OUT_DIR]
#       TASK:     book_review | medical_ner | any name with TASK_TYPE=classification|tagging
#       DATA_DIR: the K-BERT data folder with TASK/{train,dev[,test]}.tsv and kgs/*.spo, or a folder with
#                 {train,dev[,test]}.tsv itself (required)
#       OUT_DIR:  everything this recipe writes (default work/kbert-TASK)
#   Stages (STAGE=1 STOP_STAGE=5 select them):
#       1 prepare: $OUT/data (checked TSVs, dict.txt, labels.txt), $OUT/kg/{full,control}.spo (control: objects
#         shuffled among subjects, seed 1), $OUT/mlm-bin (the training sentences for stage 2)
#       2 pretrain a character-level masked LM (fairseq's masked_lm task, roberta arch of the K-BERT sizes) on the
#         task's own training text for MLM_UPDATE updates -> $OUT/mlm/checkpoints/checkpoint_best.pt (only when
#         PRETRAINED is left at this default)
#       3 fine-tune K-BERT from it -> $OUT/runs/$NAME (checkpoint_best.pt picked on dev: accuracy for book_review,
#         strict typed entity F1 for medical_ner)
#       4 predict + score every evaluation split (valid [test]) -> $OUT/runs/$NAME/SPLIT.{pred,scores.json}
#       5 floors: book_review TF-IDF + logistic regression, medical_ner dictionary tagger -> $OUT/floors/FLOOR/
#         (none for other tasks)
#   Scores (percent): RUN/SPLIT.scores.json {"NAME/SPLIT": {accuracy | typed_f1 typed_precision typed_recall span_f1}}
#   for scripts/results_table.py (a row per run folder, e.g. $OUT/runs/kbert or $OUT/floors/tfidf)
#   Environment (all optional):
#       TASK_TYPE=classification|tagging   set for a TASK other than book_review / medical_ner
#       NAME=kbert  KG=full|none|control|PATH  (full: kgs/HowNet.spo or kgs/Medical.spo of DATA_DIR; PATH: that
#           subject<TAB>predicate<TAB>object file, as given, else relative to DATA_DIR, else to the task's folder;
#           prepared by stage 1 as $OUT/kg/full.spo and its control)
#       ARCH=kbert_small (kbert_base from a PRETRAINED folder)  ARCH_ARGS=""  (e.g. --no-visible-matrix,
#           --no-soft-positions: the paper's ablations)  SEED=1
#       LAYERS=4 DIM=256 HEADS=4   encoder size, the same in stages 2 and 3 (ffn 4*DIM; a PRETRAINED folder's
#           model.pt gives its own: --kbert-pretrained takes the sizes from the checkpoint)
#       MAX_POSITIONS=256  longest sentence tree (branches are dropped first, then the sentence's tail)
#       Fine-tuning from a PRETRAINED folder (a released model) is the authors' (run_kbert_cls.py /
#           run_kbert_ner.py): EPOCHS=5 epochs (MAX_UPDATE = EPOCHS x the batches of an epoch unless set), no
#           time cap (MINUTES=0), BATCH=32 (classification) / 16 (tagging), LR=2e-5 with 10% warm-up and linear
#           decay, --optimizer kbert_adam (BertAdam's betas (0.9, 0.999), eps 1e-6, weight decay 0.01 except
#           biases and LayerNorm), dev at each epoch's end (VALID_EVERY=0).
#       Otherwise (from scratch or the stage-2 masked LM, the CPU budgets of docs/results/kbert.md):
#           MAX_UPDATE (medical_ner and other tasks 2000, book_review 800) EPOCHS=0 (no limit) MINUTES=60 LR=2e-4
#           BATCH=32 VALID_EVERY=200, adam (0.9, 0.98) eps 1e-8 weight decay 0.01 on every parameter
#           (--max-update, --max-epoch, --stop-time-hours; dev every VALID_EVERY updates and at each epoch's end)
#       Stage 4 of a tagging task scores two predictions: SPLIT.pred / SPLIT.scores.json (each character's argmax,
#           the paper's tagger) and SPLIT.viterbi.pred / SPLIT.viterbi.scores.json (the best valid IOB2 sequence)
#       MLM_UPDATE=400 MLM_MINUTES=15 MLM_LR=5e-4 MLM_BATCH=16   stage 2 budget (blocks of MAX_POSITIONS tokens)
#       PRETRAINED=$OUT/mlm/checkpoints/checkpoint_best.pt   (none: fine-tune from scratch; a file: any fairseq
#           RoBERTa/masked_lm checkpoint on $OUT/data/dict.txt of the same sizes; a folder: its model.pt (converted
#           BERT or fairseq RoBERTa, sized by its own args) and dict.txt (the data's dictionary from stage 1 on))
#       TASK_ARGS=""  more task flags (--kg-max-entities N, --kg-inject object|predicate-object, --kg-matching
#           longest, --kg-injected-label ent: see docs/methods/kbert.md#faithfulness)   TRAIN_ARGS=""
#   The README's headline runs set PRETRAINED=none MAX_UPDATE=8000 MINUTES=65 (medical_ner) and PRETRAINED=none
#   MAX_UPDATE=8500 MINUTES=62 (book_review); the defaults above are the shorter settings the recipe tests keep.
#   Examples:
#       bash examples/kbert/run.sh medical_ner DATA                                    # everything, full K-BERT
#       PRETRAINED=bert-zh-fairseq TASK_TYPE=classification KG=kgs/HowNet.spo bash examples/kbert/run.sh lcqmc DIR
#       NAME=nokg KG=none STAGE=3 bash examples/kbert/run.sh medical_ner DATA
#       NAME=novm ARCH_ARGS=--no-visible-matrix STAGE=3 bash examples/kbert/run.sh medical_ner DATA
#       NAME=kbert-s2 SEED=2 STAGE=3 bash examples/kbert/run.sh medical_ner DATA
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
usage() { { echo "usage:"; sed -n '/^#   bash examples/,/^#   [A-Z]/p' "$0" | sed '$d; s/^#//'; } >&2; exit 2; }
[ $# -ge 2 ] || usage
TASK=$1
DATA=$(realpath -m "$2")
OUT=$(realpath -m "${3:-$ROOT/work/kbert-$TASK}")
STAGE=${STAGE:-1}; STOP_STAGE=${STOP_STAGE:-5}
NAME=${NAME:-kbert}; KG=${KG:-full}; ARCH_ARGS=${ARCH_ARGS:-}; SEED=${SEED:-1}
LAYERS=${LAYERS:-4}; DIM=${DIM:-256}; HEADS=${HEADS:-4}; MAX_POSITIONS=${MAX_POSITIONS:-256}
MAX_UPDATE_GIVEN=${MAX_UPDATE:-}
MLM_UPDATE=${MLM_UPDATE:-400}; MLM_MINUTES=${MLM_MINUTES:-15}; MLM_LR=${MLM_LR:-5e-4}; MLM_BATCH=${MLM_BATCH:-16}
MLM_CHECKPOINT=$OUT/mlm/checkpoints/checkpoint_best.pt
PRETRAINED=${PRETRAINED:-$MLM_CHECKPOINT}
TASK_ARGS=${TASK_ARGS:-}; TRAIN_ARGS=${TRAIN_ARGS:-}
case $TASK in
  book_review) KG_FILE=$DATA/kgs/HowNet.spo; TASK_TYPE=${TASK_TYPE:-classification}; MAX_UPDATE=${MAX_UPDATE:-800} ;;
  medical_ner) KG_FILE=$DATA/kgs/Medical.spo; TASK_TYPE=${TASK_TYPE:-tagging}; MAX_UPDATE=${MAX_UPDATE:-2000} ;;
  *) [ -n "${TASK_TYPE:-}" ] || { echo "TASK must be book_review or medical_ner, not '$TASK' (or set TASK_TYPE=classification|tagging)"; exit 2; }
    KG_FILE=""; MAX_UPDATE=${MAX_UPDATE:-2000} ;;
esac
case $TASK_TYPE in
  classification) FS_TASK=kbert_classification; CRITERION=sentence_prediction; TAGGING=""; METRIC=accuracy ;;
  tagging) FS_TASK=kbert_tagging; CRITERION=kbert_tagging; TAGGING=--tagging; METRIC=f1 ;;
  *) echo "TASK_TYPE must be classification or tagging, not '$TASK_TYPE'"; exit 2 ;;
esac
# the TSVs: DATA/TASK/, or DATA itself when it holds train.tsv
TSV_DIR=$DATA/$TASK; [ -f "$DATA/train.tsv" ] && TSV_DIR=$DATA
# KG=PATH: a file as given (from the current folder), else relative to DATA_DIR, else to the task's TSV folder
case $KG in full|control|none) ;; *)
  for f in "$KG" "$DATA/$KG" "$TSV_DIR/$KG"; do [ -f "$f" ] && { KG_FILE=$(realpath "$f"); break; }; done
  [ -n "$KG_FILE" ] || { echo "KG must be full, none, control or a KG file: '$KG' is no file here, in $DATA or in" \
    "$TSV_DIR"; exit 2; }
  KG=full ;; esac
case $KG in full|control) KG_ARGS="--kg $OUT/kg/$KG.spo" ;; none) KG_ARGS="" ;; esac
[ "$KG" = none ] || [ -n "$KG_FILE" ] || { echo "KG=$KG: task $TASK has no KG file of its own: KG=PATH or KG=none"; exit 2; }
# PRETRAINED: a folder (model.pt + dict.txt) gives the dictionary (stage 1) and the encoder's sizes (stage 3)
PRETRAINED_DICT=(); ENCODER_ARGS=(--encoder-layers "$LAYERS" --encoder-embed-dim "$DIM" --encoder-ffn-embed-dim $((4 * DIM)) --encoder-attention-heads "$HEADS")
if [ -d "$PRETRAINED" ]; then  # a released model: the authors' fine-tuning
  for f in model.pt dict.txt; do [ -f "$PRETRAINED/$f" ] || { echo "PRETRAINED=$PRETRAINED has no $f"; exit 2; }; done
  PRETRAINED_DICT=(--srcdict "$PRETRAINED/dict.txt"); PRETRAINED=$PRETRAINED/model.pt
  ENCODER_ARGS=()  # the checkpoint's sizes (--kbert-pretrained)
  ARCH=${ARCH:-kbert_base}; EPOCHS=${EPOCHS:-5}; MINUTES=${MINUTES:-0}; LR=${LR:-2e-5}; VALID_EVERY=${VALID_EVERY:-0}
  if [ "$TASK_TYPE" = tagging ]; then BATCH=${BATCH:-16}; else BATCH=${BATCH:-32}; fi
  OPTIM_ARGS=(--optimizer kbert_adam)
else
  ARCH=${ARCH:-kbert_small}; EPOCHS=${EPOCHS:-0}; MINUTES=${MINUTES:-60}; LR=${LR:-2e-4}; BATCH=${BATCH:-32}
  VALID_EVERY=${VALID_EVERY:-200}
  OPTIM_ARGS=(--optimizer adam --adam-betas '(0.9, 0.98)' --weight-decay 0.01)
fi
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DECODE_ARGS=""  # stages.sh's decoding flags are for fairseq-generate recipes (K-BERT predicts with kbert_score)
. "$ROOT/examples/lib/stages.sh"  # after CRITERION and TASK_ARGS above: it keeps them
RUN=$OUT/runs/$NAME
mkdir -p "$OUT"

if stage 1; then
  echo "== stage 1: prepare $TSV_DIR + ${KG_FILE:-no KG} ${PRETRAINED_DICT[*]} -> $OUT/{data,kg,mlm,mlm-bin}"
  kg_src=(); [ -z "$KG_FILE" ] || kg_src=(--kg "$KG_FILE")
  $PY -m fairseq_knowgen.prep.kbert --data "$TSV_DIR" "${kg_src[@]}" "${PRETRAINED_DICT[@]}" --out "$OUT" $TAGGING
  rm -rf "$OUT/mlm-bin"
  $BIN/fairseq-preprocess --only-source --srcdict "$OUT/data/dict.txt" --trainpref "$OUT/mlm/train.txt" \
    --validpref "$OUT/mlm/valid.txt" --destdir "$OUT/mlm-bin" --workers 1 > "$OUT/mlm-bin.log" 2>&1 \
    || { echo "fairseq-preprocess failed: see $OUT/mlm-bin.log"; exit 1; }
fi
[ "$STOP_STAGE" -lt 2 ] || needs 1 prepare "$OUT/data/eval_splits"
if stage 2 && [ "$PRETRAINED" != "$MLM_CHECKPOINT" ]; then
  echo "== stage 2: skipped (PRETRAINED=$PRETRAINED)"
elif stage 2; then
  needs 1 prepare "$OUT/mlm-bin/dict.txt" "$OUT/mlm-bin/train.idx" "$OUT/mlm-bin/valid.idx"
  echo "== stage 2: character-level masked LM (roberta, $LAYERS x $DIM, $MLM_UPDATE updates / $MLM_MINUTES min) -> $OUT/mlm"
  # shellcheck disable=SC2086
  train_logged "$OUT/mlm" "$OUT/mlm-bin" --task masked_lm --criterion masked_lm --arch roberta \
    --encoder-layers "$LAYERS" --encoder-embed-dim "$DIM" --encoder-ffn-embed-dim $((4 * DIM)) \
    --encoder-attention-heads "$HEADS" --max-positions "$MAX_POSITIONS" --tokens-per-sample "$MAX_POSITIONS" \
    --sample-break-mode none --dropout 0.1 --attention-dropout 0.1 --seed "$SEED" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --weight-decay 0.01 --clip-norm 1.0 --lr "$MLM_LR" \
    --lr-scheduler polynomial_decay --warmup-updates $((MLM_UPDATE / 10)) --total-num-update "$MLM_UPDATE" \
    --max-update "$MLM_UPDATE" --stop-time-hours "$(hours "$MLM_MINUTES")" --batch-size "$MLM_BATCH" \
    --validate-interval-updates 500 --save-interval-updates 500 --keep-interval-updates 1 --log-interval 50 \
    $TRAIN_ARGS
fi
if stage 3; then
  needs 1 prepare "$OUT/data/train.tsv" "$OUT/data/dict.txt"
  [ "$PRETRAINED" != "$MLM_CHECKPOINT" ] || needs 2 "masked-LM pretraining" "$MLM_CHECKPOINT"
  init=()
  [ "$PRETRAINED" = none ] || init=(--kbert-pretrained "$PRETRAINED")
  if [ "$EPOCHS" -gt 0 ] && [ -z "$MAX_UPDATE_GIVEN" ]; then  # EPOCHS x ceil(rows / BATCH): every row counts
    rows=$(($(grep -c . "$OUT/data/train.tsv") - 1))
    MAX_UPDATE=$((EPOCHS * ((rows + BATCH - 1) / BATCH)))
  fi
  epochs_note=""; [ "$EPOCHS" = 0 ] || epochs_note=" ($EPOCHS epochs)"
  echo "== stage 3: fine-tune $NAME (--arch $ARCH ${ENCODER_ARGS[*]} $ARCH_ARGS, KG=$KG, seed $SEED," \
    "from ${PRETRAINED}; $MAX_UPDATE updates$epochs_note of $BATCH, --optimizer ${OPTIM_ARGS[1]}, lr $LR) -> $RUN"
  # shellcheck disable=SC2086
  train_logged "$RUN" "$OUT/data" --task "$FS_TASK" $KG_ARGS --max-positions "$MAX_POSITIONS" $TASK_ARGS \
    --arch "$ARCH" "${ENCODER_ARGS[@]}" "${init[@]}" $ARCH_ARGS --criterion "$CRITERION" --seed "$SEED" \
    "${OPTIM_ARGS[@]}" --clip-norm 1.0 --lr "$LR" \
    --lr-scheduler polynomial_decay --warmup-updates $((MAX_UPDATE / 10)) --total-num-update "$MAX_UPDATE" \
    --max-update "$MAX_UPDATE" --max-epoch "$EPOCHS" --stop-time-hours "$(hours "$MINUTES")" --batch-size "$BATCH" \
    --validate-interval-updates "$VALID_EVERY" --save-interval-updates "$VALID_EVERY" --keep-interval-updates 1 \
    --best-checkpoint-metric "$METRIC" --maximize-best-checkpoint-metric --log-interval 50 $TRAIN_ARGS
fi
if stage 4; then
  needs 3 fine-tune "$RUN/checkpoints/checkpoint_best.pt"
  decodings=(""); [ "$TASK_TYPE" != tagging ] || decodings=("" .viterbi)
  for split in $(cat "$OUT/data/eval_splits"); do
    for d in "${decodings[@]}"; do
      echo "== stage 4: predict${d:+ (Viterbi IOB2)} + score $split -> $RUN/$split$d.scores.json"
      $PY "$ROOT/scripts/kbert_score.py" --data "$OUT/data" --split "$split" --name "$NAME$d" ${d:+--viterbi} \
        --path "$RUN/checkpoints/checkpoint_best.pt" --pred "$RUN/$split$d.pred" \
        --json-out "$RUN/$split$d.scores.json" 2> "$RUN/$split$d.score.log" \
        || { echo "scoring failed: see $RUN/$split$d.score.log"; exit 1; }
    done
  done
fi
if stage 5 && [ "$TASK" != book_review ] && [ "$TASK" != medical_ner ]; then
  echo "== stage 5: no floor for $TASK (book_review and medical_ner have theirs)"
elif stage 5; then
  mkdir -p "$OUT/floors"
  for split in $(cat "$OUT/data/eval_splits"); do
    if [ "$TASK" = book_review ]; then
      floor=tfidf; extra=()
    else
      floor=dictionary; extra=(--kg "$OUT/kg/full.spo")
    fi
    echo "== stage 5: floor $floor on $split -> $OUT/floors/$floor/$split.scores.json"
    mkdir -p "$OUT/floors/$floor"
    $PY -m fairseq_knowgen.evaluation.kbert_floors $floor --data "$OUT/data" --split "$split" "${extra[@]}" \
      --pred "$OUT/floors/$floor/$split.pred"
    $PY "$ROOT/scripts/kbert_score.py" --data "$OUT/data" --split "$split" $TAGGING --name "$floor" \
      --pred "$OUT/floors/$floor/$split.pred" --json-out "$OUT/floors/$floor/$split.scores.json"
  done
fi
