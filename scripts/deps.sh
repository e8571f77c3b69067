#!/usr/bin/env bash
# Install the system packages dtensor needs (Debian 12, as root); a no-op when all are there.
set -euo pipefail
pkgs=(gcc libc6-dev meson ninja-build pkg-config libmpich-dev mpich libhwloc-dev hwloc
      libcriterion-dev libopenblas-dev librandom123-dev libjansson-dev python3-dev python3-venv
      # vectorized float functions (SLEEF) of the CPU kernels
      libsleef-dev
      # checkpoints: parallel HDF5 over MPICH's MPI-IO (pkg-config hdf5-mpich), h5dump
      libhdf5-mpich-dev hdf5-tools
      # clang and its libFuzzer runtime for scripts/fuzz.sh
      clang libclang-rt-14-dev
      # scripts/multihost.sh: hosts made of network namespaces (ip netns, veth, bridge)
      iproute2
      # ScaLAPACK baseline of benchmarks/ (optional there). It pulls in OpenMPI, which takes
      # the plain mpiexec/mpicc names; mpiexec.mpich and pkg-config mpich keep working.
      libscalapack-mpich-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
