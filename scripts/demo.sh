#!/usr/bin/env bash
# Install what is missing, build, and run the DTensor guide tour as 2 clients of 3 CPU devices:
# sharded tensors on 1-D and 2-D meshes, then DTensor as operands (matmul under three layouts,
# with the expanded programs and their multiply counts) and as output (ones, zeros, stateless
# random through call-with-layout), and a variable refusing a value of another layout.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
dir=$(scripts/build.sh plain)
export OPENBLAS_NUM_THREADS=1
mpiexec.mpich -n 2 "$dir/examples/sharded_tensor"
mpiexec.mpich -n 2 "$dir/examples/dtensor_ops"
