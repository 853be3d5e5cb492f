#!/usr/bin/env bash
# Preemption soak: `mpirun -np 3 apart run` of gpt-tiny (2 stages, the second with 2 replicas) for STEPS steps
# straight, and the same run stopped by SIGUSR1 to mpirun (Slurm's --signal) every ~EVERY steps and resumed from its
# checkpoint until it finishes. Every step's loss (--metrics, full double precision) of the interrupted run must equal
# the straight run's bitwise; the script prints how many stops, resumes and equal steps there were, and exits 1 on
# any difference.
#
# Usage: bench/preemption_soak.sh [path/to/apart]   (default build/release/cli/apart)
# Environment: STEPS (default 2000), EVERY (default 200), KEEP=DIR keeps the plan, checkpoints and metrics.
set -euo pipefail
apart=$(realpath "${1:-build/release/cli/apart}")
steps=${STEPS:-2000}
every=${EVERY:-200}
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi=(mpirun --timeout 3600 --oversubscribe -np 3)

"$apart" zoo gpt-tiny -q -o "$work/model.onnx"
"$apart" partition "$work/model.onnx" --device cpu --devices 3 --stages 2 --batch 12 --microbatches 4 -q \
  -o "$work/plan" >/dev/null
# The plan must be 1 + 2 replicas (3 ranks): say so if the planner chose otherwise.
grep -q '"replicas": 2' "$work/plan/plan.json" || echo "note: the plan's stages are not 1 + 2 replicas"

start=$SECONDS
"${mpi[@]}" "$apart" run "$work/plan" --steps "$steps" --metrics "$work/straight.jsonl" -q >/dev/null
straight_s=$((SECONDS - start))

# The interrupted run: each segment writes its own metrics; SIGUSR1 to mpirun once the segment has done `every` steps.
segment=0 stops=0
start=$SECONDS
while :; do
  resume=()
  [ -f "$work/ck/manifest.json" ] && resume=(--resume "$work/ck")
  metrics="$work/part_$segment.jsonl"
  "${mpi[@]}" "$apart" run "$work/plan" --steps "$steps" --checkpoint-dir "$work/ck" "${resume[@]}" \
    --metrics "$metrics" -q >"$work/segment_$segment.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ -f "$metrics" ] && (($(wc -l <"$metrics") >= every)); then
      kill -USR1 "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rc=0
  wait "$pid" || rc=$?
  segment=$((segment + 1))
  if ((rc == 0)); then break; fi
  if ((rc != 75)); then
    echo "segment $segment ended with exit status $rc (75: stopped with a checkpoint):"
    tail -5 "$work/segment_$((segment - 1)).log"
    exit 1
  fi
  stops=$((stops + 1))
done
interrupted_s=$((SECONDS - start))

python3 - "$work" "$steps" "$segment" <<'EOF'
import json, sys
work, steps, segments = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def losses(path):
    return {j["step"]: j["loss"] for j in map(json.loads, open(path))}
straight = losses(f"{work}/straight.jsonl")
resumed = {}
for k in range(segments):
    resumed.update(losses(f"{work}/part_{k}.jsonl"))
missing = [s for s in range(1, steps + 1) if s not in resumed]
differ = [s for s in range(1, steps + 1) if s in resumed and resumed[s] != straight.get(s)]
equal = steps - len(missing) - len(differ)
print(f"steps {steps}: {equal} equal bitwise, {len(differ)} differ, {len(missing)} missing"
      + (f" (first differing step {differ[0]}: {resumed[differ[0]]!r} vs {straight[differ[0]]!r})" if differ else ""))
sys.exit(1 if differ or missing else 0)
EOF
echo "stops ${stops} (SIGUSR1 to mpirun, exit 75 each), segments ${segment}; straight ${straight_s} s, interrupted ${interrupted_s} s"
