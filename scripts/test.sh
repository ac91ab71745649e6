#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup_env.sh), then runs pytest.
#   bash scripts/test.sh [pytest arguments]       # the whole suite (CI runs exactly this)
#   bash scripts/test.sh -m "not slow"            # the quick subset (tests/conftest.py: SLOW_FILES)
# Unless the arguments choose otherwise (-n N, -p no:xdist), the tests run on every core (pytest-xdist -n auto), one
# test file per worker at a time (--dist loadfile: a file's fixtures are built once). On 2 cores a fresh clone's suite
# took 18 min 16 s and 22 min 36 s in two runs of the same code, the machine ~25% slower in the second (26 min 30 s
# before the text tools stopped importing fairseq and the CommonGen recipe tests shared their data stages; one
# process: about 45 min).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
parallel=(-n auto --dist loadfile --no-loadscope-reorder)
for a in "$@"; do
  case $a in -n | -n* | --numprocesses* | no:xdist) parallel=() ;; esac
done
exec .venv/bin/python -m pytest "${parallel[@]}" --durations=20 "$@"
