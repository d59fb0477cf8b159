#!/usr/bin/env bash
# The one prepared check for a GPU machine (docs/gpu.md, "tools/gpu_check.sh"). Two ways to
# get the binaries: build them here (configure with CUDA + NCCL, build the GPU tests and
# cohort), or --bundle: unpack what tools/gpu_bundle.sh packed on a machine that has the
# Debian dependencies, and find the CUDA libraries (cudart, cuBLAS, NCCL) on this one.
# Then: the CPU parts (test_gpu_device, the elastic NCCL tables, the fake device
# communicator), the CUDA kernel twins (test_gpu_kernels), the single-rank NCCL tests
# (test_comm_nccl); the GPT on the device in fp32 (twice: are the curves bit-identical?) and
# bf16, each against the CPU run of the same config and steps; `cohort bench train` on the
# device. One summary table (step, result, seconds, figures); exit 1 if a step failed.
# Without a device the GPU steps report "skipped" with their reason; on a machine whose
# nvidia-smi lists a GPU, a GPU test that skips is a failure.
#
#   tools/gpu_check.sh [--build DIR] [--scope gpu|all] [--jobs N] [--arch SM]
#   tools/gpu_check.sh --bundle DIR          (DIR: .devbundle, or an unpacked cohort-bundle)
#   options of both: [--steps N] [--fp32-rtol R] [--bf16-rtol R] [--budget S]
#
# --scope gpu builds only the test targets (what a 2-core machine can afford; no cohort, so
# no GPT runs); all (the default) also builds DIR/cohort. --budget: seconds for all steps
# together (default 450); each step's timeout is capped by what is left. Logs: $OUT/gpu_check/
# (one logs.tar.gz and summary.txt) when OUT is set, else DIR/gpu_check/ (DIR: the build or
# bundle folder).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=build-gpu scope=all jobs=$(nproc) arch=90 bundle=
root='' bin='' tbin='' kjv=''
steps_gpt=300 fp32_rtol=1e-3 bf16_rtol=2e-2 budget=450
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --scope) scope=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --steps) steps_gpt=$2; shift 2 ;;
    --fp32-rtol) fp32_rtol=$2; shift 2 ;;
    --bf16-rtol) bf16_rtol=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -h|--help) sed -n 2,23p "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$scope" in gpu|all) ;; *) echo "gpu_check.sh: --scope '$scope': use gpu or all" >&2; exit 2 ;; esac
for n in "$steps_gpt" "$budget"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: '$n' is not a positive whole number" >&2; exit 2; }
done
[[ -z $bundle || -d $bundle ]] ||
  { echo "gpu_check.sh: --bundle $bundle: no such folder (make it with tools/gpu_bundle.sh)" >&2; exit 2; }
for r in "$fp32_rtol" "$bf16_rtol"; do
  awk -v r="$r" 'BEGIN { exit !(r + 0 > 0) }' ||
    { echo "gpu_check.sh: tolerance '$r' is not a positive number" >&2; exit 2; }
done

tmps=()  # what this run unpacked or wrote outside the repository: gone at exit
trap 'rm -rf "${tmps[@]}"' EXIT
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
start=$(now)
# Seconds a step may take: its own limit, capped by what is left of the budget.
limit() { awk -v l="$1" -v b="$budget" -v a="$start" -v n="$(now)" \
  'BEGIN { r = int(b - (n - a)); print (r < l ? r : l) }'; }

# Where the logs go while steps run; packed for $OUT at the end.
if [[ -n $bundle ]]; then logs=$bundle/gpu_check; else logs=$build/gpu_check; fi
if [[ -n ${OUT:-} ]]; then
  tmps+=("$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")") || exit 2
  logs=${tmps[-1]}/gpu_check
fi
rm -rf "$logs" && mkdir -p "$logs" || exit 2

steps=() results=() secs=() notes=()
failed=0
record() {  # step result seconds note
  steps+=("$1") results+=("$2") secs+=("$3") notes+=("${4//|/,}")  # a table cell: no pipes
  [[ $2 == FAIL ]] && failed=1
  printf '[gpu_check] %-20s %-8s %6ss  %s\n' "$1" "$2" "$3" "$4"
}

