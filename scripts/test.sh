#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup_env.sh), then runs pytest.
#   bash scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest "$@"
