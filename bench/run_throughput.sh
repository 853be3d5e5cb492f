#!/usr/bin/env bash
# Samples/s of one process (`apart train`) vs `apart run` of a plan on 1 rank, 2 ranks data-parallel (1 stage ×
# 2 replicas) and 2 ranks pipelined (2 stages, m = 4, 1F1B), side by side in one run, for gpt-tiny and
# gpt2-small, batch 8. gpt2-small is `apart zoo gpt2-small --seq 128 --weights none` (graph-only, --init random):
# ../shared/models/gpt2_small.onnx has the same layers but seq 1024 and no loss output — 4.6 GiB of activations
# and ~0.9 TFLOP per sample, so batch 8 needs ~37 GiB and minutes per step on 2 cores; it cannot train here.
# Threads: 2 in all per configuration (one process: OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=2; two ranks: 1 each),
# so every column uses the same 2 cores. Each figure is the median of the per-step samples/s of steps 2..K
# (step 1 warms caches and arenas). Prints a Markdown table and which OpenBLAS kernel ran.
# OPENBLAS_CORETYPE: SKYLAKEX where the CPU has avx512f, else unset (SKYLAKEX dies of SIGILL without AVX-512);
# BENCH_CORETYPE=NAME overrides it, BENCH_CORETYPE=none unsets it. Only this benchmark sets it, never tests/CI.
# Usage: bench/run_throughput.sh [--no-build] [path/to/apart]   (default: builds and uses build/release/cli/apart)
# Env: STEPS_TINY (default 12), STEPS_GPT2 (default 3), GPT2_SEQ (default 128), MODELS (default "gpt-tiny gpt2-small").
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [[ ${1:-} == --no-build ]]; then build=0; shift; fi
apart=${1:-build/release/cli/apart}
if [[ $build == 1 && -z ${1:-} ]]; then
  cmake --preset release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache >/dev/null
  cmake --build --preset release -j2 --target apart >/dev/null
fi
command -v mpirun >/dev/null || { echo "run_throughput.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

coretype=${BENCH_CORETYPE:-}
if [[ -z $coretype ]]; then
  grep -qw avx512f /proc/cpuinfo && coretype=SKYLAKEX || coretype=none
fi
if [[ $coretype == none ]]; then unset OPENBLAS_CORETYPE; else export OPENBLAS_CORETYPE=$coretype; fi
kernel=$(OPENBLAS_VERBOSE=2 "$apart" --version 2>&1 | sed -n 's/^Core: //p' | head -1)
echo "$(date -I), load average $(cut -d" " -f1-3 /proc/loadavg) before the run"
echo "CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores;" \
     "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}; OpenBLAS kernel: ${kernel:-unknown (not OpenBLAS?)}"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
batch=8

# plan MODEL STAGES REPLICAS MICROBATCHES OUT [INIT]: apart partition, then the plan given exactly that shape
# (the planner picks its own; the runtime runs what plan.json says), as tests/train/pipeline_test.cpp does.
plan() {
  local model=$1 stages=$2 replicas=$3 m=$4 out=$5
  "$apart" partition "$model" --device cpu --devices $((stages * replicas)) --stages "$stages" --replicas "$replicas" \
    --microbatches "$m" --batch $batch --schedule 1f1b --no-baselines -o "$out" >/dev/null 2>"$dir/err" ||
    { cat "$dir/err" >&2; return 1; }  # its note that a graph-only model's stage files lack weights is expected
  python3 - "$out/plan.json" "$stages" "$replicas" "$m" <<'PY'
import json, sys
path, stages, replicas, m = sys.argv[1], *map(int, sys.argv[2:])
p = json.load(open(path))
assert len(p["stages"]) == stages, f"partition cut {len(p['stages'])} stages, not {stages}"
device = 0
for s in p["stages"]:
    s["replicas"] = replicas
    s["devices"] = list(range(device, device + replicas)); device += replicas
    s["microbatch_size"] = 8 // m // replicas
p["cluster"]["devices"] = device
json.dump(p, open(path, "w"), indent=2)
PY
}

# median_rate: the median samples/s of the step lines on stdin, step 1 left out.
median_rate() {
  python3 -c '
import re, statistics, sys
r = [float(m.group(2)) for m in (re.search(r"step=(\d+) .*samples/s=([0-9.eE+-]+)", l) for l in sys.stdin) if m and int(m.group(1)) > 1]
print(f"{statistics.median(r):.3g}" if r else "—")'
}

run1() { OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 "$@" 2>"$dir/err" || { cat "$dir/err" >&2; return 1; }; }
run2() {
  mpirun --timeout 3600 --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
    ${OPENBLAS_CORETYPE:+-x OPENBLAS_CORETYPE} "$@" 2>"$dir/err" || { cat "$dir/err" >&2; return 1; }
}

echo
echo "| model | steps | apart train (1 process, 2 threads) | apart run, 1 rank (1 stage) | 2 ranks data-parallel (1 stage × 2) | 2 ranks pipelined (2 stages, m=4, 1F1B) |"
echo "|---|---:|---:|---:|---:|---:|"
for name in ${MODELS:-gpt-tiny gpt2-small}; do
  case $name in
    gpt-tiny) model=models/gpt-tiny.onnx init=model steps=${STEPS_TINY:-12} ;;
    gpt2-small)
      model=$dir/gpt2-small.onnx init=random steps=${STEPS_GPT2:-3}
      "$apart" zoo gpt2-small --seq "${GPT2_SEQ:-128}" --weights none -q -o "$model" >/dev/null
      name="gpt2-small (seq ${GPT2_SEQ:-128})" ;;
    *) echo "run_throughput.sh: unknown model '$name' (gpt-tiny, gpt2-small)" >&2; exit 2 ;;
  esac
  common=(--steps "$steps" --init "$init" --seed 1 --optimizer sgd --lr 0.01)
  plan "$model" 1 1 1 "$dir/p1"
  plan "$model" 1 2 1 "$dir/dp"
  plan "$model" 2 1 4 "$dir/pp"
  train=$(run1 "$apart" train "$model" --batch $batch "${common[@]}" | median_rate)
  one=$(run1 "$apart" run "$dir/p1" --model "$model" "${common[@]}" | median_rate)
  dp=$(run2 "$apart" run "$dir/dp" --model "$model" "${common[@]}" | median_rate)
  pp=$(run2 "$apart" run "$dir/pp" --model "$model" "${common[@]}" | median_rate)
  echo "| $name | $steps | $train | $one | $dp | $pp |"
done
