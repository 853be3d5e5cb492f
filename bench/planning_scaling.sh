#!/usr/bin/env bash
# How `apart partition` planning time grows with tasks and devices: zoo GPTs of 12…96 layers (GPT-3 175B widths,
# weights none) × 8…1024 A100s, batch 1536, mixed precision. Prints a Markdown table of wall and CPU seconds.
# Usage: bench/planning_scaling.sh [path/to/apart]   (default: build/release/cli/apart)
set -euo pipefail
apart=${1:-build/release/cli/apart}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "| layers | tasks | devices | wall s | CPU s | stages | simulated / placed candidates |"
echo "|---:|---:|---:|---:|---:|---:|---|"
for layers in 12 24 48 96; do
  "$apart" zoo gpt --layers "$layers" --hidden 12288 --heads 96 --seq 2048 --vocab 50257 --weights none \
    -o "$dir/gpt$layers.onnx" >/dev/null
  for devices in 8 64 512 1024; do
    start=$(date +%s.%N)
    if /usr/bin/time -f "%U %S" -o "$dir/time" "$apart" partition "$dir/gpt$layers.onnx" --devices "$devices" \
        --batch 1536 --precision mixed --no-baselines --no-stage-models -o "$dir/plan" >/dev/null 2>&1; then
      end=$(date +%s.%N)
      read -r user sys < "$dir/time"
      read -r tasks stages sims placed < <(python3 -c "
import json; p = json.load(open('$dir/plan/plan.json'))
print(p['model']['tasks'], len(p['stages']), p['search']['simulated'], p['search']['candidates_placed'])")
      printf "| %d | %d | %d | %.2f | %.2f | %d | %d / %d |\n" "$layers" "$tasks" "$devices" \
        "$(echo "$end - $start" | bc)" "$(echo "$user + $sys" | bc)" "$stages" "$sims" "$placed"
    else
      printf "| %d | — | %d | — | — | infeasible | |\n" "$layers" "$devices"
    fi
    rm -rf "$dir/plan"
  done
done
