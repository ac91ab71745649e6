#!/usr/bin/env bash
# The built-in demo: knowledge-to-text generation about people whose names the model has never seen.
# A few minutes on 2 CPU cores, end to end:
#   1 data: 1-3 DBpedia-like triples about a person, rendered by templates (fairseq_knowgen.demo_data);
#     --disjoint-names: every person, city and club name of valid and test is absent from train
#   2 fairseq-preprocess of the words (plain system), in the background while
#   3 the knowledge-aware system's input is made: words outside a fixed vocabulary become position
#     placeholders <unk-N> (python -m fairseq_knowgen.prep.placeholders encode), then fairseq-preprocess
#   4 fairseq-train, both systems at the same time, one core each (OMP_NUM_THREADS=1):
#       plain:  --arch $ARCH (default transformer) on the words themselves;
#       copy:   copy_transformer_small, criterion force_copy --copy-supervision force, over the placeholders
#     same size (2+2 layers, 64 wide), same optimizer, same number of updates
#   5 fairseq-generate --beam 5; the copy model's <unk-N> are restored to source word N (placeholders restore)
#   6 scripts/evaluate.py on both outputs: BLEU-4 and entity recall (the share of the source's subjects and
#     objects that the output mentions, whole-entity matcher); prints samples and a two-row table
#
# Why these two: the plain transformer reads an unseen name as <unk> and cannot write it; the copy model
# over placeholders sees a new name exactly as it saw training names (<unk-N> at the name's position) and
# copies it. Why <unk-N> and not whole-entity placeholders <ent-K> (which work best for WebNLG's unseen
# entities, docs/results/webnlg.md): here names are one or two words, and the renderings name a person a second
# time by the first name alone ("Esme resides in Tromso"), a mention the whole-entity matcher does not find: with
# <ent-K> that first name would stay a vocabulary word that no model can write for an unseen person; with <unk-N>
# it is source word 1. Every name word is a placeholder in train as in test, which is where copying is learned.
# No --at-most-once (the first name is copied twice on purpose) and no entity constraints. The printed table and
# its measured values: README.md, "The demo". Every step is deterministic (fixed seeds, one thread per training,
# dictionaries written in a fixed order), so two runs on one machine print the same table.
#
#   bash scripts/demo.sh [OUT_DIR]          (default: demo_out/)
# Environment: ARCH (the plain system, default transformer), MAX_UPDATE (default 500), SAMPLES (default 6),
#   TRAIN_N=3000 TEST_N=200 (data size; valid has TEST_N inputs too).
# Outputs in OUT_DIR: raw/ (data), {plain,copy}/ (bin/, checkpoints/, train.log, test.gen, test.out),
# scores.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
OUT=${1:-demo_out}
ARCH=${ARCH:-transformer}
MAX_UPDATE=${MAX_UPDATE:-500}
SAMPLES=${SAMPLES:-6}
TRAIN_N=${TRAIN_N:-3000}; TEST_N=${TEST_N:-200}
export OMP_NUM_THREADS=1
PY=.venv/bin/python
BIN=.venv/bin
mkdir -p "$OUT"
start=$(date +%s)

echo "== stage 1: data, test names never seen in training ($OUT/raw)"
$PY -m fairseq_knowgen.demo_data --out "$OUT/raw" --train "$TRAIN_N" --valid "$TEST_N" --test "$TEST_N" \
  --disjoint-names
head -n 1 "$OUT/raw/train.src" "$OUT/raw/test.src"

preprocess() {  # TEXT_DIR DEST [more flags]
  local text=$1 dest=$2
  shift 2
  rm -rf "$dest"
  $BIN/fairseq-preprocess --source-lang src --target-lang tgt --joined-dictionary "$@" \
    --trainpref "$text/train" --validpref "$text/valid" --testpref "$text/test" \
    --destdir "$dest" --workers 1 > "$dest.log" 2>&1 || { echo "fairseq-preprocess failed:"; tail -n 20 "$dest.log"; exit 1; }
}
mkdir -p "$OUT/plain" "$OUT/copy"
echo "== stage 2: fairseq-preprocess for the plain system ($OUT/plain/bin), in the background"
preprocess "$OUT/raw" "$OUT/plain/bin" &
pre_plain=$!

echo "== stage 3: <unk-N> placeholders for the copy model ($OUT/copy/text), fairseq-preprocess ($OUT/copy/bin)"
# vocabulary: words generated from other inputs (templates) and words of >= 1/6 of the sources (markers,
# predicates: about 1/2); names (at most about 1/12 of the sources each) are placeholders in train as in test
$PY -m fairseq_knowgen.prep.placeholders encode --train-prefix "$OUT/raw/train" --out-dir "$OUT/copy/text" \
  --splits "$OUT/raw/train" "$OUT/raw/valid" "$OUT/raw/test" --min-count 2 --min-source-df $((TRAIN_N / 6)) \
  --max-positions 40
