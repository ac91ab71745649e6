#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup_env.sh), then runs pytest.
#   bash scripts/test.sh [pytest arguments]       # the whole suite (CI runs exactly this)
#   bash scripts/test.sh -m "not slow"            # the quick subset (tests/conftest.py: SLOW_FILES)
# Unless the arguments choose otherwise (-n N, -p no:xdist), the tests run on every core (pytest-xdist -n auto); an
# idle worker takes tests queued for the others (--dist worksteal), so that no long file holds the run up (by file,
# --dist loadfile, the recipe tests alone kept one of two workers busy for 13 minutes: 26.5 minutes in all).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
parallel=(-n auto --dist worksteal)
for a in "$@"; do
  case $a in -n | -n* | --numprocesses* | no:xdist) parallel=() ;; esac
done
exec .venv/bin/python -m pytest "${parallel[@]}" --durations=20 "$@"
