#!/usr/bin/env bash
# Here (the machine without a GPU), in the project's root, once: fills .device/ (git-ignored)
# for the GPU machine, which has CUDA, cuBLAS, NCCL, meson, ninja, numpy and PyTorch (Ubuntu
# 24.04, no network) but none of the Debian packages the project builds against. Into
# .device/debs the packages of the build (MPICH and UCX, hwloc, OpenBLAS, Criterion, Random123,
# pkgconf, parallel HDF5 over MPICH, jansson, SLEEF) with the libraries they load, which
# scripts/gpu_env.sh unpacks under /opt/deb there; into .device/extra/fb the libraries HDF5
# loads (curl, LDAP, ...), which scripts/gpu_check.sh links in only where that system has no
# library of the same name.
set -euo pipefail
cd "$(dirname "$0")/.."
get() { (cd "$1" && apt-get download "${@:2}" 2>&1 | grep -vE '^(Get|Fetched|W: )' || true); }
mkdir -p .device/debs
[ -n "$(ls .device/debs/libsleef-dev_*.deb 2>/dev/null)" ] || {
    apt-get update -qq >/dev/null 2>&1 || true
    get .device/debs mpich libmpich12 libmpich-dev libhwloc15 libhwloc-dev hwloc \
        libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libopenblas0 libcriterion3 \
        libcriterion-dev librandom123-dev pkgconf pkgconf-bin libpkgconf3 libgfortran5 \
        libquadmath0 libgit2-1.5 libhttp-parser2.9 libmbedcrypto7 libmbedtls14 libmbedx509-1 \
        libnanomsg5 libnuma1 libslurm38 libssh2-1 libucx0 libibverbs1 librdmacm1 libnl-3-200 \
        libnl-route-3-200 libltdl7 libboxfort-dev libhdf5-mpich-103-1 libhdf5-mpich-dev \
        libjansson4 libjansson-dev libsleef3 libsleef-dev
}
mkdir -p .device/extra/fb
[ -n "$(ls .device/extra/fb/*.deb 2>/dev/null)" ] ||
    get .device/extra/fb libaec0 libbrotli1 libcurl4 libffi8 libgmp10 libgnutls30 \
        libgssapi-krb5-2 libhogweed6 libidn2-0 libk5crypto3 libkrb5-3 libkrb5support0 \
        libldap-2.5-0 libnettle8 libnghttp2-14 libp11-kit0 libpsl5 librtmp1 libsasl2-2 libssl3 \
        libsz2 libtasn1-6 libunistring2 libzstd1 libcom-err2 libkeyutils1 libsasl2-modules-db \
        libdb5.3
# No Python wheels: the GPU machine's python3 (3.12) already has numpy, PyTorch, pytest,
# ml_dtypes and h5py, and the device tool carries at most 64 MiB with the working tree (wheels
# for four CPython versions made .device/ 82 MB, too large to carry). Those of an earlier run go.
rm -rf .device/wheels
size=$(du -sm .device | cut -f1)
if ((size > 56)); then
    echo "prepared .device/ is ${size} MiB: with the working tree it exceeds what one call carries (64 MiB)" >&2
    exit 1
fi
echo "prepared .device/ (${size} MiB): run scripts/gpu_check.sh there with .device carried"
