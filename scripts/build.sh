#!/usr/bin/env bash
# Configure (once) and build one build directory: scripts/build.sh [plain|asan|tsan].
#   plain: build/       warnings as errors, CUDA when found
#   asan:  build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, CPU only
#   tsan:  build-tsan/  ThreadSanitizer, CPU only, the library and the threads test only
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-plain}
targets=()
case "$kind" in
plain) dir=build; opts=(-Dwerror=true) ;;
asan) dir=build-asan
      opts=(-Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
            -Dbuildtype=debug) ;;
tsan) dir=build-tsan
      opts=(-Dwerror=true -Db_sanitize=thread -Db_lundef=false -Dcuda=disabled -Dpython=disabled
            -Dbuildtype=debug)
      targets=(tests/mpi/mpi_threads) ;;
*) echo "usage: $0 [plain|asan|tsan]" >&2; exit 2 ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${opts[@]}" >/dev/null
fi
log=$(ninja -C "$dir" "${targets[@]}" 2>&1) || { echo "$log" >&2; exit 1; }
echo "$dir"
