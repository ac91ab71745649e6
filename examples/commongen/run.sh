#!/usr/bin/env bash
# CommonGen: concept set -> everyday sentence. Staged recipe; rerun from any stage.
#
#   bash examples/commongen/run.sh DATA_DIR [OUT_DIR] [CORPUS_OOD]
#       DATA_DIR:   the raw CommonGen files (commongen.{train,dev}.{src_alpha,tgt}.txt; required)
#       OUT_DIR:    everything this recipe writes (default work/commongen)
#       CORPUS_OOD: plain text for out-of-domain prototypes, e.g. WikiText-2's valid.txt (default: none, no eki-ood)
#   Stages (STAGE=1 STOP_STAGE=7 select them):
#       1 prepare (raw/; dev is 'valid', and 'test' when DATA_DIR has commongen.test.src_alpha.txt)
#       2 retrieve prototypes (raw/*.eki.src, raw/*.eki-ood.src; without CORPUS_OOD's file only the first)   3 BPE
#       4 binarize: bin/ (concepts only), bin-eki/ (concepts <sep> in-domain prototype), bin-eki-ood/
#       5 train   6 fairseq-generate (beam) on every evaluation split (raw/eval_splits: valid [test])
#       7 evaluate (BLEU-4, ROUGE-L, CIDEr-D, coverage, repeats; a test split without references is not scored)
#   Environment (all optional):
#       NAME=transformer ARCH=transformer ARCH_ARGS=""   the system (run folder $OUT/runs/$NAME)
#       INPUT=concepts|eki|eki-ood   which binarized input to train on (eki*: use TASK_ARGS="--task eki_generation")
#       CRITERION=label_smoothed_cross_entropy CRITERION_ARGS="--label-smoothing 0.1" TASK_ARGS=""
#       LAYERS=2 DIM=128 HEADS=4   model size (ffn 4*DIM); scale up on GPUs
#       MINUTES=60 MAX_UPDATE=0    training budget (--stop-time-hours / --max-update)
#       BPE_OPS=8000 BEAM=5 TRAIN_ARGS=""   (TRAIN_ARGS e.g. "--distributed-world-size 8" on GPUs)
#       CONSTRAINTS=0   1: stages 6-7 decode with every concept as a constraint (fairseq's lexically constrained
#                       beam search, --constraints unordered; the concept as the input gives it) into SPLIT.cons.out
#       CONSTRAINT_FORM=concept   with CONSTRAINTS=1, the form each concept is constrained in (one form: fairseq's
#                       constraints have no disjunction): concept (as the input gives it: the lemma, DATA_BIN/SPLIT.cons
#                       of stage 4) or prototype (the form it takes in the in-domain prototype of that input, matched by
#                       lemma as coverage matches, else the concept; INPUT=eki-ood: the out-of-domain prototype;
#                       INPUT=concepts: the EKI prototype of the same split, bpe/SPLIT.eki.src, although that model never
#                       reads it). prototype: stage 6 writes DATA_BIN/SPLIT.cons-prototype (prep.constraints --form
#                       prototype) and decodes into SPLIT.cons-prototype.out
#       DECODE_ARGS="" DECODE_NAME=""   more fairseq-generate flags for the decoding stages, outputs named
#                  SPLIT[.cons].DECODE_NAME.out (e.g. DECODE_ARGS="--no-repeat-ngram-size 3" DECODE_NAME=norep3)
#       CHECKPOINT=best   the checkpoint the decoding stages read: best (lowest dev loss), last, or avgN (the
#                  average of the N newest checkpoints; train with KEEP_EPOCHS=N); outputs
#                  SPLIT[.cons][.DECODE_NAME][.last|.avgN].out; choose between them on dev, never on a test split
#       LR=2e-3 WARMUP=500 DROPOUT=0.3 MAX_TOKENS=4096 SEED=1   training (adam, inverse square root schedule);
#                  CommonGen's own defaults, tuned on dev for one hour of one core (docs/results/commongen.md,
#                  "Tuning the one-hour recipe"); the other recipes keep stages.sh's LR=1e-3 WARMUP=1000 DROPOUT=0.2
#       KEEP_EPOCHS=0   K > 0: keep the last K epoch checkpoints (for CHECKPOINT=avgN)
#       MAX_SHARED=""   stage 2: training prototypes only from sentences whose concept set shares at most
#                       MAX_SHARED concepts with the query (test-like retrieval; "" = only own references excluded)
#       PRETRAINED=DIR  fine-tune a released BART instead of training from scratch. DIR holds fairseq's bart.base or
#                  bart.large (model.pt, dict.txt) with GPT-2's encoder.json and vocab.bpe beside them, or the folder
#                  python -m fairseq_knowgen.convert.hf_bart HF_DIR DIR writes from a HuggingFace BART
#                  (docs/pretrained_bart.md). BART reads the text as it was pretrained on it: stage 1 keeps CommonGen's
#                  raw cased text (prep.commongen --text raw: no Moses tokenization, no lower-casing; WikiText
#                  prototypes detokenized), stage 3 encodes it with fairseq's GPT-2 BPE (each run between <sep> and the
#                  package's other symbols apart, the symbols kept whole: python -m fairseq_knowgen.prep.commongen
#                  gpt2-bpe); stage 4 binarizes with bart's dictionary, grown with <sep> for the EKI inputs
#                  (python -m fairseq_knowgen.convert.extend_dictionary: bart's rows and <mask> kept, <sep> a new
#                  row, the mean of bart's); stage 7 scores as for the other rows (Moses-detokenized, the metrics
#                  lower-case and tokenize), so the numbers stay comparable.
#                  ARCH=eki_bart_large (default; or eki_bart_base): EKI-BART on INPUT=eki with eki_generation and
#                  eki_label_smoothed_cross_entropy, with the authors' released settings (LibertFan/EKI-BART,
#                  src/train2.sh and README; docs/methods/eki.md):
#                    fine-tuning: --finetune-from-model DIR/model.pt, label smoothing 0.1, lambda 0.5 (the criterion's
#                    default), dropout and attention dropout 0.1, weight decay 0.01, Adam (0.9, 0.999) eps 1e-08,
#                    clip-norm 0.1, polynomial decay from lr 5e-3 after 500 warm-up updates to 5,000 updates, at most
#                    10 epochs, 1,024 tokens x update-freq 1, fp32 (their FP16 is off)
#                    defaults: LR=5e-3 WARMUP=500 DROPOUT=0.1 MAX_TOKENS=1024 UPDATE_FREQ=1 MAX_UPDATE=5000
#                    MAX_EPOCH=10 FP16=0 MINUTES=0 (no time limit)
#                    decoding (their generate2.py / README): beam 5, --lenpen 0 --min-len 3 --max-len-a 0
#                    --max-len-b 24 --no-repeat-ngram-size 3 (LENPEN=0 MIN_LEN=3 MAX_LEN=24 NO_REPEAT=3; their
#                    script's own default is 32, the README's command 24)
#                  ARCH=bart_dimattn_large/base: BART+DimAttn on INPUT=concepts, with fairseq's BART fine-tuning
#                  example's settings (examples/bart/README.summarization.md; no released code for DimAttn):
#                    lr 3e-05, 2,048 tokens x update-freq 4 (8 GPUs; UPDATE_FREQ=32 on one), 20,000 updates, fp16 on
#                    CUDA, plain beam; defaults LR=3e-05 WARMUP=500 DROPOUT=0.1 MAX_TOKENS=2048 UPDATE_FREQ=4
#                    MAX_UPDATE=20000 MINUTES=0
#                  Both: --layernorm-embedding --share-all-embeddings --share-decoder-input-output-embed
#                  --skip-invalid-size-inputs-valid-test --find-unused-parameters; stage 6 decodes with --bpe gpt2.
#                  CONSTRAINTS=1 is not available here. Everything goes under OUT_DIR/bart (raw/, bpe/, bin*/,
#                  runs/NAME/): BART's cased text and GPT-2 BPE beside the from-scratch runs' folders in one OUT_DIR
#                  (a raw/ of the other text form is refused at stage 3).
#       ENCODER=DIR   a released BERT as the encoder (Rothe et al. 2020's BERT2RND; docs/methods/pretrained_encoder.md):
#                  DIR is the folder python -m fairseq_knowgen.convert.hf_bert HF_DIR DIR writes. Everything goes under
#                  OUT_DIR/encoder-NAME (NAME: DIR's name). Stage 3 also writes each source as the BERT reads it
#                  (bpe/SPLIT[.eki|.eki-ood].wp.src: python -m fairseq_knowgen.prep.wordpiece, <s> first except for the
#                  EKI inputs, whose dataset puts it there); the target keeps the BPE. Stage 4 binarizes those sources
#                  with DIR's dictionary grown with <sep>: bin/ beside the target's own dictionary; bin-eki*/ (and
#                  bin-one/, which an ARCH with the copy head reads) with one dictionary for both sides, DIR's grown
#                  with <sep> and the target's BPE (convert.extend_dictionary; CONSTRAINTS=1 reads the concepts from
#                  bpe/SPLIT.src, as before). Stage 5 trains with --encoder-pretrained DIR (the BERT's sizes; the
#                  decoder's LAYERS x DIM, its input and output embeddings shared; FREEZE_ENCODER=1: --freeze-encoder).
#                  ARCH=transformer is then transformer_pretrained_encoder; transformer_dimattn, copy_transformer and
#                  eki_transformer take it as they are.
#   Examples:
#       bash examples/commongen/run.sh DATA                              # transformer on concepts
#       ENCODER=minilm bash examples/commongen/run.sh DATA               # the same with minilm's encoder
#       PRETRAINED=bart.large bash examples/commongen/run.sh DATA         # EKI-BART (eki_bart_large)
#       PRETRAINED=bart.large NAME=bart_dimattn ARCH=bart_dimattn_large bash examples/commongen/run.sh DATA
#       NAME=dimattn ARCH=transformer_dimattn STAGE=5 bash examples/commongen/run.sh DATA
#       NAME=eki INPUT=eki ARCH=eki_transformer TASK_ARGS="--task eki_generation" \
#           CRITERION=eki_label_smoothed_cross_entropy CRITERION_ARGS="--label-smoothing 0.1 --eki-lambda 1" \
#           STAGE=5 bash examples/commongen/run.sh DATA
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
usage() { { echo "usage:"; sed -n '/^#   bash examples/,/^#   [A-Z]/p' "$0" | sed '$d; s/^#//'; } >&2; exit 2; }
[ $# -ge 1 ] || usage
DATA=$(realpath -m "$1")
OUT=$(realpath -m "${2:-$ROOT/work/commongen}")
CORPUS_OOD=${3:+$(realpath -m "$3")}
STAGE=${STAGE:-1}; STOP_STAGE=${STOP_STAGE:-7}
PRETRAINED=${PRETRAINED:+$(realpath -m "$PRETRAINED")}
TEXT=moses  # stage 1's text form: moses (lower-cased, Moses-tokenized) for the from-scratch models, raw for BART
if [ -n "$PRETRAINED" ]; then  # a released BART: its architecture, input, task, criterion and settings
  for f in model.pt dict.txt encoder.json vocab.bpe; do
    [ -f "$PRETRAINED/$f" ] || { echo "PRETRAINED=$PRETRAINED has no $f (docs/pretrained_bart.md)"; exit 2; }
  done
  [ "${CONSTRAINTS:-0}" = 0 ] || { echo "CONSTRAINTS=1 is not available with PRETRAINED"; exit 2; }
  TEXT=raw
  GPT2_ARGS="--gpt2-encoder-json $PRETRAINED/encoder.json --gpt2-vocab-bpe $PRETRAINED/vocab.bpe"
  ARCH=${ARCH:-eki_bart_large}; NAME=${NAME:-$ARCH}
  case $ARCH in
    eki_bart_*) INPUT=${INPUT:-eki}; CRITERION=${CRITERION:-eki_label_smoothed_cross_entropy}
      TASK_ARGS=${TASK_ARGS:-"--task eki_generation --eki-gpt2-encoder-json $PRETRAINED/encoder.json"}
      # the authors' released fine-tuning (src/train2.sh) and decoding (src/generate2.py, README) settings
      LR=${LR:-5e-3}; WARMUP=${WARMUP:-500}; DROPOUT=${DROPOUT:-0.1}; MAX_TOKENS=${MAX_TOKENS:-1024}
      UPDATE_FREQ=${UPDATE_FREQ:-1}; MAX_UPDATE=${MAX_UPDATE:-5000}; MAX_EPOCH=${MAX_EPOCH:-10}; FP16=${FP16:-0}
      GEN_ARGS="--lenpen ${LENPEN:-0} --min-len ${MIN_LEN:-3} --max-len-a 0 --max-len-b ${MAX_LEN:-24}"
      GEN_ARGS="$GEN_ARGS --no-repeat-ngram-size ${NO_REPEAT:-3}" ;;
    bart_*) INPUT=${INPUT:-concepts}
      # fairseq's BART fine-tuning example (examples/bart/README.summarization.md)
      LR=${LR:-3e-05}; WARMUP=${WARMUP:-500}; DROPOUT=${DROPOUT:-0.1}; MAX_TOKENS=${MAX_TOKENS:-2048}
      UPDATE_FREQ=${UPDATE_FREQ:-4}; MAX_UPDATE=${MAX_UPDATE:-20000} ;;
    *) echo "PRETRAINED needs a BART architecture (eki_bart_large, bart_dimattn_large...), not ARCH=$ARCH"; exit 2 ;;
  esac
  MINUTES=${MINUTES:-0}
  BPE_DECODE_ARGS="--bpe gpt2 $GPT2_ARGS"
  # BART's text, BPE and dictionary differ from the from-scratch runs': its stages write under OUT/bart (raw/, bpe/,
  # bin*/, runs/), so that both kinds of run live in one OUT
  OUT=$OUT/bart
