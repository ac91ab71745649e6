#!/usr/bin/env bash
# EKI (Fan et al., "An Enhanced Knowledge Injection Model for Commonsense Generation", COLING 2020) on CommonGen or on
# your own data in CommonGen's layout: examples/commongen/run.sh's stages with EKI's settings (eki_transformer on
# concepts <sep> retrieved prototype, task eki_generation, criterion eki_label_smoothed_cross_entropy with label
# smoothing 0.1 and lambda 1), as the EKI row of docs/results/commongen.md was trained. Staged; rerun from any stage.
#
#   bash examples/eki/run.sh DATA_DIR [OUT_DIR] [CORPUS_OOD]
#       DATA_DIR:   commongen.{train,dev}.src_alpha.txt (space-separated concepts, one set a line) and
#                   commongen.{train,dev}.tgt.txt (one sentence a line, line-aligned; required)
#       OUT_DIR:    everything this recipe writes (default work/eki); the model in OUT_DIR/runs/eki
#       CORPUS_OOD: plain text for out-of-domain prototypes (default: none; INPUT=eki-ood trains on them)
#   Stages and every other variable (NAME, MINUTES=60, STAGE/STOP_STAGE, DECODE_ARGS...): examples/commongen/run.sh.
#   Examples:
#       bash examples/eki/run.sh DATA OUT                                     # everything: data, train, decode, score
#       NAME=eki-copy ARCH_ARGS=--copy CRITERION=eki_force_copy \
#           CRITERION_ARGS="--copy-supervision force --eki-lambda 1" STAGE=5 bash examples/eki/run.sh DATA OUT
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
usage() { { echo "usage:"; sed -n '/^#   bash examples/,/^#   [A-Z]/p' "$0" | sed '$d; s/^#//'; } >&2; exit 2; }
[ $# -ge 1 ] || usage
export NAME=${NAME:-eki} INPUT=${INPUT:-eki} ARCH=${ARCH:-eki_transformer}
export TASK_ARGS=${TASK_ARGS:-"--task eki_generation"} CRITERION=${CRITERION:-eki_label_smoothed_cross_entropy}
export CRITERION_ARGS=${CRITERION_ARGS:-"--label-smoothing 0.1 --eki-lambda 1"}
# the command a stage's error tells to rerun is this recipe's (examples/lib/stages.sh: needs)
export RECIPE_COMMAND="bash $ROOT/examples/eki/run.sh$(printf ' %q' "$@")"
exec bash "$ROOT/examples/commongen/run.sh" "$1" "${2:-$ROOT/work/eki}" ${3:+"$3"}
