#!/usr/bin/env bash
# Install what is missing, build, and run the DTensor guide tour as 2 clients of 3 CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
dir=$(scripts/build.sh plain)
export OPENBLAS_NUM_THREADS=1
exec mpiexec.mpich -n 2 "$dir/examples/sharded_tensor"
