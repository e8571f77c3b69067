#!/usr/bin/env bash
# Fuzz the parsers (layout text, mesh descriptions, TF_CONFIG / DTENSOR_CLUSTER) and the Python
# extension's argument converters with libFuzzer for a bounded time: scripts/fuzz.sh [seconds
# per target, default 20]. The library is built with clang under AddressSanitizer,
# UndefinedBehaviorSanitizer and fuzzing coverage in build-fuzz/; the seed corpora are
# tests/fuzz/corpus/*, grown in a scratch copy. A crash, a sanitizer report, a leak or a timeout
# fails it (libFuzzer writes the input to build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
dir=build-fuzz
if [ ! -f "$dir/build.ninja" ]; then
    CC=clang meson setup "$dir" -Dcuda=disabled -Dpython=disabled -Dtests=false \
        -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug \
        -Dc_args=-fsanitize=fuzzer-no-link >/dev/null
fi
ninja -C "$dir" libdtensor_core.a >/dev/null
libs=$(pkg-config --libs mpich hwloc openblas jansson hdf5-mpich sleef)
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export ASAN_OPTIONS="detect_leaks=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export HWLOC_PLUGINS_BLACKLIST=hwloc_pci OPENBLAS_NUM_THREADS=1
status=0
for target in layout mesh cluster python; do
    exe="$dir/fuzz_$target"
    extra=() leaks=1
    if [ "$target" = python ]; then
        # the extension module itself, embedded in the system interpreter; the interpreter's
        # own allocations outlive the run, so leak checks are off for this target
        # shellcheck disable=SC2207 # flags split on purpose
        extra=(bindings/python/dtensor/_dtensor*.c $(pkg-config --cflags --libs python3-embed))
        leaks=0
    fi
    # shellcheck disable=SC2086 # $libs is a list of flags
    clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude "tests/fuzz/fuzz_$target.c" \
        "${extra[@]}" "$dir/libdtensor_core.a" $libs -lm -lpthread -o "$exe"
    corpus=$(mktemp -d)
    cp tests/fuzz/corpus/"$target"/* "$corpus"/
    echo "== fuzz $target: $secs s"
    if ! (cd "$dir" && ASAN_OPTIONS="detect_leaks=$leaks" "../$exe" -max_total_time="$secs" \
              -timeout=10 -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 "$corpus" 2>&1 |
              tail -4); then
        status=1
    fi
    rm -rf "$corpus"
done
exit $status