# Is there a GPU? nvidia-smi is the driver's own tool; the tests decide for themselves
# (exit 77), this only turns a skip into a failure where a GPU is listed.
# (A driver mounted under /usr/local/nvidia may be off the PATH.)
gpus=0
smi=$(command -v nvidia-smi || ls /usr/local/nvidia/bin/nvidia-smi 2>/dev/null)
[[ -n $smi ]] && gpus=$("$smi" -L 2>/dev/null | grep -c '^GPU ' || true)
device_note="no GPU listed (nvidia-smi ${smi:+lists none}${smi:-absent})"
if ((gpus > 0)); then
  device_note="$gpus GPU(s): $("$smi" -L | head -1), driver $("$smi" --query-gpu=driver_version --format=csv,noheader | head -1)"
  "$smi" -L
fi
echo "[gpu_check] $device_note"

# The binaries and what they need: bin (cohort, tests), ldpath (for them only: the bundle's
# Debian libraries must not leak into python3 or the system tools), kjv (data.cache_dir).
ldpath=${LD_LIBRARY_PATH:-}
if [[ -n $bundle ]]; then
  # 1. Unpack: an unpacked bundle is used as is.
  t=$(now)
  if [[ -f $bundle/MANIFEST && -d $bundle/bin ]]; then
    root=$bundle
    record unpack pass "$(elapsed "$t")" "already unpacked: $root"
  elif [[ -f $bundle/cohort-bundle.tar.xz ]]; then
    dest=$(mktemp -d "${TMPDIR:-/tmp}/cohort-bundle.XXXXXX") || exit 2
    tmps+=("$dest")
    tarball=$bundle/cohort-bundle.tar.xz
    # xz may be missing from a minimal image; python3's tarfile reads xz without it.
    if command -v xz >/dev/null 2>&1; then
      tar -C "$dest" -xJf "$tarball" 2>"$logs/unpack.log"
    else
      python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}))' \
        "$tarball" "$dest" 2>"$logs/unpack.log"
    fi
    root=$dest/cohort-bundle
    if [[ -f $root/MANIFEST ]]; then
      record unpack pass "$(elapsed "$t")" "$(du -sm "$root" | cut -f1) MiB into $root"
    else
      record unpack FAIL "$(elapsed "$t")" "$tarball did not unpack (see $logs/unpack.log)"
    fi
  else
    record unpack FAIL 0 "$bundle holds neither cohort-bundle.tar.xz nor an unpacked bundle (run tools/gpu_bundle.sh)"
  fi
  if ((failed == 0)); then
    sed 's/^/[gpu_check] bundle /' "$root/MANIFEST"
    bin=$root/bin tbin=$root/bin kjv=$root/data/kjv
    ldpath=$root/lib${ldpath:+:$ldpath}
    # 2. The CUDA libraries this machine has: the toolkit's first, then the system's, then
    # the Python wheels' (PyTorch's nvidia-* packages). cuBLAS and cuBLASLt from one folder.
    t=$(now)
    site=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
    mapfile -t where < <( (ls -d /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/local/cuda*/targets \
      /usr/lib/x86_64-linux-gnu 2>/dev/null; echo "$site"; ls -d /usr/local/lib /usr/local/nvidia /opt 2>/dev/null) | grep .)
    cands=$(timeout 30 find -H "${where[@]}" -maxdepth 10 \( -name 'libcudart.so.13' \
      -o -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' -o -name 'libnccl.so.2' \
      -o -name 'libcuda.so.1' \) 2>/dev/null | awk '!seen[$0]++')
    pick() { grep "/$1\$" <<<"$cands" | head -1; }
    cudart=$(pick libcudart.so.13) cublas=$(pick libcublas.so.13) nccl=$(pick libnccl.so.2)
    cublaslt=
    [[ -n $cublas && -e ${cublas%/*}/libcublasLt.so.13 ]] && cublaslt=${cublas%/*}/libcublasLt.so.13
    [[ -z $cublaslt ]] && cublaslt=$(pick libcublasLt.so.13)
    cudadirs=
    for f in "$cudart" "$cublas" "$cublaslt" "$nccl"; do
      [[ -n $f && :$cudadirs: != *":${f%/*}:"* ]] && cudadirs=${cudadirs:+$cudadirs:}${f%/*}
    done
    # The driver's libcuda.so.1: the loader must find it (cudart and NCCL open it by name).
    libcuda=$(pick libcuda.so.1)
    if [[ -n $libcuda ]] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' &&
       [[ :${LD_LIBRARY_PATH:-}: != *":${libcuda%/*}:"* ]]; then
      cudadirs=${cudadirs:+$cudadirs:}${libcuda%/*}
    fi
    ldpath=$root/lib${cudadirs:+:$cudadirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    nccl_version=unknown
    if [[ -n $nccl ]]; then
      nccl_version=$(python3 -c 'import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print("%d.%d.%d" % (v.value // 10000, v.value // 100 % 100, v.value % 100))' "$nccl" 2>/dev/null || echo unknown)
    fi
    found="cudart ${cudart:-MISSING}, cublas ${cublas:-MISSING}, cublasLt ${cublaslt:-MISSING}, nccl ${nccl:-MISSING} (NCCL $nccl_version), driver ${libcuda:-libcuda.so.1 not found}"
    echo "$cands" >"$logs/cuda_libs.log"
    if [[ -n $cudart && -n $cublas && -n $cublaslt && -n $nccl ]]; then
      record cuda_libs pass "$(elapsed "$t")" "$found"
    elif ((gpus > 0)); then
      record cuda_libs FAIL "$(elapsed "$t")" "$found"
    else
      record cuda_libs skipped "$(elapsed "$t")" "no GPU listed; $found"
    fi
    # 3. Does every binary find every library? A libstdc++ older than the bundle's build
    # needs (GLIBCXX version not found) takes the carried copy instead.
    t=$(now)
    lddall() { for b in "$bin"/*; do LD_LIBRARY_PATH=$ldpath ldd "$b" 2>&1 | sed "s|^|${b##*/}: |"; done; }
    lddall >"$logs/ldd.log"
    if grep -qE "version .(GLIBCXX|CXXABI|GCC)_[^ ]* not found" "$logs/ldd.log"; then
      ldpath=$root/lib-fallback:$ldpath
      lddall >"$logs/ldd.log"
      cxx_note="the system libstdc++ is too old: using the bundle's"
    else
      cxx_note="the system's libstdc++"
    fi
    missing=$(grep -E 'not found' "$logs/ldd.log" | sort -u)
    if [[ -z $missing ]]; then
      record ldd pass "$(elapsed "$t")" "every library found; $cxx_note"
    elif ((gpus == 0)) && ! grep -vqE 'lib(cudart|cublas|cublasLt|nccl|cuda)\.so' <<<"$missing"; then
      record ldd skipped "$(elapsed "$t")" "no GPU listed; CUDA libraries missing: $(echo "$missing" | awk '{ print $2 }' | sort -u | xargs)"
    else
      record ldd FAIL "$(elapsed "$t")" "$(echo "$missing" | head -3 | xargs)"
    fi
  fi
else
  bin=$build tbin=
  # 1. Configure with CUDA. A build without nvcc or NCCL cannot check anything here.
  t=$(now)
  if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOHORT_GPU=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$logs/configure.log" 2>&1; then
    if grep -q 'CUDA build of gpu/: ON' "$logs/configure.log" &&
       grep -q 'NCCL backend: ON' "$logs/configure.log"; then
      record configure pass "$(elapsed "$t")" "CUDA + NCCL, sm_$arch"
    else
      record configure FAIL "$(elapsed "$t")" "CUDA or NCCL not found (see $logs/configure.log)"
    fi
  else
    record configure FAIL "$(elapsed "$t")" "cmake failed (see $logs/configure.log)"
  fi
  # 2. Build: the checks' targets, and the cohort binary with --scope all.
  targets=(test_gpu_device test_gpu_kernels test_comm_nccl test_comm_nccl_elastic test_comm_fake_device)
  [[ $scope == all ]] && targets+=(cohort)
  if ((failed == 0)); then
    t=$(now)
    if nice cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$logs/build.log" 2>&1; then
      record build pass "$(elapsed "$t")" "${targets[*]}"
    else
      record build FAIL "$(elapsed "$t")" "$(grep -m1 -E 'error|FAILED' "$logs/build.log")"
    fi
  else
    record build skipped 0 "configure failed"
  fi
fi
# Getting the binaries failed: nothing below can run. A failed test below does not stop the
# steps after it (the GPU machine is lent for minutes: every figure it can give counts).
broken=$failed
# A test binary: flat in a bundle, under tests/AREA/ in a build.
test_bin() { if [[ -n $tbin ]]; then echo "$tbin/${1##*/}"; else echo "$build/tests/$1"; fi; }
# Runs a program of ours with its libraries; the rest of the script keeps the system's.
ours() { LD_LIBRARY_PATH=$ldpath "$@"; }

# 4. The tests. exit 0: pass; 77: skipped (the binary prints why); else: fail.
run_test() {  # step binary timeout_s needs_gpu
  local step=$1 bin_path lim rc s why
  bin_path=$(test_bin "$2")
  lim=$(limit "$3")
  if [[ ! -x $bin_path ]]; then
    record "$step" skipped 0 "not built"
    return
  fi
  if ((lim < 5)); then
    record "$step" FAIL 0 "no time left in the ${budget} s budget"
    return
  fi
  t=$(now)
  ours timeout "$lim" "$bin_path" >"$logs/$step.log" 2>&1
  rc=$?
  s=$(elapsed "$t")
  if ((rc == 0)); then
    record "$step" pass "$s" "$(grep -m1 -E 'test cases:' "$logs/$step.log" | sed 's/\[doctest\] //')"
  elif ((rc == 77)); then
    why=$(grep -m1 -i 'skipped' "$logs/$step.log")
    if [[ $4 == yes ]] && ((gpus > 0)); then
      record "$step" FAIL "$s" "skipped on a machine with a GPU: $why"
    else
      record "$step" skipped "$s" "$why"
    fi
  elif ((rc == 124)); then
    record "$step" FAIL "$s" "no result within ${lim} s (see $logs/$step.log)"
  else
    record "$step" FAIL "$s" "exit $rc: $(grep -m1 -E 'ERROR|FAILED|error' "$logs/$step.log")"
  fi
}
if ((broken == 0)); then
  run_test gpu_device gpu/test_gpu_device 120 no
  run_test nccl_elastic comm/test_comm_nccl_elastic 120 no
  run_test fake_device_comm comm/test_comm_fake_device 120 no
  run_test gpu_kernels gpu/test_gpu_kernels 180 yes
  run_test comm_nccl comm/test_comm_nccl 120 yes
fi

# 5. The GPT (configs/kjv_gpt.yaml, context 64 so that 300 steps take ~20 s of one core) on
# the device against the CPU run of the same config and steps: the loss at the last step.
cohort=$bin/cohort
cfg=configs/kjv_gpt.yaml
[[ -n $bundle ]] && cfg=${root:-}/configs/kjv_gpt.yaml
runs=$logs/runs
gpt_sets=(--set "train.steps=$steps_gpt" --set model.context=64 --set train.eval_tokens=8192
  --set train.eval_every=0 --set fault_tolerance.checkpoint_every=0
  --set "train.warmup_steps=$((steps_gpt / 3))")
[[ -n $kjv ]] && gpt_sets+=(--set "data.cache_dir=$kjv")
cpu_threads=$(($(nproc) >= 8 ? 4 : 1))
# Does this cohort know train.device / train.precision (and bench train --device)?
device_keys=no bench_device=no
if ((broken == 0)) && [[ -x $cohort ]]; then
  ours "$cohort" validate "$cfg" --set train.device=cpu --set train.precision=fp32 >/dev/null 2>&1 && device_keys=yes
  ours "$cohort" bench train --help 2>/dev/null | grep -q -- '--device' && bench_device=yes
fi
train_run() {  # step summary_name limit_s sets...
  local step=$1 name=$2 lim rc s
  lim=$(limit "$3")
  shift 3
  if ((lim < 5)); then
    record "$step" FAIL 0 "no time left in the ${budget} s budget"
    return 1
  fi
  t=$(now)
  ours timeout "$lim" "$cohort" train "$cfg" "${gpt_sets[@]}" \
    --set "fault_tolerance.checkpoint_dir=$runs/$name.ckpt" "$@" -q \
    --summary "$runs/$name.json" >"$logs/$step.log" 2>&1
  rc=$?
  s=$(elapsed "$t")
  if ((rc == 124)); then
    record "$step" FAIL "$s" "no result within ${lim} s (see $logs/$step.log)"
    return 1
  elif ((rc != 0)); then
    record "$step" FAIL "$s" "exit $rc: $(grep -v '^\s*$' "$logs/$step.log" | tail -2 | paste -sd ' ' -)"
    return 1
  fi
  step_s=$s
  final=$(grep -m1 '^final:' "$logs/$step.log" | sed 's/ | checkpoint.*//; s/^final: //; s/ | /, /g')
}
compare() {  # step how run ref [rtol]
  local step=$1 how=$2 line rc
  if [[ $how == close ]]; then
    line=$(python3 tools/compare_curves.py close "$runs/$3.json" "$runs/$4.json" --rtol "$5" 2>&1)
  else
    line=$(python3 tools/compare_curves.py same "$runs/$3.json" "$runs/$4.json" 2>&1)
  fi
  rc=$?
  if ((rc == 0)); then
    record "$step" "$([[ $how == same ]] && echo same || echo pass)" "$step_s" "$line; $final"
  elif ((rc == 1)) && [[ $how == same ]]; then
    record "$step" differs "$step_s" "$line"
  else
    record "$step" FAIL "$step_s" "$line; $final"
  fi
}
mkdir -p "$runs"
if ((broken)); then
  record gpt_cpu skipped 0 "no binaries (an earlier step failed)"
elif [[ ! -x $cohort ]]; then
  record gpt_cpu skipped 0 "no cohort binary (--scope gpu builds only the tests)"
else
  cpu_sets=(--set "train.threads=$cpu_threads")
  [[ $device_keys == yes ]] && cpu_sets+=(--set train.device=cpu --set train.precision=fp32)
  if train_run gpt_cpu cpu 120 "${cpu_sets[@]}"; then
    record gpt_cpu pass "$step_s" "$steps_gpt steps, ${cpu_threads} thread(s): $final"
    why=
    ((gpus > 0)) || why="no GPU listed"
    [[ -z $why && $device_keys == no ]] && why="this cohort has no train.device (bundle a build that has it)"
    if [[ -n $why ]]; then
      for s in gpt_cuda_fp32 gpt_cuda_fp32_again gpt_cuda_bf16; do record "$s" skipped 0 "$why"; done
    else
      train_run gpt_cuda_fp32 cuda_fp32 90 --set train.device=cuda --set train.precision=fp32 &&
        compare gpt_cuda_fp32 close cuda_fp32 cpu "$fp32_rtol"
      # Determinism: the same run again, compared bit for bit (not a pass/fail: the CUDA
      # embedding backward sums with atomicAdd, whose order varies; docs/gpu.md).
      if [[ -f $runs/cuda_fp32.json ]]; then
        train_run gpt_cuda_fp32_again cuda_fp32_again 90 --set train.device=cuda --set train.precision=fp32 &&
          compare gpt_cuda_fp32_again same cuda_fp32_again cuda_fp32
      else
        record gpt_cuda_fp32_again skipped 0 "the first fp32 device run gave no curve"
      fi
      train_run gpt_cuda_bf16 cuda_bf16 90 --set train.device=cuda --set train.precision=bf16 &&
        compare gpt_cuda_bf16 close cuda_bf16 cpu "$bf16_rtol"
    fi
  fi
fi

# 5b. Two GPU workers in one DP group (cohort launch; the host transports, each worker's
# buckets staged through host memory: NCCL cannot put two ranks on one GPU), bitwise, against
# `cohort train` on the GPU: the fixed-point sums promise the same params_sha256.
if ((gpus == 0)) || [[ $device_keys == no ]] || ((broken)) || [[ ! -x $cohort ]]; then
  record launch_cuda_dp2 skipped 0 "needs a GPU and a cohort with train.device"
else
  lim=$(limit 150)
  bw_sets=("${gpt_sets[@]}" --set train.device=cuda --set train.determinism=bitwise
    --set train.steps=120 --set train.micro_batch=8)
  t=$(now)
  ours timeout "$lim" "$cohort" train "$cfg" "${bw_sets[@]}" \
    --set "fault_tolerance.checkpoint_dir=$runs/bw_train.ckpt" -q \
    --summary "$runs/bw_train.json" >"$logs/launch_cuda_dp2.train.log" 2>&1
  rc1=$?
  lim=$(limit 150)
  ours timeout "$lim" "$cohort" launch "$cfg" "${bw_sets[@]}" --set cluster.workers=2 \
    --set "fault_tolerance.checkpoint_dir=$runs/bw_launch.ckpt" \
    --summary "$runs/bw_launch.json" >"$logs/launch_cuda_dp2.log" 2>&1
  rc2=$?
  if ((rc1 != 0 || rc2 != 0)); then
    record launch_cuda_dp2 FAIL "$(elapsed "$t")" "train exit $rc1, launch exit $rc2: $(tail -2 "$logs/launch_cuda_dp2.log" | paste -sd ' ' -)"
  else
    h1=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["params_sha256"])' "$runs/bw_train.json")
    h2=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["params_sha256"])' "$runs/bw_launch.json")
    if [[ -n $h1 && $h1 == "$h2" ]]; then
      record launch_cuda_dp2 pass "$(elapsed "$t")" "2 workers on cuda:0, bitwise, 120 steps: params_sha256 ${h1:0:16} = cohort train on the GPU"
    else
      record launch_cuda_dp2 FAIL "$(elapsed "$t")" "params_sha256 launch ${h2:0:16} != train ${h1:0:16}"
    fi
  fi
fi

# 5c. Checkpoints move between devices: 100 steps on one device, resumed for 100 more on the
# other, against 200 steps on the CPU (constant lr, no warm-up, so a 100-step run is the
# first half of a 200-step one). The GPU's steps differ from the CPU's by float rounding, so
# the comparison is the fp32 tolerance, not bits.
if ((gpus == 0)) || [[ $device_keys == no ]] || ((broken)) || [[ ! -x $cohort ]]; then
  record ckpt_across_devices skipped 0 "needs a GPU and a cohort with train.device"
else
  ck_sets=("${gpt_sets[@]}" --set train.lr_schedule=constant --set train.warmup_steps=0)
  t=$(now)
  ok=1
  ck_run() {  # name device steps [resume-from]
    local lim
    lim=$(limit 60)
    local extra=()
    [[ -n ${4:-} ]] && extra=(--resume-from "$4")
    ours timeout "$lim" "$cohort" train "$cfg" "${ck_sets[@]}" --set "train.device=$2" \
      --set "train.steps=$3" --set "fault_tolerance.checkpoint_dir=$runs/$1.ckpt" "${extra[@]}" -q \
      --summary "$runs/$1.json" >"$logs/ckpt_$1.log" 2>&1 || ok=0
  }
  ck_run ck_cpu200 cpu 200
  ck_run ck_gpu100 cuda 100
  ck_run ck_gpu_to_cpu cpu 200 "$runs/ck_gpu100.ckpt/step_00000100"
  ck_run ck_cpu100 cpu 100
  ck_run ck_cpu_to_gpu cuda 200 "$runs/ck_cpu100.ckpt/step_00000100"
  if ((ok == 0)); then
    record ckpt_across_devices FAIL "$(elapsed "$t")" "a run failed (see $logs/ckpt_*.log)"
  else
    l1=$(python3 tools/compare_curves.py close "$runs/ck_gpu_to_cpu.json" "$runs/ck_cpu200.json" --rtol "$fp32_rtol" 2>&1)
    r1=$?
    l2=$(python3 tools/compare_curves.py close "$runs/ck_cpu_to_gpu.json" "$runs/ck_cpu200.json" --rtol "$fp32_rtol" 2>&1)
    r2=$?
    if ((r1 == 0 && r2 == 0)); then
      record ckpt_across_devices pass "$(elapsed "$t")" "GPU 100 + CPU 100: $l1; CPU 100 + GPU 100: $l2"
    else
      record ckpt_across_devices FAIL "$(elapsed "$t")" "GPU then CPU: $l1; CPU then GPU: $l2"
    fi
  fi
fi

# 6. `cohort bench train` on the device: its own figures (tokens/s, MFU), passed through.
# fp32; bf16 as cohort runs it (bf16 operand copies, cuBLAS's bf16 kernels); bf16 the other
# way (COHORT_CUDA_BF16=fast16bf: FP32 operands, CUBLAS_COMPUTE_32F_FAST_16BF), the design it
# replaced; and bf16 again with COHORT_DEVICE_PROFILE=1 (per-op times; slower, not a figure).
for variant in fp32 bf16 bf16_fast16bf fp32_profile bf16_profile; do
  step=bench_cuda_$variant
  p=${variant%%_*}
  env_extra=()
  steps_bench=10
  case $variant in
    *fast16bf) env_extra=(COHORT_CUDA_BF16=fast16bf) ;;
    *profile) env_extra=(COHORT_DEVICE_PROFILE=1) steps_bench=3 ;;
  esac
  if ((gpus == 0)); then
    record "$step" skipped 0 "no GPU listed"
  elif ((broken)) || [[ ! -x $cohort ]]; then
    record "$step" skipped 0 "no cohort binary"
  elif [[ $bench_device == no ]]; then
    record "$step" skipped 0 "this cohort's bench train has no --device (bundle a build that has it)"
  else
    lim=$(limit 90)
    if ((lim < 5)); then
      record "$step" FAIL 0 "no time left in the ${budget} s budget"
      continue
    fi
    t=$(now)
    # GPT-2 small's shape (124M parameters plus a 50,304-token vocabulary, 16 sequences of
    # 1,024 tokens a step): large enough that the matrix products, not launches, set the pace.
    ours env "${env_extra[@]}" timeout "$lim" "$cohort" bench train --model gpt --device cuda \
      --precision "$p" --vocab 50304 --context 1024 --n-layer 12 --n-head 12 --d-model 768 \
      --batch 16 --steps "$steps_bench" --warmup 3 >"$logs/$step.log" 2>&1
    rc=$?
    cat "$logs/$step.log"
    if ((rc == 0)); then
      figures=$(grep -iE 'tokens/s|mfu' "$logs/$step.log" | head -1)
      record "$step" pass "$(elapsed "$t")" "${figures:-$(grep -v '^\s*$' "$logs/$step.log" | tail -1)}"
    else
      record "$step" FAIL "$(elapsed "$t")" "exit $rc: $(tail -1 "$logs/$step.log")"
    fi
  fi
