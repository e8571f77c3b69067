#!/usr/bin/env bash
# Here (the machine without a GPU), in the project's root, once: fills .device/ (git-ignored)
# for the GPU machine: the shared Debian packages (../shared/gpu/prepare.sh) plus what this
# project needs beyond them, parallel HDF5 over MPICH, jansson and SLEEF, and the libraries HDF5
# loads (curl, LDAP, ...), which that machine (Ubuntu 24.04, no network) may lack:
# scripts/gpu_check.sh links those in only where its system has no library of the same name;
# and the wheels of the Python suite's packages beyond numpy and PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
../shared/gpu/prepare.sh
mkdir -p .device/extra/fb
get() { (cd "$1" && apt-get download "${@:2}" 2>&1 | grep -vE '^(Get|Fetched|W: )' || true); }
[ -n "$(ls .device/extra/*.deb 2>/dev/null)" ] ||
    get .device/extra libhdf5-mpich-103-1 libhdf5-mpich-dev libjansson4 libjansson-dev \
        libsleef3 libsleef-dev
[ -n "$(ls .device/extra/fb/*.deb 2>/dev/null)" ] ||
    get .device/extra/fb libaec0 libbrotli1 libcurl4 libffi8 libgmp10 libgnutls30 \
        libgssapi-krb5-2 libhogweed6 libidn2-0 libk5crypto3 libkrb5-3 libkrb5support0 \
        libldap-2.5-0 libnettle8 libnghttp2-14 libp11-kit0 libpsl5 librtmp1 libsasl2-2 libssl3 \
        libsz2 libtasn1-6 libunistring2 libzstd1 libcom-err2 libkeyutils1 libsasl2-modules-db \
        libdb5.3
# The Python suite's own packages (the GPU machine has numpy and PyTorch): wheels for the
# CPython versions that machine may run, installed there into a venv without network.
if [ -z "$(ls .device/wheels/*.whl 2>/dev/null)" ]; then
    mkdir -p .device/wheels
    pip download -q --dest .device/wheels --no-deps pytest iniconfig packaging pluggy ||
        echo "pytest wheels not downloaded: the GPU run will skip the Python suite"
    for v in 3.10 3.11 3.12 3.13; do
        pip download -q --dest .device/wheels --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
            --python-version "$v" ml_dtypes h5py || echo "no ml_dtypes/h5py wheels for Python $v"
    done
fi
echo "prepared .device/ ($(du -sh .device | cut -f1)): run scripts/gpu_check.sh there with .device carried"
