#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup_env.sh), then runs pytest.
#   bash scripts/test.sh [pytest arguments]       # the whole suite (CI runs exactly this)
#   bash scripts/test.sh -m "not slow"            # the quick subset (tests/conftest.py: SLOW_FILES)
# Unless the arguments choose otherwise (-n N, -p no:xdist), the tests run in one pytest-xdist worker per core plus
# one: tests wait on their child processes, on timeouts and on DDP rendezvous, and with one worker per core the cores
# sat idle 10% of the run (207 of 2,105 core-seconds, /proc/stat), with one more 2% (40 of 2,019). A worker takes one
# test file at a time (--dist loadfile: a file's fixtures are built once), the longest files first
# (tests/conftest.py: LONGEST_FIRST). On 2 cores, a clone's second run (after set-up): 16 min 48 s and 18 min 33 s
# (the same work took 10% more CPU time: the machine) with 3 workers,
# 17 min 18 s with 2 (one test failing early, about 60 s of work not done) on 2026-12-07; 20 min 51 s and 21 min 33 s
# the same day before the recipes' set-up check stopped importing fairseq (3-4 s at each of ~60 recipe runs), 18 min
# 16 s and 22 min 36 s on 2026-12-06; one process: about 45 min.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
# (nproc reads OMP_NUM_THREADS as a core count: without it, the cores this process may run on)
parallel=(-n "$(($(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) + 1))" --dist loadfile --no-loadscope-reorder)
for a in "$@"; do
  case $a in -n | -n* | --numprocesses* | no:xdist) parallel=() ;; esac
done
exec .venv/bin/python -m pytest "${parallel[@]}" --durations=20 "$@"
