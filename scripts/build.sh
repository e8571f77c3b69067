#!/usr/bin/env bash
# Configure (once) and build one build directory: scripts/build.sh [plain|asan].
#   plain: build/       warnings as errors, CUDA when found
#   asan:  build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, CPU only
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-plain}
case "$kind" in
plain) dir=build; opts=(-Dwerror=true) ;;
asan) dir=build-asan
      opts=(-Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
            -Dbuildtype=debug) ;;
*) echo "usage: $0 [plain|asan]" >&2; exit 2 ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${opts[@]}" >/dev/null
fi
log=$(ninja -C "$dir" 2>&1) || { echo "$log" >&2; exit 1; }
echo "$dir"
