#!/usr/bin/env bash
# WebNLG 2017: DBpedia triples -> text. Staged recipe; rerun from any stage.
#
#   bash examples/webnlg/run.sh DATA_DIR [OUT_DIR]
#       DATA_DIR: the WebNLG folder with train/ and dev/ (required)
#       OUT_DIR:  everything this recipe writes (default work/webnlg)
#   Splits: train (minus held-out categories), valid (= dev, seen categories),
#           heldout (training entries of HELDOUT categories, unseen by the model; HELDOUT="" for none),
#           test_seen / test_unseen (when DATA_DIR has test/: the test set's entries of categories the model
#           trained on / of the others). $OUT/raw/eval_splits lists the splits stages 5-6 decode and score.
#   Environment (all optional):
#       STAGE=1 STOP_STAGE=6       1 prepare, 2 bpe, 3 binarize, 4 train, 5 generate (every eval split), 6 evaluate
#       NAME=transformer ARCH=transformer ARCH_ARGS=""   the system (run folder $OUT/runs/$NAME)
#       CRITERION=label_smoothed_cross_entropy CRITERION_ARGS="--label-smoothing 0.1" TASK_ARGS=""
#       LAYERS=2 DIM=128 HEADS=4   model size (ffn 4*DIM)
#       MINUTES=60 MAX_UPDATE=0    training budget
#       BPE_OPS=0: word level (default); words seen fewer than MIN_COUNT=2 times in train become <unk-N>
#                  placeholders that copy models copy and stage 5 restores
#       BPE_OPS=4000: joint subword-nmt BPE instead (copy models then copy pieces; needs ENTITIES=0)
#       ENTITIES=1 (default at word level; 0 for word-level placeholders only): whole-entity placeholders: stage 1
#                  makes each subject and object one source token <ent-K> and its mentions in the references that
#                  token (python -m fairseq_knowgen.prep.webnlg --entity-placeholders; its match rate per split in
#                  $OUT/raw/entity_match.json), stage 2 keeps <ent-K> as words (rarer words still <unk-N>),
#                  stage 5 restores <ent-K> to the entity's surface form (ENTITY_SURFACE=text, or dbpedia:
#                  the cleaned DBpedia form) from $OUT/raw/SPLIT.entmap. Stages 2-6 follow what stage 1 wrote.
#                  The default since it measured best on dev and held-out categories (docs/results/webnlg.md).
#       CONSTRAINTS=1: stages 5-6 decode with every source entity (as encoded: <ent-K>, or its words and <unk-N>)
#                  as a constraint (--constraints unordered) into SPLIT.cons.out and SPLIT.cons.scores.json
#       BEAM=5 HELDOUT=Astronaut,Monument,University (those of them the training data has) TRAIN_ARGS=""
#       ENTITY_ONCE=1 (default with ENTITIES=1 and CONSTRAINTS=0): stage 5 lets each <ent-K> appear at most once in
#                  an output (fairseq-generate --at-most-once '<ent-\d+>'); 0 decodes without that rule. With
#                  CONSTRAINTS=1 the default is 0: constraints already name every entity, and the rule then cost
#                  6-7 BLEU on dev and held-out categories (19% of held-out first references repeat one;
#                  docs/short_budget_results.md)
#       DECODE_ARGS="" DECODE_NAME=""   more fairseq-generate flags for the decoding stages, outputs named
#                  SPLIT[.cons].DECODE_NAME.out (e.g. DECODE_ARGS="--at-most-once <ent-\d+>" DECODE_NAME=once)
#       CHECKPOINT=best   the checkpoint the decoding stages read: best (lowest dev loss), last, or avgN (the
#                  average of the N newest checkpoints; train with KEEP_EPOCHS=N); outputs
#                  SPLIT[.cons][.DECODE_NAME][.last|.avgN].out; choose between them on dev, never on a test split
#       LR=1e-3 WARMUP=1000 DROPOUT=0.2 MAX_TOKENS=4096 SEED=1   training (adam, inverse square root schedule)
#       KEEP_EPOCHS=0   K > 0: keep the last K epoch checkpoints (for CHECKPOINT=avgN)
#       ENCODER=DIR   a released BERT as the encoder (Rothe et al. 2020's BERT2RND; docs/methods/pretrained_encoder.md):
#                  DIR is the folder python -m fairseq_knowgen.convert.hf_bert HF_DIR DIR writes. Everything goes under
#                  OUT_DIR/encoder-NAME (NAME: DIR's name). Stage 2 also writes each source as the BERT reads it
#                  (bpe/SPLIT.wp.src: python -m fairseq_knowgen.prep.wordpiece, <s> first, <ent-K> kept whole); the
#                  target keeps its words and placeholders (or BPE). Stage 3 binarizes those sources with DIR's
#                  dictionary grown with <ent-K>: bin/ beside the target's own dictionary, and for an ARCH with the copy
#                  head bin-one/, one dictionary for both sides, DIR's grown with the target's tokens
#                  (convert.extend_dictionary; CONSTRAINTS=1 reads the entities from bpe/SPLIT.src, as before). Stage 4
#                  trains with --encoder-pretrained DIR (the BERT's sizes; the decoder's LAYERS x DIM, its input and
#                  output embeddings shared; FREEZE_ENCODER=1: --freeze-encoder). ARCH=transformer is then
#                  transformer_pretrained_encoder; transformer_dimattn and copy_transformer take it as they are.
#   Examples:
#       bash examples/webnlg/run.sh DATA
#       ENCODER=minilm bash examples/webnlg/run.sh DATA   # the same with minilm's encoder
#       NAME=dimattn ARCH=transformer_dimattn STAGE=4 bash examples/webnlg/run.sh DATA
#       NAME=copy-force ARCH=copy_transformer_small CRITERION=force_copy \
#           CRITERION_ARGS="--copy-supervision force" STAGE=4 bash examples/webnlg/run.sh DATA
#       NAME=fairseq-pg ARCH=transformer_pointer_generator STAGE=4 bash examples/webnlg/run.sh DATA
#           (fairseq's own pointer-generator, the copy model's peer: p_gen unsupervised, the default criterion;
#           stage 4 adds --source-position-markers K, the number of <unk-N> that end the dictionary, from
#           python -m fairseq_knowgen.prep.position_markers; pointing defaults: --alignment-layer -1
#           --alignment-heads 1, other values through ARCH_ARGS)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
usage() { { echo "usage:"; sed -n '/^#   bash examples/,/^#   [A-Z]/p' "$0" | sed '$d; s/^#//'; } >&2; exit 2; }
[ $# -ge 1 ] || usage
DATA=$(realpath -m "$1")
OUT=$(realpath -m "${2:-$ROOT/work/webnlg}")
STAGE=${STAGE:-1}; STOP_STAGE=${STOP_STAGE:-6}
NAME=${NAME:-transformer}; ARCH=${ARCH:-transformer}; ARCH_ARGS=${ARCH_ARGS:-}
LAYERS=${LAYERS:-2}; DIM=${DIM:-128}; HEADS=${HEADS:-4}
MINUTES=${MINUTES:-60}; MAX_UPDATE=${MAX_UPDATE:-0}; BPE_OPS=${BPE_OPS:-0}; MIN_COUNT=${MIN_COUNT:-2}; BEAM=${BEAM:-5}
# HELDOUT unset: WebNLG's Astronaut, Monument and University where the training data has them (your own data in
# WebNLG's format needs none); set but empty: no held-out categories
if [ -z "${HELDOUT+x}" ]; then
  HELDOUT=$(for c in Astronaut Monument University; do
    if grep -rqsF "category=\"$c\"" "$DATA/train"; then echo "$c"; fi; done | paste -sd, -)
fi
TRAIN_ARGS=${TRAIN_ARGS:-}
ENTITIES=${ENTITIES:-$([ "$BPE_OPS" = 0 ] && echo 1 || echo 0)}; ENTITY_SURFACE=${ENTITY_SURFACE:-text}
ENTITY_ONCE=${ENTITY_ONCE:-$([ "${CONSTRAINTS:-0}" = 1 ] && echo 0 || echo "$ENTITIES")}
GEN_ARGS=$([ "$ENTITY_ONCE" = 1 ] && echo "--at-most-once <ent-\d+>" || true)
if [ "$ENTITIES" = 1 ] && [ "$BPE_OPS" -gt 0 ]; then
  echo "ENTITIES=1 needs BPE_OPS=0 (BPE would split the <ent-K> tokens)"; exit 2
fi
ENCODER=${ENCODER:+$(realpath -m "$ENCODER")}
if [ -n "$ENCODER" ]; then  # a converted BERT as the encoder: its own folder of outputs
  for f in model.pt dict.txt; do [ -f "$ENCODER/$f" ] || { echo "ENCODER=$ENCODER has no $f: give the folder" \
    "python -m fairseq_knowgen.convert.hf_bert HF_DIR DIR writes"; exit 2; }; done
  OUT=$OUT/encoder-$(basename "$ENCODER")
  [ "$ARCH" != transformer ] || ARCH=transformer_pretrained_encoder
fi
cd "$ROOT"
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
RUN=$OUT/runs/$NAME
DATA_BIN=$OUT/bin
# ENCODER: bin/ has the target's own dictionary beside the BERT's; an ARCH with the copy head reads bin-one/ (one
# dictionary for both sides)
[ -z "$ENCODER" ] || [[ "$ARCH" != copy_* ]] || DATA_BIN=$OUT/bin-one
mkdir -p "$OUT"
. "$ROOT/examples/lib/stages.sh"

if stage 1; then
  echo "== stage 1: prepare $DATA -> $OUT/raw (held-out categories: $HELDOUT; entity placeholders: $ENTITIES)"
  ent_args=()
  [ "$ENTITIES" = 1 ] && ent_args=(--entity-placeholders --entity-surface "$ENTITY_SURFACE")
  $PY -m fairseq_knowgen.prep.webnlg --data "$DATA" --out "$OUT/raw" --heldout-categories "$HELDOUT" \
    ${ent_args[@]+"${ent_args[@]}"}
fi
[ "$STOP_STAGE" -lt 2 ] || require_stage1
# entmap_of SPLIT: raw/SPLIT.entmap when stage 1 wrote entity placeholders (else nothing)
entmap_of() { [ ! -f "$OUT/raw/$1.entmap" ] || echo "$OUT/raw/$1.entmap"; }
if stage 2; then
  # shellcheck disable=SC2046
  if [ "$BPE_OPS" -gt 0 ] && [ -f "$OUT/raw/train.entmap" ]; then
    echo "$OUT/raw has entity placeholders (ENTITIES=1 in stage 1): BPE_OPS must be 0"; exit 2
  fi
  if [ "$BPE_OPS" -gt 0 ]; then
    echo "== stage 2: joint BPE ($BPE_OPS merges, subword-nmt) -> $OUT/bpe"
    stage_bpe train.src train.tgt $(for s in $(eval_splits); do echo "$s.src $s.tgt"; done)
  else
    # <ent-K> (ENTITIES=1) are always words of the dictionary
    echo "== stage 2: word level, vocabulary = train words seen >= $MIN_COUNT times, others <unk-N> -> $OUT/bpe"
    $PY -m fairseq_knowgen.prep.placeholders encode --train-prefix "$OUT/raw/train" --out-dir "$OUT/bpe" \
      --splits "$OUT/raw/train" $(for s in $(eval_splits); do echo "$OUT/raw/$s"; done) \
      --min-count "$MIN_COUNT" --max-positions 200
  fi
  if [ -n "$ENCODER" ]; then
    echo "== stage 2: the sources as $ENCODER reads them (its WordPiece) -> $OUT/bpe/SPLIT.wp.src"
    # shellcheck disable=SC2046
    stage_wordpiece train.src $(for s in $(eval_splits); do echo "$s.src"; done)
  fi
fi
# placeholder_symbols: the <ent-K> and <unk-N> of bpe/dict.txt, one a line (none with BPE)
placeholder_symbols() { [ ! -f "$OUT/bpe/dict.txt" ] || grep -oE '^<(ent|unk)-[0-9]+>' "$OUT/bpe/dict.txt" || true; }
# need_binarized SPLIT...: DATA_BIN holds the dictionary and each SPLIT (stage 3)
need_binarized() {
  local split
  needs 3 binarize "$DATA_BIN/dict.src.txt"
  for split in "$@"; do needs 3 binarize "$DATA_BIN/$split.src-tgt.src.idx" "$DATA_BIN/$split.src-tgt.tgt.idx"; done
}
if stage 3; then
  for split in train $(eval_splits); do needs 2 encode "$OUT/bpe/$split.src" "$OUT/bpe/$split.tgt"; done
  [ "$BPE_OPS" -gt 0 ] || needs 2 encode "$OUT/bpe/dict.txt"
  echo "== stage 3: fairseq-preprocess -> $OUT/bin (splits: train valid $(extra_splits | xargs))"
  if [ -n "$ENCODER" ]; then  # the BERT's sources: its dictionary grown with <ent-K>; the target's own, or one for both
    # every <ent-K> and <unk-N> of bpe/dict.txt (the splits beyond train may have more than train has)
    into "$OUT/bpe/placeholders.txt" placeholder_symbols
    encoder_dictionary "$OUT/bpe/dict.encoder-src.txt" train.wp.src placeholders.txt
    tgt=()
    [ "$BPE_OPS" -gt 0 ] || tgt=(--tgtdict "$OUT/bpe/dict.txt")  # every <unk-N>, as without ENCODER
    stage_binarize "$OUT/bin" wp.src --separate-dictionaries --srcdict "$OUT/bpe/dict.encoder-src.txt" \
      ${tgt[@]+"${tgt[@]}"}
    wp_names "$OUT/bin"
    if [ "$DATA_BIN" = "$OUT/bin-one" ]; then
      encoder_dictionary "$OUT/bpe/dict.encoder.txt" train.wp.src placeholders.txt train.tgt
      stage_binarize "$DATA_BIN" wp.src --srcdict "$OUT/bpe/dict.encoder.txt"
      wp_names "$DATA_BIN"
    fi
  elif [ "$BPE_OPS" -gt 0 ]; then
    stage_binarize "$DATA_BIN" src
  else
    stage_binarize "$DATA_BIN" src --srcdict "$OUT/bpe/dict.txt"
  fi
  # shellcheck disable=SC2046
  stage_constraints entities "$DATA_BIN" src $(eval_splits)  # every source entity, as encoded (CONSTRAINTS=1)
  # shellcheck disable=SC2046
  [ "$DATA_BIN" = "$OUT/bin" ] || stage_constraints entities "$OUT/bin" src $(eval_splits)
fi
if stage 4; then
  need_binarized train valid
  # fairseq's pointer-generator maps the last K dictionary entries (our <unk-N>) to <unk>: K from the dictionary
  if [[ "$ARCH" == transformer_pointer_generator* ]]; then
    ARCH_ARGS="$($PY -m fairseq_knowgen.prep.position_markers "$DATA_BIN") $ARCH_ARGS"
  fi
  sizes="$LAYERS+$LAYERS layers x $DIM"
  [ -z "$ENCODER" ] || sizes="the encoder of $ENCODER, $LAYERS decoder layers x $DIM"
  echo "== stage 4: train $NAME (--arch $ARCH $ARCH_ARGS; $sizes; $MINUTES min) -> $RUN"
  stage_train
fi
if stage 5; then
  # shellcheck disable=SC2046
  need_binarized $(eval_splits)
  case $CHECKPOINT in best) needs 4 train "$RUN/checkpoints/checkpoint_best.pt" ;;
    *) needs 4 train "$RUN/checkpoints/checkpoint_last.pt" ;; esac
  for split in $(eval_splits); do
    echo "== stage 5: fairseq-generate --beam $BEAM on $split -> $RUN/$split$CONS.out"
    stage_generate "$split" "$RUN/$split$CONS.gen"
    # <unk-N> -> source word N (a no-op with BPE), then <ent-K> -> the surface form of entity K (ENTITIES=1)
    entmap=$(entmap_of "$split")
    $PY -m fairseq_knowgen.prep.placeholders restore --gen "$RUN/$split$CONS.gen" --src "$OUT/raw/$split.src" \
      ${entmap:+--entmap "$entmap"} --out "$RUN/$split$CONS.out"
  done
fi
if stage 6; then
  for split in $(eval_splits); do
    needs 5 "fairseq-generate" "$RUN/$split$CONS.out"
    echo "== stage 6: evaluate $split -> $RUN/$split$CONS.scores.json"
    # copies are counted against the source with its entities (ENTITIES=1: .src has <ent-K>)
    src=$OUT/raw/$split.src
    [ ! -f "$OUT/raw/$split.lex.src" ] || src=$OUT/raw/$split.lex.src
    $PY scripts/evaluate.py --hyp "$RUN/$split$CONS.out" --name "$NAME/$split$CONS" \
      --refs "$OUT/raw/$split.refs.jsonl" --src "$src" --entities "$OUT/raw/$split.entities" --detok moses --no-cider \
      --json-out "$RUN/$split$CONS.scores.json"
  done
fi
