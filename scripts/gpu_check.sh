#!/usr/bin/env bash
# The one prepared GPU check (issue 14): builds the gpu preset (or uses a bundle built on the CPU machine), then
# on the GPU runs the tests/runtime/cuda suites, gpt-tiny `apart train` on cuda vs cpu (fp32, and fp16 with loss
# scaling), gpt-tiny `apart run` with NCCL (one rank), and with two stages, TP 2, TP 2 × PP 2, ZeRO-1 and ZeRO-3 on
# the one GPU (ranks as threads, host messages) vs the CPU backend, the GPT-layers benchmark, and the measured per-op GPU profile vs the h200-141gb analytic preset; a summary
# at the end. Every part has its
# own timeout, so one hang does not eat the device budget. All output goes to stdout and under $OUT (the device
# tool's folder; else --out, default out/gpu_check): gpu_check.log (everything), summary.txt, tests.log,
# train.log (apart train and apart run), bench.log, measured.json and analytic.json (7 files: the device tool returns
# at most 8).
#
#   scripts/gpu_check.sh                 on the GPU machine: everything (fails fast with "no GPU" where none is)
#   scripts/gpu_check.sh --build-only    configure + build only; exit 0 without a GPU
#   scripts/gpu_check.sh --bundle        on the CPU machine: build here and pack the binaries and the non-CUDA
#                                        shared libraries they load into .gpu_bundle/ (git-ignored), for the device
#                                        tool's `carry` (the device image has no protobuf/ONNX/OpenBLAS dev packages
#                                        and no network; it has CUDA, cuBLAS, and cuDNN/NCCL in its Python wheels)
#
# Device run (15 minutes of device time in all; this script needs about 8): run it once with
#   carry [".gpu_bundle"], command "scripts/gpu_check.sh", timeout_s 560
# leaving time for a rerun. Limits (seconds) may be overridden: GPU_CHECK_BUILD_S, _TESTS_S, _TRAIN_S, _BENCH_S,
# _RUN_S, _PROFILE_S; the training tolerance with GPU_CHECK_TRAIN_TOL (max relative loss difference, default 1e-3).
set -uo pipefail

mode=full
out_dir=""
while (($#)); do
  case "$1" in
    --build-only) mode=build ;;
    --bundle) mode=bundle ;;
    --out) out_dir="$2"; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (--build-only, --bundle, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out_dir="${out_dir:-${OUT:-$root/out/gpu_check}}"
mkdir -p "$out_dir"
log="$out_dir/gpu_check.log"
: >"$log"
exec > >(tee -a "$log") 2>&1
tee_pid=$!

build_s="${GPU_CHECK_BUILD_S:-300}"
tests_s="${GPU_CHECK_TESTS_S:-150}"
train_s="${GPU_CHECK_TRAIN_S:-90}"
run_s="${GPU_CHECK_RUN_S:-90}"
bench_s="${GPU_CHECK_BENCH_S:-150}"
profile_s="${GPU_CHECK_PROFILE_S:-150}"
train_tol="${GPU_CHECK_TRAIN_TOL:-1e-3}"
jobs="$(nproc 2>/dev/null || echo 2)"
build_dir="$root/build/gpu"
bundle="$root/.gpu_bundle"
# The targets this check runs (the CUDA test suites are found by name in the build's target list).
base_targets=(apart bench_gpu_layers)

summary=()
started=$SECONDS
note() { summary+=("$(printf '%-30s %-5s %4ss  %s' "$1" "$2" "$3" "${4:-}")"); }
finish() {
  echo
  echo "== gpu_check summary ($((SECONDS - started)) s) =="
  printf '%s\n' "${summary[@]}" | tee "$out_dir/summary.txt"
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null  # the log is complete before the device tool collects $OUT
  exit "$1"
}

have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }

# --- Binaries: a carried bundle, or the gpu preset built here ---
cuda_test_targets() {
  cmake --build "$build_dir" --target help 2>/dev/null | sed -n 's/^\.\.\. \([A-Za-z0-9_]*cuda[A-Za-z0-9_]*tests\).*/\1/p'
}
build() {
  local t0=$SECONDS
  echo "== build: cmake --preset gpu, targets ${base_targets[*]} + the CUDA test suites, -j$jobs =="
  local launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  if ! timeout "$build_s" cmake --preset gpu "${launcher[@]}" "$@" >"$root/build/gpu-configure.log" 2>&1; then
    tail -20 "$root/build/gpu-configure.log"
    note build FAIL $((SECONDS - t0)) "configure failed (missing dev packages? build/gpu-configure.log; or carry a --bundle)"
    return 1
  fi
  local targets=("${base_targets[@]}" $(cuda_test_targets))
  if ! timeout "$build_s" cmake --build "$build_dir" -j"$jobs" --target "${targets[@]}"; then
    note build FAIL $((SECONDS - t0)) "cmake --build failed or ran past ${build_s}s"
    return 1
  fi
  note build ok $((SECONDS - t0)) "${targets[*]}"
}