head -n 1 "$OUT/copy/text/test.src" "$OUT/copy/text/test.tgt"
preprocess "$OUT/copy/text" "$OUT/copy/bin" --srcdict "$OUT/copy/text/dict.txt"
wait "$pre_plain"

echo "== stage 4: fairseq-train, both at once on one core each ($MAX_UPDATE updates; logs $OUT/{plain,copy}/train.log)"
train() {  # RUN_DIR ARCH [criterion flags]
  local run=$1 arch=$2
  shift 2
  rm -rf "$run/checkpoints"
  $BIN/fairseq-train "$run/bin" --user-dir fairseq_knowgen --cpu --seed 1 --arch "$arch" --share-all-embeddings \
    --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 \
    --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 \
    --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1 "$@" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 3e-3 --lr-scheduler inverse_sqrt \
    --warmup-updates 100 --max-tokens 4096 --max-update "$MAX_UPDATE" \
    --save-dir "$run/checkpoints" --no-epoch-checkpoints --no-progress-bar --log-interval 50 > "$run/train.log" 2>&1
}
train "$OUT/plain" "$ARCH" --criterion label_smoothed_cross_entropy --label-smoothing 0.1 &
plain_pid=$!
train "$OUT/copy" copy_transformer_small --criterion force_copy --copy-supervision force &
copy_pid=$!
failed=0
for run in plain copy; do
  pid=${run}_pid
  if ! wait "${!pid}" || [ ! -f "$OUT/$run/checkpoints/checkpoint_last.pt" ]; then
    echo "training '$run' failed; the end of $OUT/$run/train.log:"
    tail -n 20 "$OUT/$run/train.log"
    failed=1
  else
    last=$(grep -E "valid \| epoch" "$OUT/$run/train.log" | tail -n 1 || true)
    echo "  $run: $(grep -oE "num_updates [0-9]+" <<< "$last" | cut -d' ' -f2) updates," \
      "valid loss $(grep -oE "\| loss [0-9.]+" <<< "$last" | cut -d' ' -f3) (its own criterion)"
  fi
done
[ "$failed" = 0 ] || exit 1

echo "== stage 5: fairseq-generate --beam 5, both at once ($OUT/{plain,copy}/test.out)"
generate() {  # RUN_DIR
  $BIN/fairseq-generate "$1/bin" --user-dir fairseq_knowgen --cpu --gen-subset test \
    --path "$1/checkpoints/checkpoint_last.pt" --beam 5 --batch-size 64 --required-batch-size-multiple 1 \
    > "$1/test.gen" 2> "$1/gen.log" || { echo "fairseq-generate failed on $1:"; tail -n 20 "$1/gen.log"; exit 1; }
}
generate "$OUT/plain" &
gen_plain=$!
generate "$OUT/copy" &
gen_copy=$!
wait "$gen_plain"
wait "$gen_copy"
cp "$OUT/plain/test.gen" "$OUT/plain/test.out"
# <unk-N> -> word N of the raw source line
$PY -m fairseq_knowgen.prep.placeholders restore --gen "$OUT/copy/test.gen" --src "$OUT/raw/test.src" \
  --out "$OUT/copy/test.out"

echo "== stage 6: evaluate ($OUT/scores.json)"
$PY scripts/evaluate.py --hyp "$OUT/plain/test.out" "$OUT/copy/test.out" --name plain copy \
  --refs "$OUT/raw/test.refs.jsonl" --src "$OUT/raw/test.src" --entities "$OUT/raw/test.entities" \
  --detok moses --no-cider --json-out "$OUT/scores.json" > "$OUT/scores.txt" 2> "$OUT/evaluate.log" \
  || { echo "scripts/evaluate.py failed:"; tail -n 20 "$OUT/evaluate.log"; exit 1; }
$PY - "$OUT" "$ARCH" "$SAMPLES" <<'PY'
import json, sys
from fairseq_knowgen.evaluation.report import read_hypotheses

out, arch, samples = sys.argv[1], sys.argv[2], int(sys.argv[3])
src = open(f"{out}/raw/test.src").read().splitlines()
plain, copy = read_hypotheses(f"{out}/plain/test.out"), read_hypotheses(f"{out}/copy/test.out")
print(f"\nsamples (test inputs, all names unseen in training):\n")
for i in range(min(samples, len(src))):
    print(f"  SOURCE {src[i]}\n  plain  {plain[i]}\n  copy   {copy[i]}\n")
scores = json.load(open(f"{out}/scores.json"))
names = {"plain": f"{arch}, words", "copy": "copy_transformer_small force, <unk-N> placeholders"}
print(f"{'system':<55} {'BLEU-4':>7} {'entity recall %':>16} {'exact %':>8}")
for key, name in names.items():
    s = scores[key]
    print(f"{name:<55} {s['bleu4']:>7.2f} {s['entity_recall']:>16.2f} {s['entity_recall_exact']:>8.2f}")
PY
echo "($(wc -l < "$OUT/raw/test.src") test inputs; all scores in $OUT/scores.txt)"
echo "done in $(( $(date +%s) - start )) s (outputs in $OUT/)"
