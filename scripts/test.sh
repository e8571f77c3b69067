#!/usr/bin/env bash
# Install what is missing, build (plain and ASan+UBSan), run every test suite in both builds.
# Ends with the line "N passed, N failed" (counted over every test of both builds).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh || exit 1
export OPENBLAS_NUM_THREADS=1
# MPICH and UCX keep some allocations until exit; leaks of the library itself still fail.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
# hwloc's PCI plugin (libpciaccess), which MPICH loads, leaks and is unloaded before LSan can
# name it; dtensor needs no PCI discovery from hwloc.
export HWLOC_PLUGINS_BLACKLIST=hwloc_pci
status=0
for kind in plain asan; do
    dir=$(scripts/build.sh "$kind") || { echo "build ($kind) failed"; exit 1; }
    # no call or include up a floor (docs/ARCHITECTURE.md, "The floors"); the plain build has
    # every object, CUDA's included
    if [ "$kind" = plain ]; then scripts/check_layers.sh "$dir" || status=1; fi
    echo "== tests: $dir"
    # Suite 'multihost' (clients on several hosts made of network namespaces, MPICH over TCP)
    # runs in the plain build; under ASan the by-host paths run through DTENSOR_AGREE_HOSTS=2.
    skip=()
    [ "$kind" = asan ] && skip=(--no-suite multihost)
    meson test -C "$dir" --print-errorlogs --num-processes 2 "${skip[@]}" || status=1
done
# The API from several threads under ThreadSanitizer (one program, no launcher, CPU only).
# UCX, which MPICH loads, replaces madvise with a hook that takes a lock; glibc calls it as a
# thread exits, after ThreadSanitizer has dropped the thread's state, and the interceptor
# crashes: UCX_MEM_EVENTS=no leaves madvise alone (dtensor registers no memory with UCX).
if dir=$(scripts/build.sh tsan); then
    echo "== tests: $dir"
    UCX_MEM_EVENTS=no TSAN_OPTIONS="halt_on_error=1" \
        meson test -C "$dir" --no-rebuild --print-errorlogs threads_n0 || status=1
else
    echo "build (tsan) failed"
    status=1
fi
scripts/pytest.sh || status=1
# the parsers under libFuzzer for a bounded time (a crash fails the run; not counted as tests)
scripts/fuzz.sh 20 || { echo "fuzzing found a failure"; status=1; }
python3 - build build-asan build-tsan <<'PY' || status=1
import glob, json, os, sys
import xml.etree.ElementTree as ET
passed = failed = skipped = 0
# pytest runs: a test counts once per run (rank 0's report); it fails if any rank failed it.
for run in sorted({os.path.basename(p).split("-rank")[0]
                   for p in glob.glob("build/pytest/*-rank*.xml")}):
    verdict = {}
    for report in glob.glob(f"build/pytest/{run}-rank*.xml"):
        for case in ET.parse(report).getroot().iter("testcase"):
            key = (case.get("classname"), case.get("name"))
            bad = case.find("failure") is not None or case.find("error") is not None
            skip = case.find("skipped") is not None
            verdict[key] = "failed" if bad or verdict.get(key) == "failed" else \
                ("skipped" if skip else "passed")
    for v in verdict.values():
        passed += v == "passed"
        failed += v == "failed"
        skipped += v == "skipped"
for d in sys.argv[1:]:
    log = f"{d}/meson-logs/testlog.json"
    if not os.path.exists(log):
        continue
    for line in open(log):
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or not passed else 0)
PY
exit $status