done

# 6b. Checked after the benches, so that a tight --budget takes these, not the figures.
# 1-bit Adam through its freeze (step 100) on both devices: its frozen update, momentum share
# and denominator run on the GPU (their twins agree bit for bit in gpu_kernels).
if ((gpus == 0)) || [[ $device_keys == no ]] || ((broken)) || [[ ! -x $cohort ]]; then
  record gpt_cuda_onebit skipped 0 "needs a GPU and a cohort with train.device"
else
  onebit_sets=(--set train.optimizer=onebit_adam --set train.onebit.freeze_step=100)
  if train_run gpt_cpu_onebit cpu_onebit 120 "${cpu_sets[@]}" "${onebit_sets[@]}"; then
    train_run gpt_cuda_onebit cuda_onebit 90 --set train.device=cuda --set train.precision=fp32 \
      "${onebit_sets[@]}" && compare gpt_cuda_onebit close cuda_onebit cpu_onebit "$fp32_rtol"
  else
    record gpt_cuda_onebit skipped 0 "the CPU's 1-bit Adam run failed (gpt_cpu_onebit)"
  fi
fi

# 6c. Pipeline and tensor-parallel stages on the GPU (cohort launch, two workers on cuda:0;
# activations, their gradients and the TP sums through host memory), against the same
# `cohort train` on the GPU as 5b: pp 2 bitwise promises its params_sha256 (the pipeline's
# fixed-point sums, docs/pipeline.md), tp 2 sums its row-parallel products in another order
# and promises its loss within 1e-4 relative (as on the CPU, tests/mp/test_hybrid.cpp).
if ((gpus == 0)) || [[ $device_keys == no ]] || ((broken)) || [[ ! -x $cohort ]] ||
  [[ ! -f $runs/bw_train.json ]]; then
  record launch_cuda_pp2 skipped 0 "needs a GPU, a cohort with train.device and 5b's cohort train run"
  record launch_cuda_tp2 skipped 0 "needs a GPU, a cohort with train.device and 5b's cohort train run"
