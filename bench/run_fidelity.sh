#!/usr/bin/env bash
# Fidelity of the plan's predictions: apart profile (the runtime's measured per-task costs) → apart partition --profile
# → apart run --trace → apart simulate --compare, for gpt-tiny (batch 8) on 2 ranks pipelined (2 stages, 4
# micro-batches) and 2 ranks data-parallel (1 stage × 2 replicas). Prints each comparison table.
# Usage: OMP_NUM_THREADS=1 bench/run_fidelity.sh [path/to/apart] [--mpi]
#   (default build/release/cli/apart, ranks as threads of one process; --mpi: mpirun -np 2, one process per rank)
# Environment: STEPS (default 20; the comparison averages every traced step but the first), MODEL (gpt-tiny).
set -euo pipefail
apart=${1:-build/release/cli/apart}
launch=(--in-process)
prefix=()
if [[ "${2:-}" == "--mpi" ]]; then
  launch=()
  prefix=(mpirun --timeout 600 --oversubscribe -np 2)
fi
model=${MODEL:-models/gpt-tiny.onnx}
steps=${STEPS:-20}
batch=8
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The load average tells how much of the 2 cores other processes took: the measured times stretch with it.
echo "apart fidelity: $model, batch $batch, $steps steps, OMP_NUM_THREADS=$OMP_NUM_THREADS, ${prefix[*]:-in-process}," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores"
# name stages replicas micro-batches
for shape in "pipelined 2 1 4" "data-parallel 1 2 1"; do
  read -r name stages replicas microbatches <<<"$shape"
  mb=$((batch / microbatches / replicas))  # samples one rank runs per forward: what the profile must measure
  # Both shapes run 2 ranks on this machine: the profile runs a twin beside it (--ranks-per-node 2), as they will.
  [[ -f "$dir/costs_$mb.json" ]] || "$apart" profile "$model" --batch "$mb" --ranks-per-node 2 --repeats 20 -q \
    -o "$dir/costs_$mb.json"
  "$apart" partition "$model" --profile "$dir/costs_$mb.json" --device cpu --devices 2 --stages "$stages" \
    --replicas "$replicas" --microbatches "$microbatches" --batch "$batch" --schedule 1f1b --no-baselines \
    -o "$dir/$name" >/dev/null
  "${prefix[@]}" "$apart" run "$dir/$name" "${launch[@]}" --steps "$steps" -q --trace-all-steps \
    --trace "$dir/$name.trace.json" | sed 's/^/  /'
  echo
  echo "== $name: $stages stage(s) x $replicas replica(s), $microbatches micro-batch(es) of $((batch / microbatches))"
  "$apart" simulate "$dir/$name" --compare "$dir/$name.trace.json" | sed -n '/^predicted (apart simulate)/,$p'
  echo
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