if [ "$mode" = bundle ]; then
  # MPI stays out: the single-GPU check needs none, and its libraries would have to travel too.
  build -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON || finish 1
  rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/lib"
  cp "$build_dir/cli/apart" "$build_dir/bench/bench_gpu_layers" "$bundle/bin/" 2>/dev/null
  for t in $(cuda_test_targets); do find "$build_dir/tests" -type f -name "$t" -exec cp {} "$bundle/bin/" \; ; done
  # Shared libraries from here, except the C/C++ runtime (the device's is newer) and CUDA's own (the device has
  # its driver's, and cuDNN/NCCL are too large to carry).
  skip='^(libc|libm|libdl|librt|libpthread|ld-linux.*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn.*|libnccl|libnvrtc.*|libnvJitLink)\.so'
  for bin in "$bundle"/bin/*; do
    ldd "$bin" | awk '/=> \//{print $3}' | while read -r lib; do
      name="$(basename "$lib")"
      [[ "$name" =~ $skip ]] || cp -L "$lib" "$bundle/lib/$name"
    done
  done
  # Tests name their data by the source root they were built in (APART_SOURCE_DIR): the device links it to its copy.
  echo "$root" >"$bundle/source_root"
  grep -qx '/.gpu_bundle/' .git/info/exclude 2>/dev/null || echo '/.gpu_bundle/' >>"$(git rev-parse --git-path info/exclude)"
  note bundle ok 0 "$(du -sh "$bundle" | cut -f1) in .gpu_bundle ($(ls "$bundle/bin" | tr '\n' ' '))"
  finish 0
fi

if [ "$mode" = full ] && ! have_gpu; then
  note gpu SKIP 0 "no GPU (nvidia-smi missing or lists none): nothing run; --build-only builds without one"
  finish 3
fi

if [ -d "$bundle/bin" ]; then
  bin="$bundle/bin"
  note build ok 0 "using the carried bundle .gpu_bundle ($(ls "$bin" | tr '\n' ' '))"
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  built_in="$(cat "$bundle/source_root" 2>/dev/null || true)"
  if [ -n "$built_in" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$root" "$built_in" && echo "linked $built_in -> $root (APART_SOURCE_DIR)"
  fi
else
  build || finish 1
  bin="$build_dir/bin-links"
  rm -rf "$bin" && mkdir -p "$bin"
  ln -sf "$build_dir/cli/apart" "$build_dir/bench/bench_gpu_layers" "$bin/" 2>/dev/null
  for t in $(cuda_test_targets); do find "$build_dir/tests" -type f -name "$t" -exec ln -sf {} "$bin/" \; ; done
fi
[ "$mode" = build ] && finish 0

# cuDNN, NCCL and cuBLAS where the device image keeps them: the toolkit, or the Python wheels beside PyTorch.
for lib in libcudnn.so.9 libnccl.so.2 libcublasLt.so.13; do
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
             $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | xargs -n1 -I{} \
               find {}/nvidia -maxdepth 2 -type d -name lib 2>/dev/null); do
    if [ -e "$dir/$lib" ]; then export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
  done
done
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader || true
missing="$(ldd "$bin/apart" | grep 'not found' || true)"
if [ -n "$missing" ]; then
  echo "$missing"
  note libraries FAIL 0 "apart cannot load: $(echo "$missing" | awk '{print $1}' | tr '\n' ' ')"
  finish 1
fi

# --- 1. The CUDA test suites (kernels vs the CPU backend, the NCCL communicator) ---
t0=$SECONDS
suites=("$bin"/*cuda*tests)
if [ ! -e "${suites[0]}" ]; then
  note "cuda tests" FAIL 0 "no *cuda*tests binary was built"
else
  : >"$out_dir/tests.log"
  failed=()
  deadline=$((SECONDS + tests_s))
  for suite in "${suites[@]}"; do
    left=$((deadline - SECONDS)); ((left < 5)) && left=5
    echo "== $(basename "$suite") (limit ${left}s) =="
    timeout "$left" "$suite" 2>&1 | tee -a "$out_dir/tests.log" || failed+=("$(basename "$suite")")
  done
  skipped="$(grep -c '^\[  SKIPPED \]' "$out_dir/tests.log" || true)"
  if ((${#failed[@]})); then note "cuda tests" FAIL $((SECONDS - t0)) "${failed[*]}"
  else note "cuda tests" ok $((SECONDS - t0)) "${#suites[@]} suites; skipped lines: $skipped"; fi
fi

# --- 2. gpt-tiny on cuda vs cpu, 5 steps, same seed: apart train (fp32; fp16 with loss scaling) and apart run
# over NCCL (a one-rank plan: NCCL's init and the device path; one GPU cannot hold two NCCL ranks, so the multi-rank
# grouping and all-reduce stay covered by the CPU tests: runtime_comm_tests, train_pipeline_device_tests) ---
# compare_losses NAME LIMIT_S -- COMMAND...: runs COMMAND with --backend cpu and with --backend cuda (plus any
# cuda-only flags in $cuda_extra), appends both logs to train.log, and notes the largest relative loss difference.
compare_losses() {
  local name="$1" limit="$2"; shift 3
  local t0=$SECONDS
  echo "== $name: $* --backend cpu|cuda ${cuda_extra[*]} (tolerance: max relative loss difference $train_tol) =="
  timeout "$limit" "$@" --backend cpu >"$out_dir/cmp_cpu.log" 2>&1
  local cpu_rc=$?
  timeout "$limit" "$@" --backend cuda "${cuda_extra[@]}" >"$out_dir/cmp_cuda.log" 2>&1
  local cuda_rc=$?
  { echo "=== $name"; echo "--- cpu (rc $cpu_rc)"; cat "$out_dir/cmp_cpu.log"; echo "--- cuda (rc $cuda_rc)"; cat "$out_dir/cmp_cuda.log"; } \
    >"$out_dir/cmp.log"
  cat "$out_dir/cmp.log" | tee -a "$out_dir/train.log"
  if ((cpu_rc || cuda_rc)); then
    note "$name" FAIL $((SECONDS - t0)) "exited cpu=$cpu_rc cuda=$cuda_rc"
  else
    local verdict last
    verdict="$(python3 - "$out_dir/cmp.log" "$train_tol" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
cpu_part, cuda_part = text.split("--- cuda", 1)
losses = lambda s: [float(x) for x in re.findall(r"^(?:\[[^]]*\] )?step=\d+ loss=([-+0-9.eE]+)", s, re.M)]
cpu, cuda = losses(cpu_part), losses(cuda_part)
if not cpu or len(cpu) != len(cuda):
    print(f"FAIL step lines: cpu {len(cpu)}, cuda {len(cuda)}"); sys.exit()
rel = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, cuda))
print("cpu  " + " ".join(f"{x:.6f}" for x in cpu))
print("cuda " + " ".join(f"{x:.6f}" for x in cuda))
print(("ok" if rel <= float(sys.argv[2]) else "FAIL") + f" max relative difference {rel:.3e} (tolerance {sys.argv[2]})")
PY
)"
    echo "$verdict" | tee -a "$out_dir/train.log"
    last="$(echo "$verdict" | tail -1)"
    note "$name" "${last%% *}" $((SECONDS - t0)) "${last#* }"
  fi
  rm -f "$out_dir/cmp_cpu.log" "$out_dir/cmp_cuda.log" "$out_dir/cmp.log"
}
: >"$out_dir/train.log"
train_flags=(models/gpt-tiny.onnx --steps 5 --batch 8 --seed 1)
"$bin/apart" train --help 2>/dev/null | grep -q -- '--precision' && train_flags+=(--precision fp32)
cuda_extra=()
compare_losses "gpt-tiny train cuda vs cpu" "$train_s" -- "$bin/apart" train "${train_flags[@]}"
if "$bin/apart" train --help 2>/dev/null | grep -q -- '--loss-scale-init'; then
  # fp16 operands on both (the CPU rounds them as cuBLASLt reads them), the loss scaled by 2^16 on both.
  compare_losses "gpt-tiny train fp16 cuda vs cpu" "$train_s" -- "$bin/apart" train models/gpt-tiny.onnx --steps 5 \
    --batch 8 --seed 1 --precision fp16
fi
if "$bin/apart" run --help 2>/dev/null | grep -q -- '--device-comm'; then
  plan_dir="$(mktemp -d)/plan"
  if timeout 60 "$bin/apart" partition models/gpt-tiny.onnx --device cpu --devices 1 --batch 8 --no-baselines -q \
       -o "$plan_dir" >/dev/null 2>&1; then
    # One rank: under mpirun when this apart has MPI and mpirun is here, else as a plain process (a one-device plan
    # needs no launcher; the NCCL communicator's bootstrap is then the in-process one).
    launcher=()
    if command -v mpirun >/dev/null 2>&1 && "$bin/apart" run --help 2>/dev/null | grep -q -- '--in-process' &&
       ldd "$bin/apart" | grep -q libmpi; then
      launcher=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --timeout "$run_s" -np 1)
    fi
    cuda_extra=(--device-comm nccl)
    compare_losses "gpt-tiny run nccl vs cpu" "$run_s" -- "${launcher[@]}" "$bin/apart" run "$plan_dir" --steps 5 \
      --seed 1 --optimizer adamw --precision fp32
    cuda_extra=()
  else
    note "gpt-tiny run nccl vs cpu" FAIL 0 "apart partition of the one-device plan failed"
  fi
  # Multi-rank plans as threads on the one GPU: NCCL cannot put two ranks on one device, so their messages take the
  # host path (--device-comm host), each run against the CPU's: two stages (the pipelined CUDA run), and issue 17's
  # TP 2 (each TP rank runs its shard of the stage graph — column/row-split linears, heads, the vocabulary-parallel
  # loss — on the GPU; the ai.apart Tp* collectives run as CPU-kernel fallbacks over the host group), TP 2 × PP 2 on
  # four, and ZeRO-1 and ZeRO-3 over 2 replicas.
  for shape in "2 stages:2:--stages 2 --replicas 1" "tp2:2:--tp 2 --pp 1 --dp 1" "tp2 pp2:4:--tp 2 --pp 2 --dp 1" \
               "zero1:2:--tp 1 --pp 1 --dp 2 --zero 1" "zero3:2:--tp 1 --pp 1 --dp 2 --zero 3"; do
    name="${shape%%:*}"; rest="${shape#*:}"; devices="${rest%%:*}"; flags="${rest#*:}"
    shape_dir="$(dirname "$plan_dir")/${name// /_}"
    # shellcheck disable=SC2086  # the flags are words
    if timeout 60 "$bin/apart" partition models/gpt-tiny.onnx --device cpu --devices "$devices" $flags \
         --microbatches 2 --batch 8 --no-baselines -q -o "$shape_dir" >/dev/null 2>&1; then
      cuda_extra=(--device-comm host)
      compare_losses "gpt-tiny run $name cuda vs cpu" "$run_s" -- "$bin/apart" run "$shape_dir" --in-process \
        --steps 5 --seed 1 --optimizer adamw --precision fp32
      cuda_extra=()
    else
      note "gpt-tiny run $name cuda vs cpu" FAIL 0 "apart partition of the $name plan failed"
    fi
  done
fi

# --- 3. GPT-3-1.3B-shaped layers: TFLOP/s and MFU next to cuBLASLt's best GEMM ---
t0=$SECONDS
echo "== bench_gpu_layers (limit ${bench_s}s) =="
timeout "$bench_s" "$bin/bench_gpu_layers" 2>&1 | tee "$out_dir/bench.log"
bench_rc=${PIPESTATUS[0]}
mfu="$(sed -n 's/^MFU_PERCENT=//p' "$out_dir/bench.log")"
if ((bench_rc)) || [ -z "$mfu" ]; then note "gpt layers bench" FAIL $((SECONDS - t0)) "exit $bench_rc"
else
  bar=ok; awk -v m="$mfu" 'BEGIN{exit !(m < 40)}' && bar=LOW
  note "gpt layers bench" "$bar" $((SECONDS - t0)) "MFU ${mfu}% (bar 40%, aim 50%)"
fi

# --- 4. Measured per-op GPU profile vs the h200-141gb analytic preset, per op type ---
t0=$SECONDS
work="$(mktemp -d)"
model="$work/gpt_layers.onnx"
profile_flags=(--backend cuda --batch 2 -q -o "$out_dir/measured.json")
"$bin/apart" profile --help 2>/dev/null | grep -q -- '--precision' && profile_flags+=(--precision mixed)
echo "== apart profile ${profile_flags[*]} vs apart costs --device h200-141gb --precision mixed (limit ${profile_s}s) =="
if timeout 60 "$bin/apart" zoo gpt --layers 4 --hidden 2048 --heads 16 --seq 2048 --vocab 2048 -q -o "$model" &&
   timeout "$profile_s" "$bin/apart" profile "$model" "${profile_flags[@]}" &&
   timeout 60 "$bin/apart" costs "$model" --device h200-141gb --precision mixed --batch 2 -o "$out_dir/analytic.json"; then
  python3 scripts/gpu_profile_vs_preset.py "$out_dir/analytic.json" "$out_dir/measured.json" | tee "$work/profile.log"
  worst="$(sed -n 's/^WORST_OP_RATIO=//p' "$work/profile.log")"
  # The bar: every op type's measured/analytic within 20 % (0.8–1.2); MISS otherwise, as the MFU row says LOW.
  bar=MISS; awk -v r="$worst" 'BEGIN{exit !(r >= 0.8 && r <= 1.2)}' && bar=ok
  note "profile vs h200 preset" "$bar" $((SECONDS - t0)) "worst op type measured/analytic ${worst:-?} (bar: within 20%)"
else
  note "profile vs h200 preset" FAIL $((SECONDS - t0)) "zoo, profile or costs failed or ran past its limit"
fi
rm -rf "$work"

status=0
printf '%s\n' "${summary[@]}" | grep -q ' FAIL ' && status=1
finish "$status"