fi
ENCODER=${ENCODER:+$(realpath -m "$ENCODER")}
if [ -n "$ENCODER" ]; then  # a converted BERT as the encoder: its own folder of outputs
  [ -z "$PRETRAINED" ] || { echo "ENCODER and PRETRAINED exclude each other"; exit 2; }
  for f in model.pt dict.txt; do [ -f "$ENCODER/$f" ] || { echo "ENCODER=$ENCODER has no $f: give the folder" \
    "python -m fairseq_knowgen.convert.hf_bert HF_DIR DIR writes"; exit 2; }; done
  OUT=$OUT/encoder-$(basename "$ENCODER")
  [ "${ARCH:-transformer}" != transformer ] || ARCH=transformer_pretrained_encoder
fi
NAME=${NAME:-transformer}; ARCH=${ARCH:-transformer}; ARCH_ARGS=${ARCH_ARGS:-}; INPUT=${INPUT:-concepts}
LAYERS=${LAYERS:-2}; DIM=${DIM:-128}; HEADS=${HEADS:-4}
MINUTES=${MINUTES:-60}; MAX_UPDATE=${MAX_UPDATE:-0}; BPE_OPS=${BPE_OPS:-8000}; BEAM=${BEAM:-5}
TRAIN_ARGS=${TRAIN_ARGS:-}; MAX_SHARED=${MAX_SHARED:-}; CONSTRAINT_FORM=${CONSTRAINT_FORM:-concept}
case $CONSTRAINT_FORM in concept) ;; prototype) [ "${CONSTRAINTS:-0}" = 1 ] \
  || { echo "CONSTRAINT_FORM=prototype needs CONSTRAINTS=1"; exit 2; } ;;
  *) echo "CONSTRAINT_FORM must be concept or prototype"; exit 2 ;; esac
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
RUN=$OUT/runs/$NAME
# SRC_BPE: the encoded source of INPUT (bpe/SPLIT.SRC_BPE); PROTO_BPE: the EKI source whose prototypes give
# CONSTRAINT_FORM=prototype its forms
# ENCODER: bin/ has the target's own dictionary beside the BERT's; an ARCH with the copy head reads bin-one/ (one
# dictionary for both sides, as bin-eki*/ always have)
BIN_CONCEPTS=bin
[ -z "$ENCODER" ] || [[ "$ARCH" != copy_* ]] || BIN_CONCEPTS=bin-one
case $INPUT in concepts) DATA_BIN=$OUT/$BIN_CONCEPTS SRC_BPE=src PROTO_BPE=eki.src ;;
  eki|eki-ood) DATA_BIN=$OUT/bin-$INPUT SRC_BPE=$INPUT.src PROTO_BPE=$INPUT.src ;;
  *) echo "INPUT must be concepts, eki or eki-ood"; exit 2 ;; esac
