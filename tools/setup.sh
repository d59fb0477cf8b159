#!/usr/bin/env bash
# Installs every Debian package cohort needs and builds it into build/.
# Idempotent: safe to run again; run as root on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libcaf-dev libzmq3-dev cppzmq-dev libgloo-dev libyaml-cpp-dev doctest-dev
  libopenblas-dev libdnnl-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  zlib1g-dev libssl-dev
  dataset-fashion-mnist bible-kjv
  libcpp-httplib-dev prometheus-cpp-dev gnuplot-nox etcd-server
  clang libclang-rt-14-dev procps python3 iproute2
  slurm-wlm slurmctld slurmd munge libhwloc-dev
)
# The references of the benchmarks (PyTorch for tools/bench_vs_torch.py and tools/bench_ddp.py,
# Open MPI for tools/bench_shm_vs_mpi.sh) are only needed for benchmarks:
#   COHORT_BENCH_DEPS=1 tools/setup.sh
if [[ "${COHORT_BENCH_DEPS:-0}" == 1 ]]; then PACKAGES+=(python3-torch openmpi-bin python3-mpi4py); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_TYPE="${COHORT_BUILD_TYPE:-Release}"
echo "setup: packages ready after ${SECONDS} s"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE"
cmake --build build -j"$(nproc)"
echo "setup: built build/cohort after ${SECONDS} s"
