#!/usr/bin/env bash
# Fidelity of the plan's predictions: apart profile (the runtime's measured per-task costs) → apart partition --profile
# → apart run --trace → apart simulate --compare, for gpt-tiny (batch 8) on 2 ranks pipelined (2 stages, 4
# micro-batches) and 2 ranks data-parallel (1 stage × 2 replicas), in ROUNDS rounds back to back. Each round profiles
# again, plans and runs; the summary gives every round's iteration and per-stage busy ratio (measured / predicted,
# medians over the run's steps) and their median over the rounds.
#
# Why rounds: on a shared VM the CPU's speed flips by up to 1.5× on a scale of seconds (back-to-back profiles of
# the same graph, alone, measured gpt-tiny's forward at 2.7 and 4.3 ms), so one profile and one run taken a few
# seconds apart can land in different states. A round whose profile and run agree in state shows the model's own
# error; the median over rounds is the systematic part.
#
# Usage: OMP_NUM_THREADS=1 bench/run_fidelity.sh [path/to/apart] [--mpi]
#   (default build/release/cli/apart, ranks as threads of one process; --mpi: mpirun, one process per rank)
# Environment: ROUNDS (default 5), STEPS (default 40; step 1 is left out as warm-up), MODEL (gpt-tiny),
#   VERBOSE=1 prints every round's whole comparison table, KINDS=all adds the plan kinds of issue 17: ZeRO-1 and
#   ZeRO-2 and ZeRO-3 data-parallel (1 stage × 2 replicas, 2 micro-batches), ZB-H1 pipelined and interleaved
#   pipelined (2 stages, 4 micro-batches; v = 2), tensor-parallel TP 2 × PP 1 (2 micro-batches) and TP 2 × PP 2
#   (4 ranks on this machine's 2 cores: oversubscribed, as the profile beside 3 twins measures it); KINDS="NAME …"
#   runs only the kinds named. KEEP=DIR keeps the profiles, plans, traces and comparisons in DIR.
set -euo pipefail
apart=${1:-build/release/cli/apart}
launch=(--in-process)
prefix=()
if [[ "${2:-}" == "--mpi" ]]; then
  launch=()
  prefix=(mpirun --timeout 600 --oversubscribe)  # -np: the plan's ranks
fi
model=${MODEL:-models/gpt-tiny.onnx}
steps=${STEPS:-40}
rounds=${ROUNDS:-5}
batch=8
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [[ -n "${KEEP:-}" ]]; then  # KEEP=DIR: the plans, traces and tables stay there, to read a miss op by op
  dir=$KEEP
  mkdir -p "$dir"
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi
# The load average tells how much of the 2 cores other processes took: the measured times stretch with it.
echo "apart fidelity: $model, batch $batch, $rounds rounds of $steps steps, OMP_NUM_THREADS=$OMP_NUM_THREADS," \
  "${prefix[*]:-in-process}, load average $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores"
# name stages replicas micro-batches schedule zero tp virtual-stages (0: none)
all_shapes=("pipelined 2 1 4 1f1b 0 1 0" "data-parallel 1 2 1 1f1b 0 1 0"
  "zero1-data-parallel 1 2 2 1f1b 1 1 0" "zero2-data-parallel 1 2 2 1f1b 2 1 0" "zero3-data-parallel 1 2 2 1f1b 3 1 0"
  "zb-h1-pipelined 2 1 4 zb-h1 0 1 0" "interleaved-pipelined 2 1 4 interleaved 0 1 2"
  "tp2-pp1 1 1 2 1f1b 0 2 0" "tp2-pp2 2 1 4 1f1b 0 2 0")
case "${KINDS:-}" in
  "") shapes=("${all_shapes[@]:0:2}") ;;
  all) shapes=("${all_shapes[@]}") ;;
  *)
    shapes=()
    for shape in "${all_shapes[@]}"; do [[ " $KINDS " == *" ${shape%% *} "* ]] && shapes+=("$shape"); done
    ((${#shapes[@]})) || { echo "KINDS names none of: ${all_shapes[*]%% *}" >&2; exit 2; } ;;
esac
for ((round = 1; round <= rounds; ++round)); do
  rm -f "$dir"/costs_*.json
  for shape in "${shapes[@]}"; do
    read -r name stages replicas microbatches schedule zero tp virtual <<<"$shape"
    mb=$((batch / microbatches / replicas))  # samples one rank runs per forward: what the profile must measure
    ranks=$((stages * replicas * tp))
    # The plan's ranks share this machine: the profile runs twins beside it (--ranks-per-node), as they will.
    [[ -f "$dir/costs_${mb}_$ranks.json" ]] || "$apart" profile "$model" --batch "$mb" --ranks-per-node "$ranks" \
      --repeats 20 -q -o "$dir/costs_${mb}_$ranks.json" 2>/dev/null
    chunks=()
    ((virtual > 0)) && chunks=(--virtual-stages "$virtual")
    "$apart" partition "$model" --profile "$dir/costs_${mb}_$ranks.json" --device cpu --devices "$ranks" --stages "$stages" \
      --replicas "$replicas" --tp "$tp" --microbatches "$microbatches" --batch "$batch" --schedule "$schedule" \
      "${chunks[@]}" --zero "$zero" --no-baselines -o "$dir/$name" >/dev/null
    run_prefix=()
    ((${#prefix[@]})) && run_prefix=("${prefix[@]}" -np "$ranks")
    "${run_prefix[@]}" "$apart" run "$dir/$name" "${launch[@]}" --steps "$steps" -q --trace-all-steps \
      --trace "$dir/$name.trace.json" >/dev/null 2>&1
    "$apart" simulate "$dir/$name" --compare "$dir/$name.trace.json" | sed -n '/^predicted (apart simulate)/,$p' \
      >"$dir/$name.$round.txt"
    if [[ "${VERBOSE:-0}" == 1 ]]; then
      echo "== round $round, $name: $stages stage(s) x $replicas replica(s), $microbatches micro-batch(es)"
      cat "$dir/$name.$round.txt"
      echo
    fi
  done
done
# The summary: per shape, a line per round (iteration predicted → measured, ratio; each stage's busy ratio).
for shape in "${shapes[@]}"; do
  read -r name stages replicas microbatches schedule zero tp virtual <<<"$shape"
  chunks=""
  ((virtual > 0)) && chunks=" (v = $virtual)"
  echo "== $name: $stages stage(s) x $replicas replica(s) x tp $tp, $schedule$chunks, $microbatches micro-batch(es) of" \
    "$((batch / microbatches))"
  for ((round = 1; round <= rounds; ++round)); do
    awk -v round="$round" '
      /^ +[0-9]+ +[0-9]+ \|/ { split($0, cells, "|"); split(cells[4], busy, " "); stages = stages sprintf("  stage %d busy %s %s → %s %s (%s)", $1, busy[1], busy[2], busy[3], busy[4], busy[5]) }
      /^iteration/ { it = sprintf("iteration %s %s predicted, %s %s measured, ratio %s", $2, $3, $5, $6, $9) }
      END { printf "round %d: %s |%s\n", round, it, stages }' "$dir/$name.$round.txt"
  done
  awk '/^iteration/ { print $9 }' "$dir"/"$name".*.txt | sort -n |
    awk '{ r[NR] = $1 } END { m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2;
           printf "iteration ratio over %d rounds: median %.2f, min %.2f, max %.2f\n\n", NR, m, r[1], r[NR] }'
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