mkdir -p "$OUT"
# measured on CommonGen dev at 60 minutes of one core (docs/results/commongen.md, "Tuning the one-hour recipe"): +0.5 BLEU-4 with the
# trigram blocker, +0.7 with constraints and the blocker over stages.sh's 1e-3 / 1,000 / 0.2
LR=${LR:-2e-3}; WARMUP=${WARMUP:-500}; DROPOUT=${DROPOUT:-0.3}
. "$ROOT/examples/lib/stages.sh"
# paste_sep A B: line i of A, " <sep> ", line i of B (EKI's source: concepts <sep> prototype)
paste_sep() { paste -d '\t' "$1" "$2" | sed 's/\t/ <sep> /'; }
# inputs_to_encode: the raw/ files stage 3 encodes (the out-of-domain EKI input only when stage 2 made it)
inputs_to_encode() {
  local s
  for s in train $(eval_splits); do
    echo "$s.src" "$s.tgt" "$s.eki.src"
    [ ! -f "$OUT/raw/train.eki-ood.src" ] || echo "$s.eki-ood.src"
  done
}
# need_encoded DIR STAGE WHAT: every file stage 3 encodes (inputs_to_encode) is in DIR (raw: written by stages 1 and
# 2; bpe: by stage 3)
need_encoded() {
  local f
  for f in $(inputs_to_encode); do
    case $1:$f in raw:*.eki*.src) needs 2 "retrieve prototypes" "$OUT/raw/$f" ;;
      raw:*) needs 1 prepare "$OUT/raw/$f" ;;
      *) needs 3 BPE "$OUT/bpe/$f" ;; esac
  done
}
# need_binarized SPLIT...: DATA_BIN holds the dictionary and each SPLIT (stage 4); INPUT=eki-ood needs stage 2's
# out-of-domain prototypes first, which only a CORPUS_OOD file gives
need_binarized() {
  [ "$INPUT" != eki-ood ] || needs 2 "retrieve prototypes; out-of-domain ones only from CORPUS_OOD=$CORPUS_OOD" \
    "$OUT/raw/train.eki-ood.src"
  local split
  needs 4 binarize "$DATA_BIN/dict.src.txt"
  for split in "$@"; do needs 4 binarize "$DATA_BIN/$split.src-tgt.src.idx" "$DATA_BIN/$split.src-tgt.tgt.idx"; done
}
if [ "$CONSTRAINT_FORM" = prototype ]; then  # its own constraint file and outputs: SPLIT.cons-prototype[.DECODE_NAME].out
  CONS=".cons-prototype${CONS#.cons}"
  GEN_ARGS="${GEN_ARGS:-} --constraints-from cons-prototype"  # after stage_generate's --constraints-from cons: wins
