#!/usr/bin/env bash
# Korthikanti et al., MLSys'23 ("Reducing Activation Recomputation in Large Transformer Models"), Table 5: measured
# iteration seconds of GPT models on A100s (sequence 2048, vocabulary 51200, micro-batch 1, mixed precision), with full
# recomputation and with sequence parallelism + selective recomputation. Each row's configuration pinned (--tp 8
# --pp P --dp 1 --microbatches B and the paper's schedule), once as --sequence-parallel off --recompute on and once as
# --sequence-parallel on --recompute selective; apart's simulated iteration printed beside the paper's, with the
# error, and the mean and largest absolute error of each column at the end. Attention is priced materialised
# (--attention materialized): the paper's Megatron-LM wrote the seq x seq scores (no FlashAttention yet).
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
echo "| model | GPUs | TP×PP | schedule | paper s (full recompute) | apart s | error | paper s (SP + selective) | apart s | error | plan s |"
echo "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"
errors_full=()
errors_sel=()
plan() {  # model gpus pp batch out extra-flags… → iteration seconds, or "failed: …"
  local model=$1 gpus=$2 pp=$3 batch=$4 out=$5
  shift 5
  if "$apart" partition "$model" --device a100-80gb --devices "$gpus" --devices-per-node 8 --batch "$batch" \
      --precision mixed --attention materialized --tp 8 --pp "$pp" --dp 1 --microbatches "$batch" --no-baselines --no-stage-models -q \
      -o "$out" "$@" > "$out.log" 2>&1; then
    python3 -c "import json; print('%.2f' % json.load(open('$out/plan.json'))['predicted']['iteration_s'])"
  else
    echo "failed: $(tail -1 "$out.log" | cut -c1-60)"
  fi
}
error() { python3 -c "print('%+.1f%%' % (100 * ($1 - $2) / $2))" 2>/dev/null || echo "-"; }
for row in "${rows[@]}"; do
  read -r name layers hidden heads pp gpus batch v full selective <<< "$row"
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
  it_full=$(plan "$model" "$gpus" "$pp" "$batch" "$dir/full" --sequence-parallel off --recompute on "${schedule[@]}" "$@")
  it_sel=$(plan "$model" "$gpus" "$pp" "$batch" "$dir/sel" --sequence-parallel on --recompute selective "${schedule[@]}" "$@")
  t1=$(date +%s.%N)
  e_full=$(error "$it_full" "$full")
  e_sel=$(error "$it_sel" "$selective")
  errors_full+=("$e_full")
  errors_sel+=("$e_sel")
  printf "| %s | %d | 8×%d | %s | %s | %s | %s | %s | %s | %s | %.1f |\n" "$name" "$gpus" "$pp" "$label" "$full" \
    "$it_full" "$e_full" "$selective" "$it_sel" "$e_sel" "$(echo "($t1 - $t0) / 2" | bc -l)"
  rm -rf "$dir/full" "$dir/sel" "$model"
done
summary() {  # label errors… → "label: mean |e| x %, max y %"
  local label=$1
  shift
  python3 -c "
import sys; e = [abs(float(x.rstrip('%'))) for x in sys.argv[1:] if x != '-']
print('$label: mean |error| %.1f %%, max %.1f %% over %d rows' % (sum(e) / len(e), max(e), len(e)) if e else '$label: no rows')" "$@"
}
echo
summary "full recomputation" "${errors_full[@]}"
summary "sequence parallel + selective recomputation" "${errors_sel[@]}"
