#!/usr/bin/env bash
# Packs a CUDA build for a GPU machine that cannot build it (docs/gpu.md, "Running the check
# on a GPU machine"): the binaries tools/gpu_check.sh runs, every shared library they need
# that such a machine may lack, the configs and the KJV text, as one xz tarball. Leaves out
# glibc, libstdc++/libgcc_s (the GPU machine's own are newer; copies travel as a fallback)
# and the CUDA libraries (cudart, cuBLAS, NCCL: hundreds of MB; gpu_check.sh finds them).
# Does not run anything on a GPU; tools/gpu_check.sh --bundle does.
#
#   tools/gpu_bundle.sh [--build DIR] [--out DIR]
#
# --build: a CUDA build (COHORT_GPU=ON) with cohort and the GPU tests built (default build).
# --out: where cohort-bundle.tar.xz and its MANIFEST go (default .devbundle; a folder inside
# the repository is added to .git/info/exclude, so the device tool carries it only by name).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=build out=.devbundle
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "gpu_bundle.sh: $*" >&2; exit 1; }

# The binaries gpu_check.sh runs, found wherever the build put them.
tests=(test_gpu_device test_gpu_kernels test_comm_nccl test_comm_nccl_elastic test_comm_fake_device)
[[ -x $build/cohort ]] || die "$build/cohort not found: build it first (cmake --build $build --target cohort ${tests[*]})"
grep -q '^COHORT_GPU:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null ||
  die "$build is not a CUDA build (configure it with -DCOHORT_GPU=ON)"
bins=("$build/cohort")
for t in "${tests[@]}"; do
  p=$(find "$build" -path '*/CMakeFiles' -prune -o -type f -name "$t" -perm -u+x -print | head -1)
  [[ -n $p ]] || die "$t not found under $build: cmake --build $build --target $t"
  bins+=("$p")
done
ldd "$(printf '%s\n' "${bins[@]}" | grep /test_gpu_kernels)" | grep -q libcudart ||
  die "test_gpu_kernels does not link libcudart: $build was configured without nvcc"

# Libraries that stay behind: glibc's own (they must match the GPU machine's libc exactly:
# GLIBC_PRIVATE), the C++ runtime (fallback copies below) and CUDA's (found there).
glibc_re='^(ld-linux[^ ]*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libmvec)\.so'
cxx_re='^(libstdc\+\+|libgcc_s)\.so'
cuda_re='^(libcudart|libcublas|libcublasLt|libnccl|libcuda)\.so'

stage=$(mktemp -d "${TMPDIR:-/tmp}/cohort-bundle-stage.XXXXXX") || exit 1
trap 'rm -rf "$stage"' EXIT
root=$stage/cohort-bundle
mkdir -p "$root"/{bin,lib,lib-fallback,configs,data/kjv} || exit 1
cp "${bins[@]}" "$root/bin/" || exit 1
declare -A seen=()
while read -r name path; do
  [[ -n ${seen[$name]:-} ]] && continue
  seen[$name]=1
  if [[ $name =~ $glibc_re || $name =~ $cuda_re ]]; then continue; fi
  [[ $path == /* ]] || die "$name: ldd found no file for it here ($path)"
  if [[ $name =~ $cxx_re ]]; then
    cp -L "$path" "$root/lib-fallback/$name" || exit 1
  else
    cp -L "$path" "$root/lib/$name" || exit 1
  fi
done < <(for b in "${bins[@]}"; do ldd "$b"; done | awk '$2 == "=>" { print $1, $3 }')

# What the GPT runs read: the configs, and the KJV text exactly as the kjv loader caches it
# (runtime/data/kjv.hpp: `bible -l0` over kjv::bible_range, file kjv::cache_name), so
# data.cache_dir=<bundle>/data/kjv makes the loader read it and never run `bible`.
cp configs/*.yaml "$root/configs/" || exit 1
command -v bible >/dev/null || die "'bible' not found: apt-get install bible-kjv"
bible -l0 'Gen1:1-Rev22:21' >"$root/data/kjv/kjv.txt" || die "bible -l0 failed"

# What this bundle can do, read off the binary (the GPU machine cannot ask the source).
has() { "$root/bin/cohort" "$@" >/dev/null 2>&1 && echo yes || echo no; }
train_device=$(has validate configs/kjv_gpt.yaml --set train.device=cpu --set train.precision=fp32)
bench_device=$("$root/bin/cohort" bench train --help 2>/dev/null | grep -q -- '--device' && echo yes || echo no)
{
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "build: $build ($(grep -m1 '^CMAKE_BUILD_TYPE:' "$build/CMakeCache.txt" | cut -d= -f2)," \
    "CUDA architectures $(grep -m1 '^CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" | cut -d= -f2))"
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo unknown)"
  echo "glibc needed: $(for b in "$root"/bin/* "$root"/lib/*; do objdump -T "$b"; done 2>/dev/null |
    grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
  echo "train.device/train.precision: $train_device"
  echo "bench train --device: $bench_device"
} >"$root/MANIFEST"
[[ $train_device == yes ]] ||
  echo "gpu_bundle.sh: warning: this cohort has no train.device / train.precision: the GPT device runs will be skipped" >&2
[[ $bench_device == yes ]] ||
  echo "gpu_bundle.sh: warning: this cohort's bench train has no --device: the device benches will be skipped" >&2

# Check: unpacked alone, every library resolves into the bundle (or is glibc, the C++
# runtime or CUDA's). A clean environment, so nothing of this shell's paths helps.
bad=$(for b in "$root"/bin/*; do
  env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$root/lib" ldd "$b" | awk -v b="${b##*/}" '$2 == "=>" { print b, $1, $3 }'
done | while read -r b name path; do
  [[ $name =~ $glibc_re || $name =~ $cxx_re || $name =~ $cuda_re ]] && continue
  [[ $path == "$root/lib/"* ]] || echo "$b: $name -> $path"
done)
[[ -z $bad ]] || die "libraries resolved outside the bundle:"$'\n'"$bad"

mkdir -p "$out" || exit 1
tar -C "$stage" -cf - cohort-bundle | xz -T0 -6 >"$out/cohort-bundle.tar.xz.tmp" &&
  mv "$out/cohort-bundle.tar.xz.tmp" "$out/cohort-bundle.tar.xz" || die "packing failed"
cp "$root/MANIFEST" "$out/MANIFEST" || exit 1

# A folder inside the repository stays out of git (the device tool then carries it only
# when named in carry).
top=$(git rev-parse --show-toplevel 2>/dev/null)
abs_out=$(cd "$out" && pwd -P)
if [[ -n $top && $abs_out == "$(cd "$top" && pwd -P)/"* ]]; then
  line="/${abs_out#"$(cd "$top" && pwd -P)/"}/"
  exclude=$(git rev-parse --git-common-dir)/info/exclude
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "$line" "$exclude" 2>/dev/null || echo "$line" >>"$exclude"
fi

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
size() { du -sb "$@" | awk '{ s += $1 } END { print s }'; }
echo "bundle: $out/cohort-bundle.tar.xz $(mib "$(stat -c %s "$out/cohort-bundle.tar.xz")")" \
  "(unpacked $(mib "$(size "$root")"): bin $(mib "$(size "$root/bin")"), lib $(ls "$root/lib" | wc -l) files" \
  "$(mib "$(size "$root/lib")"), lib-fallback $(mib "$(size "$root/lib-fallback")")," \
  "data $(mib "$(size "$root/data")"), configs $(mib "$(size "$root/configs")"))"
sed 's/^/  /' "$root/MANIFEST"