fi

if stage 1; then
  echo "== stage 1: prepare $DATA -> $OUT/raw"
  $PY -m fairseq_knowgen.prep.commongen --data "$DATA" --out "$OUT/raw" --text "$TEXT"
fi
[ "$STOP_STAGE" -lt 2 ] || require_stage1
if stage 2; then
  if [ -f "$CORPUS_OOD" ]; then
    echo "== stage 2: retrieve prototypes: in-domain (training references) and out-of-domain ($CORPUS_OOD)"
  else
    echo "== stage 2: retrieve prototypes: in-domain only" \
      "(no out-of-domain corpus at ${CORPUS_OOD:-CORPUS_OOD, not given}: no INPUT=eki-ood)"
  fi
  for split in train $(eval_splits); do
    # training queries: MAX_SHARED (test-like); evaluation queries: how close they come to training sets
    opts=(--overlap-report)
    [ "$split" != train ] || opts=(${MAX_SHARED:+--max-shared-concepts "$MAX_SHARED"})
    $PY scripts/retrieve_prototypes.py --queries "$OUT/raw/$split.src" --out "$OUT/raw/$split.proto" \
      --corpus "$OUT/raw/train.tgt" --corpus-keys "$OUT/raw/train.src" "${opts[@]}" \
      | tee "$OUT/raw/$split.proto.json"
    protos=(proto)
    if [ -f "$CORPUS_OOD" ]; then
      $PY scripts/retrieve_prototypes.py --queries "$OUT/raw/$split.src" --out "$OUT/raw/$split.proto-ood" \
        --corpus "$CORPUS_OOD" --plain-text --text "$TEXT" | tee "$OUT/raw/$split.proto-ood.json"
      protos+=(proto-ood)
    else  # no stale out-of-domain input of another run
      rm -f "$OUT/raw/$split.proto-ood" "$OUT/raw/$split.proto-ood.json" "$OUT/raw/$split.eki-ood.src"
    fi
    for p in "${protos[@]}"; do
      same_lines "$OUT/raw/$split.src" "$OUT/raw/$split.$p"
      into "$OUT/raw/$split.eki${p#proto}.src" paste_sep "$OUT/raw/$split.src" "$OUT/raw/$split.$p"
    done
  done
