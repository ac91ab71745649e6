# Shared stages of the recipes in examples/<dataset>/run.sh (sourced, not run).
# The recipe sets: ROOT OUT RUN NAME ARCH ARCH_ARGS LAYERS DIM HEADS MINUTES MAX_UPDATE BPE_OPS BEAM
# TRAIN_ARGS CRITERION CRITERION_ARGS TASK_ARGS DATA_BIN [CONSTRAINTS] [BPE_DECODE_ARGS: how fairseq-generate undoes the
# BPE, default --remove-bpe (subword-nmt); e.g. "--bpe gpt2 --gpt2-encoder-json ..."], and calls the functions below in its
# numbered stages. Recipes of another shape (examples/kbert, examples/cocon) use only PY BIN DEVICE_ARGS stage hours
# needs require_file train_logged.
# Outputs of constrained decoding (CONSTRAINTS=1) carry the suffix .cons: runs/NAME/SPLIT.cons.out and its scores;
# DECODE_ARGS (more fairseq-generate flags, e.g. a decoding rule) need a DECODE_NAME, added to the suffix
# (runs/NAME/SPLIT[.cons].DECODE_NAME.out), so that they never overwrite the plain outputs.
# CHECKPOINT=best (default: the best dev loss, checkpoint_best.pt), last (checkpoint_last.pt) or avgN (the average of
# the N newest checkpoints, written to checkpoint_avgN.pt by python -m fairseq_knowgen.checkpoint_average; train
# with KEEP_EPOCHS=N) is the checkpoint the decoding stages read; last and avgN add .last / .avgN to
# the suffix (runs/NAME/SPLIT[.cons][.DECODE_NAME].last.out).
# Training hyper-parameters (stage_train; defaults: the recipes' one-core settings, README "Results at one hour of
# one core"): LR=1e-3 WARMUP=1000 (inverse square root schedule) DROPOUT=0.2 MAX_TOKENS=4096 (per update, per
# process) SEED=1; KEEP_EPOCHS=0 (K > 0: keep the last K epoch checkpoints, for CHECKPOINT=avgN). A recipe may set
# its own before sourcing this file (examples/commongen/run.sh: LR=2e-3 WARMUP=500 DROPOUT=0.3, tuned on its dev).
CONS=$([ "${CONSTRAINTS:-0}" = 1 ] && echo .cons || true)
if [ -n "${DECODE_ARGS:-}" ]; then
  [ -n "${DECODE_NAME:-}" ] || { echo "DECODE_ARGS needs a DECODE_NAME (the suffix of its outputs)"; exit 2; }
  CONS="$CONS.$DECODE_NAME"
fi
CHECKPOINT=${CHECKPOINT:-best}
case $CHECKPOINT in best) ;; last) CONS="$CONS.last" ;;
  avg[1-9]|avg[1-9][0-9]) CONS="$CONS.$CHECKPOINT" ;;
  *) echo "CHECKPOINT must be best, last or avgN (N = 1-99)"; exit 2 ;; esac
LR=${LR:-1e-3}; WARMUP=${WARMUP:-1000}; DROPOUT=${DROPOUT:-0.2}; MAX_TOKENS=${MAX_TOKENS:-4096}; SEED=${SEED:-1}
KEEP_EPOCHS=${KEEP_EPOCHS:-0}

PY=$ROOT/.venv/bin/python
BIN=$ROOT/.venv/bin
DEVICE_ARGS=$([ -n "$(command -v nvidia-smi)" ] || echo --cpu)
CRITERION=${CRITERION:-label_smoothed_cross_entropy}
CRITERION_ARGS=${CRITERION_ARGS:---label-smoothing 0.1}
TASK_ARGS=${TASK_ARGS:-}

