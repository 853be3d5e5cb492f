#!/usr/bin/env bash
# Korthikanti et al., MLSys'23 ("Reducing Activation Recomputation in Large Transformer Models"), Table 5: measured
# iteration seconds of GPT models on A100s (sequence 2048, vocabulary 51200, micro-batch 1, mixed precision) with full
# recomputation. Each row's configuration pinned (--tp 8 --pp P --dp 1 --microbatches B --recompute on, and the
# paper's schedule where the planner has it), apart's simulated iteration printed beside the paper's, with the error.
# Sequence parallelism and selective recomputation (the paper's second column) are not modelled yet.
# Usage: bench/korthikanti_table.sh [path/to/apart] [extra partition flags]   (default: build/release/cli/apart)
set -euo pipefail
apart=${1:-build/release/cli/apart}
shift || true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# name layers hidden heads PP GPUs batch virtual-stages measured-full-recompute-s measured-sp+selective-s
rows=(
  "22B 48 6144 64 1 8 4 1 1.42 1.10"
  "175B 96 12288 96 8 64 64 3 18.13 13.75"
  "530B 105 20480 128 35 280 280 3 49.05 37.83"
  "1T 128 25600 160 64 512 512 1 94.42 71.49"
)
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | GPUs | TP×PP | schedule | paper s (full recompute) | apart s | error | plan s |"
echo "|---|---:|---|---|---:|---:|---:|---:|"
for row in "${rows[@]}"; do
  read -r name layers hidden heads pp gpus batch v full _ <<< "$row"
  model="$dir/gpt_$name.onnx"
  "$apart" zoo gpt --layers "$layers" --hidden "$hidden" --heads "$heads" --seq 2048 --vocab 51200 --weights none \
    -q -o "$model" >/dev/null
  schedule=(--schedule 1f1b)
  label=1f1b
  if [ "$v" -gt 1 ]; then
    schedule=(--schedule interleaved --virtual-stages "$v")
    label="interleaved v=$v"
  fi
  t0=$(date +%s.%N)
  if "$apart" partition "$model" --device a100-80gb --devices "$gpus" --devices-per-node 8 --batch "$batch" \
      --precision mixed --tp 8 --pp "$pp" --dp 1 --microbatches "$batch" --recompute on "${schedule[@]}" \
      --no-baselines --no-stage-models -q "$@" -o "$dir/plan" > "$dir/log" 2>&1; then
    t1=$(date +%s.%N)
    read -r it err < <(python3 -c "
import json; it = json.load(open('$dir/plan/plan.json'))['predicted']['iteration_s']
print('%.2f %+.1f%%' % (it, 100 * (it - $full) / $full))")
  else
    t1=$(date +%s.%N)
    it="failed: $(tail -1 "$dir/log" | cut -c1-80)"; err="-"
  fi
  printf "| %s | %d | 8×%d | %s | %s | %s | %s | %.1f |\n" "$name" "$gpus" "$pp" "$label" "$full" "$it" "$err" \
    "$(echo "$t1 - $t0" | bc)"
  rm -rf "$dir/plan" "$model"
done
