#!/usr/bin/env bash
# How `apart partition` planning time grows with tasks and devices: zoo GPTs of 12…96 layers (GPT-3 175B widths,
# weights none) × 8…16384 A100s, and a 1640-layer GPT of width 1024 (100k tasks), batch 1536, mixed precision.
# Prints a Markdown table of wall and CPU seconds and peak memory (max RSS), and the load average it ran under.
# Usage: bench/planning_scaling.sh [path/to/apart] [extra partition flags, e.g. --threads 1]
#        (default: build/release/cli/apart)
set -euo pipefail
apart=${1:-build/release/cli/apart}
shift || true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| layers | width | tasks | devices | wall s | CPU s | peak MiB | stages | simulated / placed candidates |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|"
row() {  # layers width devices
  local layers=$1 width=$2 devices=$3 model="$dir/gpt$1x$2.onnx"
  [ -f "$model" ] || "$apart" zoo gpt --layers "$layers" --hidden "$width" --heads $((width / 128)) --seq 2048 \
    --vocab 50257 --weights none -q -o "$model" >/dev/null
  local start end user sys rss
  start=$(date +%s.%N)
  if /usr/bin/time -f "%U %S %M" -o "$dir/time" "$apart" partition "$model" --devices "$devices" --batch 1536 \
      --precision mixed --no-baselines --no-stage-models "${@:4}" -o "$dir/plan" >/dev/null 2>&1; then
    end=$(date +%s.%N)
    read -r user sys rss < "$dir/time"
    read -r tasks stages sims placed < <(python3 -c "
import json; p = json.load(open('$dir/plan/plan.json'))
print(p['model']['tasks'], len(p['stages']), p['search']['simulated'], p['search']['candidates_placed'])")
    printf "| %d | %d | %d | %d | %.2f | %.2f | %d | %d | %d / %d |\n" "$layers" "$width" "$tasks" "$devices" \
      "$(echo "$end - $start" | bc)" "$(echo "$user + $sys" | bc)" $((rss / 1024)) "$stages" "$sims" "$placed"
  else
    printf "| %d | %d | — | %d | — | — | — | infeasible | |\n" "$layers" "$width" "$devices"
  fi
  rm -rf "$dir/plan"
}
for layers in 12 24 48 96; do
  for devices in 8 64 512 1024 4096 16384; do row "$layers" 12288 "$devices" "$@"; done
done
for devices in 1024 16384; do row 1640 1024 "$devices" "$@"; done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
