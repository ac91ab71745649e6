#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup_env.sh), then runs pytest.
#   bash scripts/test.sh [pytest arguments]       # the whole suite (CI runs exactly this)
#   bash scripts/test.sh -m "not slow"            # the quick subset (tests/conftest.py: SLOW_FILES)
# Unless the arguments choose otherwise (-n N, -p no:xdist), the tests run on every core (pytest-xdist -n auto), one
# test file per worker at a time (--dist loadfile: a file's fixtures are built once). On 2 cores a fresh clone's suite
# took 26 min 30 s (--dist worksteal: 26 min 45 s; one process: about 45 min): the suite is 44 minutes of CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
parallel=(-n auto --dist loadfile)
for a in "$@"; do
  case $a in -n | -n* | --numprocesses* | no:xdist) parallel=() ;; esac
done
exec .venv/bin/python -m pytest "${parallel[@]}" --durations=20 "$@"