# eval_splits: the evaluation splits stage 1 wrote to raw/eval_splits (valid, then e.g. heldout, test...);
# extra_splits: those other than valid (binarized with train and valid: stage_binarize)
eval_splits() { cat "$OUT/raw/eval_splits"; }
extra_splits() { grep -vx valid "$OUT/raw/eval_splits" || true; }
# stage N: whether stage N is between STAGE and STOP_STAGE; hours MINUTES: MINUTES in hours (--stop-time-hours)
stage() { [ "$1" -ge "$STAGE" ] && [ "$1" -le "$STOP_STAGE" ]; }
hours() { $PY -c "print($1 / 60)"; }
# RECIPE_COMMAND: how this recipe was started (its arguments; the environment, e.g. NAME=..., is the user's to repeat)
RECIPE_COMMAND=${RECIPE_COMMAND:-"bash $ROOT/examples/$(basename "$(dirname "$0")")/run.sh${*:+$(printf ' %q' "$@")}"}
# needs N WHAT PATH...: stop (exit 2) at the first PATH that is missing, naming stage N (WHAT), which writes it, and
# the command that reruns the recipe from there. A stage renames each output into place only when it is complete, so
# a stage that was killed (or never run) leaves its outputs missing, never half-written: the next stage stops here.
needs() {
  local n=$1 what=$2 p; shift 2
  for p in "$@"; do
    [ -e "$p" ] || { echo "error: $p is missing: stage $n ($what) writes it and did not finish (killed, failed or" \
      "not run); rerun from stage $n with the same settings: STAGE=$n $RECIPE_COMMAND" >&2; exit 2; }
  done
}
# require_file PATH N: stop (exit 2) when a later stage runs before stage N wrote PATH (needs, for one file)
require_file() { needs "$2" "${3:-an earlier stage}" "$1"; }
# require_stage1: stop (exit 2) when a later stage runs before stage 1 wrote raw/eval_splits
require_stage1() { needs 1 prepare "$OUT/raw/eval_splits"; }