else
  h1=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["params_sha256"])' "$runs/bw_train.json")
  for grid in pp2 tp2; do
    lim=$(limit 150)
    t=$(now)
    key=${grid:0:2}
    ours timeout "$lim" "$cohort" launch "$cfg" "${bw_sets[@]}" --set cluster.workers=2 \
      --set "parallel.$key=2" --set "fault_tolerance.checkpoint_dir=$runs/$grid.ckpt" \
      --summary "$runs/$grid.json" >"$logs/launch_cuda_$grid.log" 2>&1
    rc=$?
    if ((rc != 0)); then
      record "launch_cuda_$grid" FAIL "$(elapsed "$t")" "launch exit $rc: $(tail -2 "$logs/launch_cuda_$grid.log" | paste -sd ' ' -)"
    elif [[ $grid == pp2 ]]; then
      h2=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["params_sha256"])' "$runs/$grid.json")
      if [[ -n $h1 && $h1 == "$h2" ]]; then
        record launch_cuda_pp2 pass "$(elapsed "$t")" "2 stages on cuda:0, bitwise, 120 steps: params_sha256 ${h1:0:16} = cohort train on the GPU"
      else
        record launch_cuda_pp2 FAIL "$(elapsed "$t")" "params_sha256 pp 2 ${h2:0:16} != train ${h1:0:16}"
      fi
    else
      verdict=$(python3 - "$runs/bw_train.json" "$runs/$grid.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["final_loss"]
b = json.load(open(sys.argv[2]))["final_loss"]
d = abs(a - b) / abs(a)
print(("pass" if d <= 1e-4 else "FAIL") + f" final loss {b:.6f} against cohort train's {a:.6f} ({d:.1e} relative, limit 1e-4)")
PY
)
      [[ -n $verdict ]] || verdict="FAIL no final_loss in $runs/bw_train.json or $runs/$grid.json"
      record launch_cuda_tp2 "${verdict%% *}" "$(elapsed "$t")" "2 TP ranks on cuda:0, bitwise, 120 steps: ${verdict#* }"
    fi
  done