fi
if stage 3; then
  # raw/ from before the text forms is Moses text
  made=$(cat "$OUT/raw/text" 2>/dev/null || echo moses)
  [ "$made" = "$TEXT" ] || { echo "$OUT/raw holds $made text, this run needs $TEXT (PRETRAINED: raw):" \
    "rerun from stage 1 or give another OUT_DIR"; exit 2; }
  need_encoded raw
  # shellcheck disable=SC2046
  if [ -n "$PRETRAINED" ]; then
    echo "== stage 3: GPT-2 BPE of $PRETRAINED (fairseq's encoder, <sep> kept whole) -> $OUT/bpe"
    $PY -m fairseq_knowgen.prep.commongen gpt2-bpe --encoder-json "$PRETRAINED/encoder.json" \
      --vocab-bpe "$PRETRAINED/vocab.bpe" --in-dir "$OUT/raw" --out-dir "$OUT/bpe" \
      $(inputs_to_encode)
  else
    echo "== stage 3: joint BPE ($BPE_OPS merges, subword-nmt) -> $OUT/bpe"
    stage_bpe $(inputs_to_encode)
  fi
  if [ -n "$ENCODER" ]; then
    echo "== stage 3: the sources as $ENCODER reads them (its WordPiece) -> $OUT/bpe/*.wp.src"
    # shellcheck disable=SC2046
    stage_wordpiece $(inputs_to_encode | tr ' ' '\n' | grep -E '^[a-z_0-9]+\.src$')
    # shellcheck disable=SC2046
    stage_wordpiece --no-cls $(inputs_to_encode | tr ' ' '\n' | grep -E '\.eki(-ood)?\.src$')
  fi
  [ -f "$OUT/raw/train.eki-ood.src" ] || rm -f "$OUT"/bpe/*.eki-ood.src  # none of an earlier run's
fi
if stage 4; then
  need_encoded bpe
  extra=$(extra_splits | xargs)
  echo "== stage 4: fairseq-preprocess -> $OUT/bin, $OUT/bin-eki, $OUT/bin-eki-ood (splits: train valid $extra)"
  dict=() dict_eki=() wp="" bins=(bin)
  if [ -n "$ENCODER" ]; then  # the BERT's sources: its dictionary grown with <sep>; the target's own, or one for both
    encoder_dictionary "$OUT/bpe/dict.encoder-src.txt" train.wp.src
    encoder_dictionary "$OUT/bpe/dict.encoder.txt" train.wp.src train.eki.wp.src train.tgt
    dict=(--separate-dictionaries --srcdict "$OUT/bpe/dict.encoder-src.txt")
    dict_eki=(--srcdict "$OUT/bpe/dict.encoder.txt") wp=wp.
    if [ "$BIN_CONCEPTS" = bin-one ]; then
      stage_binarize "$OUT/bin-one" wp.src "${dict_eki[@]}" && wp_names "$OUT/bin-one" && bins+=(bin-one)
    fi
  fi
  if [ -n "$PRETRAINED" ]; then  # bart's dictionary, <mask> kept on its row; for EKI <sep> a new symbol after it
    $PY -m fairseq_knowgen.convert.extend_dictionary "$PRETRAINED" "$OUT/bpe/dict.txt"
    $PY -m fairseq_knowgen.convert.extend_dictionary "$PRETRAINED" "$OUT/bpe/dict.eki.txt" --add '<sep>'
    dict=(--srcdict "$OUT/bpe/dict.txt") dict_eki=(--srcdict "$OUT/bpe/dict.eki.txt")
  fi
  stage_binarize "$OUT/bin" ${wp}src ${dict[@]+"${dict[@]}"}
  stage_binarize "$OUT/bin-eki" eki.${wp}src ${dict_eki[@]+"${dict_eki[@]}"}
  eki_bins=(bin-eki)
  if [ -f "$OUT/bpe/train.eki-ood.src" ]; then
    stage_binarize "$OUT/bin-eki-ood" eki-ood.${wp}src --srcdict "$OUT/bin-eki/dict.eki.${wp}src.txt"
    eki_bins+=(bin-eki-ood)
  else
    rm -rf "$OUT/bin-eki-ood"
  fi
  for d in "${eki_bins[@]}"; do  # the tasks read SPLIT.src-tgt.*: name the source side 'src'
    for f in "$OUT/$d"/*eki*; do mv "$f" "$(echo "$f" | sed -E 's/eki(-ood)?\.(wp\.)?src/src/g')"; done
  done
  [ -z "$ENCODER" ] || wp_names "$OUT/bin"
  # shellcheck disable=SC2046
  [ -n "$PRETRAINED" ] || for d in "${bins[@]}" "${eki_bins[@]}"; do
    stage_constraints concepts "$OUT/$d" src $(eval_splits)
  done
fi
if stage 5; then
  need_binarized train valid
  if [ -n "$PRETRAINED" ]; then
    echo "== stage 5: fine-tune $PRETRAINED/model.pt as $NAME (--arch $ARCH $ARCH_ARGS on $INPUT) -> $RUN"
    stage_finetune "$PRETRAINED/model.pt"
  else
    sizes="$LAYERS+$LAYERS layers x $DIM"
    [ -z "$ENCODER" ] || sizes="the encoder of $ENCODER, $LAYERS decoder layers x $DIM"
    echo "== stage 5: train $NAME (--arch $ARCH $ARCH_ARGS on $INPUT; $sizes) -> $RUN"
    stage_train
  fi
fi
if stage 6; then
  # shellcheck disable=SC2046
  need_binarized $(eval_splits)
  case $CHECKPOINT in best) needs 5 train "$RUN/checkpoints/checkpoint_best.pt" ;;
    *) needs 5 train "$RUN/checkpoints/checkpoint_last.pt" ;; esac
  # shellcheck disable=SC2046
  [ "${CONSTRAINTS:-0}" = 0 ] || needs 4 binarize $(for s in $(eval_splits); do echo "$DATA_BIN/$s.cons"; done)
  if [ "$CONSTRAINT_FORM" = prototype ]; then
    echo "== stage 6: concepts in the form of the prototypes of bpe/SPLIT.$PROTO_BPE -> $DATA_BIN/SPLIT.cons-prototype"
    # shellcheck disable=SC2046
    stage_constraints --prototypes "$PROTO_BPE" concepts "$DATA_BIN" "$SRC_BPE" $(eval_splits)
  fi
  for split in $(eval_splits); do
    echo "== stage 6: fairseq-generate --beam $BEAM on $split -> $RUN/$split$CONS.out"
    stage_generate "$split" "$RUN/$split$CONS.out"
  done
fi
if stage 7; then
  for split in $(eval_splits); do
    if [ ! -f "$OUT/raw/$split.refs.jsonl" ]; then
      echo "== stage 7: $split has no references: outputs in $RUN/$split$CONS.out, not scored"
      continue
    fi
    needs 6 fairseq-generate "$RUN/$split$CONS.out"
    echo "== stage 7: evaluate $split -> $RUN/$split$CONS.scores.json"
    $PY scripts/evaluate.py --hyp "$RUN/$split$CONS.out" --name "$NAME/$split$CONS" \
      --refs "$OUT/raw/$split.refs.jsonl" --src "$OUT/raw/$split.src" --concepts "$OUT/raw/$split.concepts" \
      --detok moses --json-out "$RUN/$split$CONS.scores.json"
  done
fi
