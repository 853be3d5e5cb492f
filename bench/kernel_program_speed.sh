#!/usr/bin/env bash
# CPU step time of `apart train` before and after the kernel program (fused attention, views instead of copies),
# side by side in one run: the same model, batch, seed and threads (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=2), the two
# binaries alternated run by run. "before" is a build of the commit this work started from (default
# /work/main/build/release/cli/apart), "after" this tree's. Models: gpt-tiny (seq 64) and a zoo GPT at seq 512
# (2 layers, hidden 256, 4 heads, vocab 2048, random init). Each figure is the median seconds per step of steps 2..K
# (step 1 warms caches and arenas) over REPEATS runs; the last column is the largest |loss difference| over every step,
# relative to the loss (what the fused kernels change: summation order).
# Usage: bench/kernel_program_speed.sh [BEFORE_APART [AFTER_APART]]   Env: STEPS (default 6), REPEATS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:-/work/main/build/release/cli/apart}
after=${2:-build/release/cli/apart}
steps=${STEPS:-6}
repeats=${REPEATS:-2}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
kernel=$(OPENBLAS_VERBOSE=2 "$after" --version 2>&1 | sed -n 's/^Core: //p' | head -1)
echo "$(date -I), load average $(cut -d" " -f1-3 /proc/loadavg) before the run"
echo "CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores; threads 2;" \
     "OpenBLAS kernel: ${kernel:-unknown (not OpenBLAS?)}"
"$after" zoo gpt --layers 2 --hidden 256 --heads 4 --seq 512 --vocab 2048 --weights none -q -o "$dir/gpt512.onnx" >/dev/null

# step_seconds: the median step_time of the step lines on stdin (step 1 left out), in s; writes the losses to $1.
step_seconds() {
  python3 -c '
import re, statistics, sys
times, losses = [], []
for l in sys.stdin:
    m = re.search(r"step=(\d+) loss=([0-9.eE+-]+) .*step_time=([0-9.]+)(ms|s)", l)
    if not m: continue
    losses.append(m.group(2))
    if int(m.group(1)) > 1: times.append(float(m.group(3)) / (1000 if m.group(4) == "ms" else 1))
open(sys.argv[1], "w").write("\n".join(losses))
print(f"{statistics.median(times):.3f}")' "$1"
}
loss_gap() {
  python3 -c '
import sys
a = [float(x) for x in open(sys.argv[1]).read().split()]
b = [float(x) for x in open(sys.argv[2]).read().split()]
assert len(a) == len(b) and a, "different step counts"
print(f"{max(abs(x - y) / abs(y) for x, y in zip(a, b)):.1e}")' "$1" "$2"
}

echo
echo "| model | batch | before: s/step | after: s/step | speed-up | max rel. loss difference over $steps steps |"
echo "|---|---:|---:|---:|---:|---:|"
for spec in "gpt-tiny models/gpt-tiny.onnx 8 model" "gpt-seq512 $dir/gpt512.onnx 2 random"; do
  read -r name model batch init <<<"$spec"
  args=(train "$model" --batch "$batch" --steps "$steps" --init "$init" --seed 1 --optimizer adamw --lr 1e-3)
  b=() a=()
  for ((r = 0; r < repeats; ++r)); do
    b+=("$("$before" "${args[@]}" 2>/dev/null | step_seconds "$dir/before.loss")")
    a+=("$("$after" "${args[@]}" 2>/dev/null | step_seconds "$dir/after.loss")")
  done
  tb=$(printf '%s\n' "${b[@]}" | sort -n | head -1)
  ta=$(printf '%s\n' "${a[@]}" | sort -n | head -1)
  echo "| $name | $batch | $tb | $ta | $(python3 -c "print(f'{$tb / $ta:.2f}×')") | $(loss_gap "$dir/after.loss" "$dir/before.loss") |"
done
