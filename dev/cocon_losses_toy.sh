#!/usr/bin/env bash
# The CoCon toy of docs/methods/cocon.md: does the block keep reading its content once the cycle and adversarial
# losses start? Random-word sentences (40 types, 32-40 words) and a frozen LM trained for one update, which cannot
# predict them: only a block that reads the aligned content column lowers L_self below L_null. The block at layer 0,
# no length jitter, no content mask, 400 updates of Adam 3e-3 (fixed), the package's defaults otherwise; the cycle
# and adversarial losses from update 100. Prints one Markdown row per configuration: the dev gap
# (L_null - L_self) / L_null at update 400, and the adversarial pair's last logged values.
#
#   bash dev/cocon_losses_toy.sh [SEED]      # about 1.5 minutes a row on one core
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:-1}
PY=.venv/bin/python
export OMP_NUM_THREADS=1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
$PY - "$d" <<'PY'
import random, sys
d = sys.argv[1]; rng = random.Random(0); V = [f"w{i}" for i in range(40)]
for split, n in (("train", 3000), ("valid", 200)):
    with open(f"{d}/{split}.txt", "w") as f:
        for _ in range(n):
            f.write(" ".join(rng.choice(V) for _ in range(rng.randint(32, 40))) + "\n")
PY
.venv/bin/fairseq-preprocess --only-source --trainpref "$d/train.txt" --validpref "$d/valid.txt" --destdir "$d/bin" \
  --workers 1 > "$d/pre.log" 2>&1
.venv/bin/fairseq-train "$d/bin" --task language_modeling --arch transformer_lm --decoder-layers 2 \
  --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 2 --tokens-per-sample 64 \
  --sample-break-mode complete --max-tokens 2048 --max-update 1 --optimizer adam --lr 1e-4 --cpu \
  --save-dir "$d/lm" --no-epoch-checkpoints --disable-validation > "$d/lm.log" 2>&1

row() {  # row NAME [fairseq-train args]
  local name=$1; shift
  .venv/bin/fairseq-train "$d/bin" --user-dir fairseq_knowgen --task cocon_generation --arch cocon_lm \
    --cocon-lm-path "$d/lm/checkpoint_last.pt" --cocon-layer 0 --cocon-len-jitter 0 --tokens-per-sample 64 \
    --criterion cocon --cocon-self-mask none --optimizer adam --lr 3e-3 --lr-scheduler fixed --max-tokens 1024 \
    --max-update 400 --cpu --seed "$SEED" --no-save --validate-interval-updates 400 --log-format simple "$@" \
    --save-dir "$d/$name" > "$d/$name.log" 2>&1
  $PY - "$d/$name.log" "$name" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
v = re.findall(r"valid on .*?loss_self ([0-9.]+) \| loss_null ([0-9.]+)", text)[-1]
adv = re.findall(r"loss_adv=([-0-9.e]+), loss_disc=([-0-9.e]+), disc_acc=([0-9.]+)", text)
s, n = map(float, v)
extra = " | ".join(adv[-1]) if adv else " | ".join("-" * 3)
print(f"| {sys.argv[2]} | {(n - s) / n:.3f} | {extra} |")
PY
}
on="--cocon-cycle-start 100 --cocon-adv-start 100"
echo "| configuration (seed $SEED) | gap / L_null at 400 | L_adv | L_disc | disc. accuracy |"
echo "|---|---|---|---|---|"
row "self and null losses only" --cocon-cycle-start 100000 --cocon-adv-start 100000
# shellcheck disable=SC2086
row "every loss from update 100 (the defaults)" $on
# shellcheck disable=SC2086
row "cycle only" $on --cocon-adv-weight 0
# shellcheck disable=SC2086
row "adversarial only" $on --cocon-cycle-weight 0
# shellcheck disable=SC2086
row "every loss, fake side: the block's states (the authors' default)" $on --cocon-adv-fake block
# shellcheck disable=SC2086
row "every loss, block's states, discriminator every update" $on --cocon-adv-fake block --cocon-disc-update-freq 1
# shellcheck disable=SC2086
row "every loss, no detach in the cycle" $on --cocon-cycle-detach-interval 0
