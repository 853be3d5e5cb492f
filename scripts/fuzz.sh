#!/usr/bin/env bash
# Builds the fuzz preset (clang, libFuzzer, ASan+UBSan, coverage on every library) and runs the fuzz targets of
# fuzz/ (docs/security.md, "Fuzzing"):
#   scripts/fuzz.sh [--seconds N] [--jobs J] [target...]      default: 60 s each, 2 at a time, every target
# Each target starts from its seeds (fuzz/seeds/<target>/, tests/regress/<target>/; import: also ONNX's backend test
# models up to 64 KiB) and grows build/fuzz/corpus/<target>/, which later runs resume. A crash, a sanitizer report,
# a hang past 10 s or 2 GiB of memory is a finding: its input is kept under build/fuzz/findings/<target>/, the
# summary names it with the commands that minimise it into tests/regress/<target>/, and the script exits 1.
# Prints per target: executions, coverage (edges), corpus size, wall and CPU seconds, findings.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
jobs=2
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(import plan costs cluster checkpoint)
[[ "$seconds" =~ ^[0-9]+$ ]] && ((seconds >= 1 && seconds <= 86400)) || { echo "fuzz.sh: --seconds takes 1..86400" >&2; exit 2; }
[[ "$jobs" =~ ^[0-9]+$ ]] && ((jobs >= 1 && jobs <= 64)) || { echo "fuzz.sh: --jobs takes 1..64" >&2; exit 2; }
for t in "${targets[@]}"; do
  [ -f "fuzz/$t.cpp" ] || { echo "fuzz.sh: no fuzz target '$t' (fuzz/*.cpp: import plan costs cluster checkpoint)" >&2; exit 2; }
done

bash scripts/deps.sh --fuzz
launchers=()
if command -v ccache >/dev/null; then
  launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake --preset fuzz "${launchers[@]}" >/dev/null
cmake --build --preset fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

out=build/fuzz
onnx_seeds="$out/seeds_onnx"
if [ ! -d "$onnx_seeds" ] && [ -d /usr/share/libonnx-testdata/data ]; then
  mkdir -p "$onnx_seeds.tmp"
  find /usr/share/libonnx-testdata/data -name model.onnx -size -65k | while read -r m; do
    cp "$m" "$onnx_seeds.tmp/$(basename "$(dirname "$m")").onnx"
  done
  mv "$onnx_seeds.tmp" "$onnx_seeds"
fi

run_one() {
  local t="$1"
  local corpus="$out/corpus/$t" findings="$out/findings/$t" log="$out/logs/$t.log"
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  local seeds=(fuzz/seeds/"$t" tests/regress/"$t")
  [ "$t" = import ] && [ -d "$onnx_seeds" ] && seeds+=("$onnx_seeds")
  local rc=0
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    /usr/bin/time -f "%U %S" -o "$log.cpu" "$out/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$corpus" "${seeds[@]}" >"$log" 2>&1 || rc=$?
  echo "$rc" >"$log.rc"
}
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
done
wait

status=0
printf '%-11s %10s %8s %8s %9s %9s  %s\n' target executions edges corpus seconds 'CPU s' findings
for t in "${targets[@]}"; do
  log="$out/logs/$t.log"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  edges=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  corp=$(find "$out/corpus/$t" -type f | wc -l)
  found=$(find "$out/findings/$t" -type f | wc -l)
  cpu=$(awk 'NF == 2 { printf "%.0f", $1 + $2 }' "$log.cpu" 2>/dev/null || true)
  printf '%-11s %10s %8s %8s %9s %9s  %s\n' "$t" "${execs:-?}" "${edges:-?}" "$corp" "$seconds" "${cpu:-?}" "$found"
  if [ "$(cat "$log.rc")" != 0 ] || ((found > 0)); then
    status=1
    echo "  $t: a finding (exit $(cat "$log.rc")); the report is in $log:" >&2
    grep -E 'ERROR|SUMMARY|apart fuzz|Test unit written' "$log" | head -5 | sed 's/^/    /' >&2
    for f in "$out/findings/$t"/*; do
      [ -f "$f" ] || continue
      echo "    minimise: $out/fuzz/fuzz_$t -minimize_crash=1 -runs=20000 -exact_artifact_path=tests/regress/$t/$(basename "$f") $f" >&2
    done
  fi
done
exit "$status"
