#!/usr/bin/env bash
# Narayanan et al., SC21, Table 1 (GPT, vocabulary 51200, sequence 2048, A100-80GB, 8 per node, mixed precision):
# each row planned twice with the a100-80gb preset, pinned to the paper's configuration (--tp/--pp/--dp, full
# recomputation, no sequence parallelism (Megatron-LM had none in 2021), and, where it pipelines, micro-batch 1 and the interleaved schedule, as the paper ran it; the preset's
# calibration was fit on these pins, docs/cost-model.md §3) and searched freely (--tp auto --schedule auto, every
# other option automatic), printing apart's predicted
# TFLOP/s per GPU beside the paper's, by the paper's own formula (its eq. 3, which counts full recomputation):
#   96 · B · s · l · h² · (1 + s/(6h) + V/(16·l·h)) / (iteration · GPUs)
# and the planning wall time of each run. Models are zoo GPTs with --weights none (shapes only). Both runs price
# attention materialised (--attention materialized): the paper's Megatron-LM predates its FlashAttention support and
# wrote the seq x seq scores (the calibration, docs/cost-model.md §3, is fit so).
# Usage: bench/megatron_table.sh [path/to/apart] [first-row] [last-row] [extra partition flags for both runs]
#        (default: build/release/cli/apart, rows 1..10)
set -euo pipefail
apart=${1:-build/release/cli/apart}
first=${2:-1}
last=${3:-10}
shift $(( $# < 3 ? $# : 3 )) || true
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# params layers hidden heads TP PP GPUs batch paper-TFLOP/s
rows=(
  "1.7B 24 2304 24 1 1 32 512 137"
  "3.6B 30 3072 32 2 1 64 512 138"
  "7.5B 36 4096 32 4 1 128 512 142"
  "18.4B 40 6144 48 8 1 256 1024 135"
  "39.1B 48 8192 64 8 2 512 1536 138"
  "76.1B 60 10240 80 8 4 1024 1792 140"
  "145.6B 80 12288 96 8 8 1536 2304 148"
  "310.1B 96 16384 128 8 16 1920 2160 155"
  "529.6B 105 20480 128 8 35 2520 2520 163"
  "1008B 128 25600 160 8 64 3072 3072 163"
)
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| params | GPUs | paper TFLOP/s | pinned (TP×PP×DP) TFLOP/s | error | plan s | searched TFLOP/s | found | plan s |"
echo "|---|---:|---:|---:|---:|---:|---:|---|---:|"
tflops() {  # plan.json layers hidden batch GPUs → "TFLOP/s|config"
  python3 - "$@" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); l, h, B, gpus = (int(x) for x in sys.argv[2:6]); s, V = 2048, 51200
it = p['predicted']['iteration_s']
flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
st = p['stages']
tps = sorted({x.get('tp', 1) for x in st}); reps = sorted({x['replicas'] for x in st})
rc = sum(1 for x in st if x['recompute'])
zero = sorted({x.get('zero', 0) for x in st})
cfg = "TP%s PP%d DP%s m=%d %s recompute %d/%d%s" % ("/".join(map(str, tps)), len(st), "/".join(map(str, reps)),
      p['training']['microbatches'], p['training']['schedule'], rc, len(st),
      "" if zero == [0] else " ZeRO-" + "/".join(map(str, zero)))
print("%.1f|%s" % (flops / (it * gpus) / 1e12, cfg))
PY
}
n=0
for row in "${rows[@]}"; do
  n=$((n + 1))
  [ "$n" -lt "$first" ] || [ "$n" -gt "$last" ] && continue
  read -r params layers hidden heads tp pp gpus batch paper <<< "$row"
  model="$dir/gpt_$params.onnx"
  "$apart" zoo gpt --layers "$layers" --hidden "$hidden" --heads "$heads" --seq 2048 --vocab 51200 --weights none \
    -q -o "$model" >/dev/null
  common=(--device a100-80gb --devices "$gpus" --devices-per-node 8 --batch "$batch" --precision mixed
          --attention materialized --no-baselines --no-stage-models -q "$@")
  dp=$((gpus / (tp * pp)))
  # The paper ran the interleaved schedule where it pipelined (its v per row is not in the table: 2 here).
  # Micro-batch 1 per replica where it pipelines (as the fit); without a pipeline the micro-batch count is searched.
  schedule=()
  [ "$pp" -gt 1 ] && schedule=(--schedule interleaved --virtual-stages "${MEGATRON_V:-2}" --microbatches $((batch / dp)))
  t0=$(date +%s.%N)
  if "$apart" partition "$model" "${common[@]}" --tp "$tp" --pp "$pp" --dp "$dp" --recompute on --sequence-parallel off \
      "${schedule[@]}" -o "$dir/pinned" \
      > "$dir/pinned.log" 2>&1; then
    t1=$(date +%s.%N)
    IFS='|' read -r pinned _ < <(tflops "$dir/pinned/plan.json" "$layers" "$hidden" "$batch" "$gpus")
    err=$(python3 -c "print('%+.1f %%' % (100 * ($pinned - $paper) / $paper))")
    pinned_s=$(echo "$t1 - $t0" | bc)
  else
    t1=$(date +%s.%N)
    pinned="failed: $(tail -1 "$dir/pinned.log" | cut -c1-80)"; err="-"; pinned_s=$(echo "$t1 - $t0" | bc)
  fi
  t0=$(date +%s.%N)
  if "$apart" partition "$model" "${common[@]}" --tp auto --schedule auto -o "$dir/free" > "$dir/free.log" 2>&1; then
    t1=$(date +%s.%N)
    IFS='|' read -r free found < <(tflops "$dir/free/plan.json" "$layers" "$hidden" "$batch" "$gpus")
  else
    t1=$(date +%s.%N)
    free="failed"; found="$(tail -1 "$dir/free.log" | cut -c1-80)"
  fi
  printf "| %s | %d | %d | %s (%dx%dx%d) | %s | %.1f | %s | %s | %.1f |\n" "$params" "$gpus" "$paper" "$pinned" \
    "$tp" "$pp" "$dp" "$err" "$pinned_s" "$free" "$found" "$(echo "$t1 - $t0" | bc)"
  rm -rf "$dir/pinned" "$dir/free" "$model"
done