fi

# 7. NCCL across ranks: one GPU cannot hold two (NCCL: "Duplicate GPU detected"), so the
# multi-rank cases (a peer's abort, shrink) and bus bandwidth (busbw = algbw * 2(n-1)/n,
# 0 for one rank) need a machine with 2+ GPUs; the single-rank cases ran in comm_nccl.
if ((gpus >= 2)); then
  record nccl_multi_rank skipped 0 "$gpus GPUs, but no multi-rank NCCL check or NCCL allreduce bench is written yet"
else
  record nccl_multi_rank skipped 0 "$gpus GPU(s): NCCL refuses two ranks on one GPU (Duplicate GPU detected); single-rank cases ran in comm_nccl"
fi

{
  echo
  printf '| %-20s | %-7s | %7s | %s\n' step result seconds figures
  printf '| %-20s | %-7s | %7s | %s\n' -------------------- ------- ------- -------
  for i in "${!steps[@]}"; do
    printf '| %-20s | %-7s | %7s | %s\n' "${steps[$i]}" "${results[$i]}" "${secs[$i]}" "${notes[$i]}"
  done
  echo "device: $device_note"
  echo "total: $(elapsed "$start") s (budget $budget s)"
} | tee "$logs/summary.txt"
if [[ -n ${OUT:-} ]]; then
  # The device tool returns at most 8 files from $OUT: the summary, and the logs as one.
  mkdir -p "$OUT/gpu_check" &&
    cp "$logs/summary.txt" "$OUT/gpu_check/summary.txt" &&
    tar -C "${logs%/*}" -czf "$OUT/gpu_check/logs.tar.gz" --exclude='*.ckpt' gpu_check &&
    logs="$OUT/gpu_check/logs.tar.gz"
fi
if ((failed)); then
  echo "gpu_check: FAILED (logs in $logs)"
  exit 1
fi
echo "gpu_check: passed (skipped steps say why above)"
