#!/usr/bin/env bash
# Install the Python package with pip (meson-python) into build/venv and run its tests as one
# client, under mpiexec.mpich -n 2 and -n 3, and as 3 clients on 2 hosts (scripts/multihost.sh).
# JUnit reports go to build/pytest/.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=build/venv
# meson and the C extension use the system interpreter (docs/ARCHITECTURE.md, toolchain).
[ -x $venv/bin/python ] || /usr/bin/python3 -m venv $venv || exit 1
$venv/bin/pip install -q --disable-pip-version-check numpy ml_dtypes pytest meson-python meson ninja h5py || exit 1
$venv/bin/pip install -q --disable-pip-version-check --no-build-isolation \
    --config-settings=build-dir=build/pywheel . || exit 1
rm -rf build/pytest && mkdir -p build/pytest
export OPENBLAS_NUM_THREADS=1
status=0
run() { # name, launcher...
    local name=$1
    shift
    echo "== pytest: $name"
    # Every rank writes its own report; only rank 0 prints (to the inherited output: reopening
    # /dev/stdout would truncate a log file that output goes to).
    "$@" sh -c 'r=${PMI_RANK:-0}; [ "$r" = 0 ] || exec >/dev/null; exec 2>&1;
        exec '"$venv"'/bin/python -m pytest -q -p no:cacheprovider bindings/python/tests \
            --junitxml=build/pytest/'"$name"'-rank$r.xml' || status=1
}
run singleton
run n2 mpiexec.mpich -n 2
run n3 mpiexec.mpich -n 3
# 3 clients on 2 hosts of network namespaces (scripts/multihost.sh), where they can be made:
# clients 0 and 2 share a host, client 1 is alone on the other (the suite's meshes of 6
# devices take 1, 2 or 3 clients)
if scripts/multihost.sh --check; then
    run hosts2 scripts/multihost.sh -H 2 -n 3
else
    echo "== pytest: hosts2 skipped (no namespace hosts here)"
fi
exit $status
