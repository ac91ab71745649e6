#!/usr/bin/env bash
# The built-in demo, end to end on 2 CPU cores in a few minutes:
#   make a small knowledge-to-text data set (triples -> sentences by templates)
#   -> fairseq-preprocess -> fairseq-train --user-dir fairseq_knowgen (transformer_dimattn)
#   -> fairseq-generate (beam 5) -> scripts/evaluate.py, with samples next to references.
#
#   bash scripts/demo.sh [OUT_DIR]          (default: demo_out/)
# Environment: ARCH (default transformer_dimattn), MAX_UPDATE (default 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
OUT=${1:-demo_out}
ARCH=${ARCH:-transformer_dimattn}
MAX_UPDATE=${MAX_UPDATE:-500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=.venv/bin/python
BIN=.venv/bin
mkdir -p "$OUT"
start=$(date +%s)

echo "== stage 1: data ($OUT/raw)"
$PY -m fairseq_knowgen.demo_data --out "$OUT/raw" --train 3000 --valid 200 --test 200
head -n 2 "$OUT/raw/train.src" "$OUT/raw/train.tgt"

echo "== stage 2: fairseq-preprocess ($OUT/bin)"
rm -rf "$OUT/bin"
$BIN/fairseq-preprocess --source-lang src --target-lang tgt --joined-dictionary \
  --trainpref "$OUT/raw/train" --validpref "$OUT/raw/valid" --testpref "$OUT/raw/test" \
  --destdir "$OUT/bin" --workers 1 > "$OUT/preprocess.log" 2>&1

echo "== stage 3: fairseq-train --arch $ARCH ($OUT/checkpoints, log $OUT/train.log)"
rm -rf "$OUT/checkpoints"
$BIN/fairseq-train "$OUT/bin" --user-dir fairseq_knowgen --cpu --seed 1 \
  --arch "$ARCH" --share-all-embeddings \
  --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 \
  --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 \
  --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --lr 3e-3 --lr-scheduler inverse_sqrt \
  --warmup-updates 100 --max-tokens 4096 --max-update "$MAX_UPDATE" \
  --save-dir "$OUT/checkpoints" --no-epoch-checkpoints --no-progress-bar --log-interval 50 \
  2>&1 | tee "$OUT/train.log" | grep -E "train \| epoch|valid \| epoch" || true
[ -f "$OUT/checkpoints/checkpoint_last.pt" ] || { echo "training failed: see $OUT/train.log"; exit 1; }

echo "== stage 4: fairseq-generate --beam 5 ($OUT/gen.out)"
$BIN/fairseq-generate "$OUT/bin" --user-dir fairseq_knowgen --cpu --gen-subset test \
  --path "$OUT/checkpoints/checkpoint_last.pt" --beam 5 --batch-size 64 --required-batch-size-multiple 1 > "$OUT/gen.out" 2>"$OUT/gen.log"

echo "== stage 5: evaluate"
$PY scripts/evaluate.py --hyp "$OUT/gen.out" --name "$ARCH" --refs "$OUT/raw/test.refs.jsonl" \
  --src "$OUT/raw/test.src" --detok moses --json-out "$OUT/scores.json" | tail -n +2
echo
echo "samples (source / output / a reference):"
$PY - "$OUT" <<'PY'
import json, sys
from fairseq_knowgen.evaluation.report import read_hypotheses
out = sys.argv[1]
hyps = read_hypotheses(f"{out}/gen.out")
src = open(f"{out}/raw/test.src").read().splitlines()
refs = [json.loads(x) for x in open(f"{out}/raw/test.refs.jsonl")]
for i in range(5):
    print(f"  SRC {src[i]}\n  OUT {hyps[i]}\n  REF {refs[i][0]}\n")
PY
echo "done in $(( $(date +%s) - start )) s (outputs in $OUT/)"