# into FILE COMMAND...: COMMAND's standard output into FILE through a temporary name beside it (.tmp-PID-NAME),
# renamed only when COMMAND succeeds; a failed or killed COMMAND leaves FILE as it was (or absent). COMMAND may be
# a shell function (for pipelines).
into() {
  local file=$1 tmp rc; shift
  tmp="$(dirname "$file")/.tmp-$$-$(basename "$file")"
  if "$@" > "$tmp"; then mv -f "$tmp" "$file"; else rc=$?; rm -f "$tmp"; return $rc; fi
}
# same_lines FILE...: stop (exit 2) unless the parallel files FILE... have the same number of lines, naming them
same_lines() {
  local first=$1 n m f; n=$(wc -l < "$first")
  for f in "${@:2}"; do
    m=$(wc -l < "$f")
    [ "$n" = "$m" ] || { echo "error: $f: $m lines, but $first has $n (parallel files: one line each)" >&2; exit 2; }
  done
}
# remove_stray_temps: the .tmp-PID-* files and folders under OUT whose writer (process PID) is gone: what a killed
# stage (into, fairseq_knowgen.textio) left behind
remove_stray_temps() {
  local f pid
  [ -d "${OUT:-}" ] || return 0
  while IFS= read -r -d '' f; do
    pid=${f##*/.tmp-}; pid=${pid%%-*}
    [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null && rm -rf "$f"
  done < <(find "$OUT" -maxdepth 4 -name '.tmp-*' -print0 2>/dev/null)
  return 0
}
remove_stray_temps

# train_logged RUN_DIR fairseq-train-args...: fairseq-train --user-dir fairseq_knowgen into RUN_DIR/checkpoints
# (no epoch checkpoints unless KEEP_EPOCHS > 0, no progress bar, any batch size, $DEVICE_ARGS last), its log appended
# to RUN_DIR/train.log and its train/valid lines on stdout; the arguments come after these flags (so they can override them). Fails, with the
# log's last lines, when fairseq-train fails or leaves no checkpoint_best.pt.
train_logged() {
  local run=$1; shift
  mkdir -p "$run"
  # a crash must not pass for success when an older checkpoint_best.pt is there: the exit status is checked, and
  # without a checkpoint_last.pt to resume from (fairseq keeps the best of the run it resumes) an older best
  # checkpoint is another run's: removed
  [ -f "$run/checkpoints/checkpoint_last.pt" ] || rm -f "$run/checkpoints/checkpoint_best.pt"
  local epochs=--no-epoch-checkpoints
  [ "${KEEP_EPOCHS:-0}" = 0 ] || epochs="--keep-last-epochs $KEEP_EPOCHS"
  # the log is appended to: a rerun that resumes keeps the earlier runs' lines after a header line of its own
  echo "== $(date '+%F %T') fairseq-train into $run/checkpoints (resumes checkpoint_last.pt when there is one)" \
    >> "$run/train.log"
  # shellcheck disable=SC2086
  if ! $BIN/fairseq-train --user-dir fairseq_knowgen --save-dir "$run/checkpoints" $epochs \
    --no-progress-bar --required-batch-size-multiple 1 "$@" $DEVICE_ARGS 2>&1 | tee -a "$run/train.log" \
    | { grep -E "\| (train|valid) \|" || true; }; then
    echo "fairseq-train failed; the last lines of $run/train.log:"
    tail -n 20 "$run/train.log"
    return 1
  fi
  [ -f "$run/checkpoints/checkpoint_best.pt" ] || { echo "no checkpoint: see $run/train.log"; return 1; }
}

# stage_bpe FILE...: learn joint BPE on raw/train.{src,tgt}, apply to every raw/FILE (into bpe/FILE);
# '<sep>' (EKI's concept/prototype separator) is never split
stage_bpe() {
  mkdir -p "$OUT/bpe"
  same_lines "$OUT/raw/train.src" "$OUT/raw/train.tgt"
  into "$OUT/bpe/codes" $BIN/subword-nmt learn-bpe -s "$BPE_OPS" --input <(cat "$OUT/raw/train.src" "$OUT/raw/train.tgt")
  for f in "$@"; do
    into "$OUT/bpe/$f" $BIN/subword-nmt apply-bpe -c "$OUT/bpe/codes" --glossaries '<sep>' --input "$OUT/raw/$f"
  done
}

# stage_binarize DEST SRCLANG [--separate-dictionaries] [fairseq-preprocess args]: binarize
# bpe/{train,valid}.{SRCLANG,tgt} and the extra evaluation splits bpe/SPLIT.{SRCLANG,tgt} (extra_splits) into DEST, in
# one fairseq-preprocess (one dictionary for both sides unless --separate-dictionaries, built from train alone; fairseq
# names the extra splits test, test1...: they are renamed SPLIT.*, which fairseq's tasks load by name: --gen-subset
# SPLIT)
stage_binarize() {
  local dest=$1 src=$2 split tmp f name i=0 extra testpref=() joined=(--joined-dictionary); shift 2
  if [ "${1:-}" = --separate-dictionaries ]; then joined=(); shift; fi
  mapfile -t extra < <(extra_splits)
  for split in train valid "${extra[@]}"; do same_lines "$OUT/bpe/$split.$src" "$OUT/bpe/$split.tgt"; done
  [ ${#extra[@]} -eq 0 ] || testpref=(--testpref "$(printf "$OUT/bpe/%s," "${extra[@]}" | sed 's/,$//')")
  # into a temporary folder that replaces DEST only when fairseq-preprocess succeeded
  tmp="$(dirname "$dest")/.tmp-$$-$(basename "$dest")"
  rm -rf "$tmp"
  $BIN/fairseq-preprocess --source-lang "$src" --target-lang tgt ${joined[@]+"${joined[@]}"} \
    --trainpref "$OUT/bpe/train" --validpref "$OUT/bpe/valid" "${testpref[@]}" "$@" --destdir "$tmp" --workers 2 \
    > "$dest.log" 2>&1 || { rm -rf "$tmp"; echo "fairseq-preprocess failed: see $dest.log"; return 1; }
  mkdir "$tmp/named"
  for split in "${extra[@]}"; do
    name=test$([ $i -eq 0 ] || echo $i) i=$((i + 1))
    for f in "$tmp/$name".*; do mv "$f" "$tmp/named/$split.${f#"$tmp/$name".}"; done
  done
  mv "$tmp"/named/* "$tmp"/ 2>/dev/null || true
  rmdir "$tmp/named"
  rm -rf "$dest" && mv "$tmp" "$dest"
}

# stage_constraints [--prototypes P] KIND DEST SRC SPLIT...: DEST/SPLIT.cons from the encoded source bpe/SPLIT.SRC
# (KIND: concepts or entities; see fairseq_knowgen/prep/constraints.py), read by fairseq-generate when CONSTRAINTS=1;
# --prototypes P (concepts only): DEST/SPLIT.cons-prototype instead, each concept in the form it takes in the
# prototype of the EKI source bpe/SPLIT.P (--form prototype)
stage_constraints() {
  local proto="" suffix=cons kind dest src split form
  if [ "$1" = --prototypes ]; then proto=$2; suffix=cons-prototype; shift 2; fi
  kind=$1 dest=$2 src=$3; shift 3
  for split in "$@"; do
    form=()
    [ -z "$proto" ] || form=(--form prototype --prototypes "$OUT/bpe/$split.$proto")
    $PY -m fairseq_knowgen.prep.constraints "$kind" --src "$OUT/bpe/$split.$src" "${form[@]}" \
      --out "$dest/$split.$suffix"
  done
}

# ENCODER=DIR (a folder python -m fairseq_knowgen.convert.hf_bert wrote): a released BERT as the encoder (the recipes
# then write under OUT/encoder-NAME). stage_wordpiece writes the source as the BERT reads it, encoder_dictionary the
# source's dictionary (or one for both sides), stage_binarize --separate-dictionaries keeps the target's own,
# stage_train starts the encoder from DIR (--encoder-pretrained: the BERT's sizes; the decoder's LAYERS x DIM, its
# input and output embeddings shared; FREEZE_ENCODER=1 adds --freeze-encoder).

# stage_wordpiece [--no-cls] FILE...: bpe/NAME.wp.src for each raw/NAME.src: its WordPiece of ENCODER (python -m
# fairseq_knowgen.prep.wordpiece: <s> first unless --no-cls, the package's symbols kept whole)
stage_wordpiece() {
  local cls=() f pairs=()
  if [ "$1" = --no-cls ]; then cls=(--no-cls); shift; fi
  for f in "$@"; do pairs+=("$OUT/raw/$f" "$OUT/bpe/${f%.src}.wp.src"); done
  $PY -m fairseq_knowgen.prep.wordpiece "$ENCODER" "${pairs[@]}" ${cls[@]+"${cls[@]}"}
}

# encoder_dictionary OUT_FILE FILE...: ENCODER's dict.txt (its rows in its order), then <sep> and every other token of
# bpe/FILE... it lacks (the package's symbols; with the target's file, its tokens: one dictionary for both sides)
encoder_dictionary() {
  local out=$1 f files=(); shift
  for f in "$@"; do files+=("$OUT/bpe/$f"); done
  $PY -m fairseq_knowgen.convert.extend_dictionary "$ENCODER" "$out" --add '<sep>' --add-from "${files[@]}"
}

# wp_names DIR: a WordPiece source binarized as language NAME.wp.src takes the names the tasks read (SPLIT.src-tgt.*)
wp_names() {
  local f
  for f in "$1"/*wp.src*; do mv "$f" "$(echo "$f" | sed -E 's/(eki(-ood)?\.)?wp\.src/src/g')"; done
}

# stage_train: fairseq-train $ARCH on $DATA_BIN into $RUN/checkpoints within MINUTES (and MAX_UPDATE if > 0);
# fails (with the log's last lines) when fairseq-train fails (train_logged)
stage_train() {
  local encoder=(--share-all-embeddings --encoder-layers "$LAYERS" --encoder-embed-dim "$DIM"
    --encoder-ffn-embed-dim $((4 * DIM)) --encoder-attention-heads "$HEADS")
  if [ -n "${ENCODER:-}" ]; then
    encoder=(--encoder-pretrained "$ENCODER" --share-decoder-input-output-embed)
    [ "${FREEZE_ENCODER:-0}" = 0 ] || encoder+=(--freeze-encoder)
  fi
  # shellcheck disable=SC2086
  train_logged "$RUN" "$DATA_BIN" --seed "$SEED" $TASK_ARGS \
    --arch "$ARCH" $ARCH_ARGS "${encoder[@]}" --decoder-layers "$LAYERS" --decoder-embed-dim "$DIM" \
    --decoder-ffn-embed-dim $((4 * DIM)) --decoder-attention-heads "$HEADS" --dropout "$DROPOUT" \
    --criterion "$CRITERION" $CRITERION_ARGS \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" \
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --stop-time-hours "$(hours "$MINUTES")" --log-interval 100 \
    $TRAIN_ARGS
}

# stage_finetune CHECKPOINT: fine-tune a released BART (CHECKPOINT, e.g. bart.large/model.pt; ARCH a bart_* or eki_bart_*
# architecture, DATA_BIN binarized with its dictionary) with the settings of fairseq's BART fine-tuning example
# (examples/bart/README.summarization.md): polynomial decay to MAX_UPDATE (--total-num-update) after WARMUP, adam
# (0.9, 0.999) eps 1e-08, weight decay 0.01, clip-norm 0.1, dropout DROPOUT and attention dropout 0.1, UPDATE_FREQ
# (default 1), MAX_EPOCH (default 0: no limit), --fp16 on CUDA unless FP16=0. --finetune-from-model is --restore-file
# with the four --reset-* flags on the first launch, and resumes checkpoint_last.pt when rerun (--restore-file would
# start over from CHECKPOINT).
stage_finetune() {
  local fp16=""
  [ "$DEVICE_ARGS" = --cpu ] || [ "${FP16:-1}" = 0 ] || fp16=--fp16
  # shellcheck disable=SC2086
  train_logged "$RUN" "$DATA_BIN" --seed "$SEED" $TASK_ARGS --arch "$ARCH" $ARCH_ARGS \
    --finetune-from-model "$1" --layernorm-embedding --share-all-embeddings --share-decoder-input-output-embed \
    --criterion "$CRITERION" $CRITERION_ARGS --dropout "$DROPOUT" --attention-dropout 0.1 --weight-decay 0.01 \
    --optimizer adam --adam-betas '(0.9, 0.999)' --adam-eps 1e-08 --clip-norm 0.1 \
    --lr-scheduler polynomial_decay --lr "$LR" --total-num-update "$MAX_UPDATE" --warmup-updates "$WARMUP" \
    --update-freq "${UPDATE_FREQ:-1}" --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" \
    --max-epoch "${MAX_EPOCH:-0}" --stop-time-hours "$(hours "$MINUTES")" --skip-invalid-size-inputs-valid-test \
    --find-unused-parameters --log-interval 100 $fp16 $TRAIN_ARGS
}

# stage_generate SUBSET OUTFILE: fairseq-generate with beam $BEAM from checkpoint_$CHECKPOINT.pt; CONSTRAINTS=1 adds
# fairseq's lexically constrained beam search over DATA_BIN/SUBSET.cons, DECODE_ARGS their flags (both decode with
# translation_constrained unless TASK_ARGS names a task)
stage_generate() {
  local constrain=() tmp
  tmp="$(dirname "$2")/.tmp-$$-$(basename "$2")"
  if [ "${CONSTRAINTS:-0}" = 1 ]; then
    # a constraint with a token outside the dictionary (a BPE piece only dev has) cannot be generated: dropped
    constrain=(--constraints unordered --constraints-from cons --constraints-unk drop)
  fi
  if [ "${CONSTRAINTS:-0}" = 1 ] || [ -n "${DECODE_ARGS:-}${GEN_ARGS:-}" ]; then
    [[ "$TASK_ARGS" == *--task* ]] || constrain+=(--task translation_constrained)
  fi
  # the average is built once per training state: again only when checkpoint_last.pt is newer (trained on since)
  if [[ $CHECKPOINT == avg* ]] && ! [ "$RUN/checkpoints/checkpoint_$CHECKPOINT.pt" -nt \
    "$RUN/checkpoints/checkpoint_last.pt" ]; then
    $PY -m fairseq_knowgen.checkpoint_average --dir "$RUN/checkpoints" --last "${CHECKPOINT#avg}" \
      --out "$RUN/checkpoints/checkpoint_$CHECKPOINT.pt" || exit 2
  fi
  # GEN_ARGS: the recipe's own decoding defaults (no suffix); DECODE_ARGS: the user's (suffix DECODE_NAME)
  # shellcheck disable=SC2086
  $BIN/fairseq-generate "$DATA_BIN" --user-dir fairseq_knowgen $TASK_ARGS "${constrain[@]}" ${GEN_ARGS:-} \
    ${DECODE_ARGS:-} --gen-subset "$1" \
    --path "$RUN/checkpoints/checkpoint_$CHECKPOINT.pt" --beam "$BEAM" --batch-size 128 ${BPE_DECODE_ARGS:---remove-bpe} \
    --required-batch-size-multiple 1 \
    $DEVICE_ARGS > "$tmp" 2> "$2.log" || { rm -f "$tmp"; echo "fairseq-generate failed: see $2.log"; return 1; }
  mv -f "$tmp" "$2"  # replaced only when complete: a failed decode leaves the earlier output as it was
}
