#!/usr/bin/env bash
# Lints what a change touched: clang-format on the lines it changed (git clang-format, .clang-format) and clang-tidy
# on the library and CLI .cpp files it changed (.clang-tidy). BASE (default HEAD~1: on a clean clone, the last commit is what CI sees
# of a change) is the commit to compare with; BUILD (default build/dev) a configured build whose
# compile_commands.json names each file's flags (a file it does not compile, e.g. a fuzz target, is not tidied).
# TIDY: strict (default: a clang-tidy finding fails) or advisory (findings are printed, the exit status is format's
# alone: what CI runs, until the files a change touches are free of older findings). At most APART_LINT_MAX_TIDY
# files (default 8) are tidied, the rest named: clang-tidy takes 10-30 s a file.
# Exit 1 with the findings; 0 when clean or when there is nothing to compare with (a shallow clone).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
build=${2:-build/dev}
tidy_mode=${3:-strict}
max_tidy=${APART_LINT_MAX_TIDY:-8}
if ! git rev-parse -q --verify "${base}^{commit}" >/dev/null; then
  echo "lint: no commit ${base} to compare with; nothing checked"
  exit 0
fi
mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$base" -- '*.cpp' '*.h' '*.cu' '*.cuh' | grep -v '^tests/data/' || true)
if ((${#files[@]} == 0)); then
  echo "lint: no C++ file changed since ${base}"
  exit 0
fi
status=0
format=$(git clang-format --binary clang-format --diff "$base" -- "${files[@]}" 2>&1 || true)
if grep -q '^@@' <<<"$format"; then
  echo "$format"
  echo "lint: the lines above, changed since ${base}, are not formatted as .clang-format says (git clang-format ${base})"
  status=1
fi
if [ -f "$build/compile_commands.json" ]; then
  mapfile -t compiled < <(python3 -c 'import json,sys,os; print("\n".join(os.path.realpath(c["file"]) for c in json.load(open(sys.argv[1]))))' \
                            "$build/compile_commands.json")
  tidy=()
  for f in "${files[@]}"; do
    # The libraries and the CLI: tests and benchmarks are GoogleTest/Benchmark expansions, slow to tidy and noisy.
    [[ "$f" == *.cpp && "$f" != tests/* && "$f" != bench/* ]] || continue
    printf '%s\n' "${compiled[@]}" | grep -qxF "$(realpath "$f")" && tidy+=("$f")
  done
  if ((${#tidy[@]} > max_tidy)); then
    echo "lint: clang-tidy on the first ${max_tidy} of ${#tidy[@]} changed files; not tidied: ${tidy[*]:max_tidy}"
    tidy=("${tidy[@]:0:max_tidy}")
  fi
  if ((${#tidy[@]})); then
    findings=$(mktemp)
    tidy_status=0
    printf '%s\n' "${tidy[@]}" | xargs -P "$(nproc)" -n 1 clang-tidy -p "$build" --quiet >"$findings" 2>&1 || tidy_status=1
    grep -v ' warnings\? generated\.$' "$findings" || true
    rm -f "$findings"
    if ((tidy_status)); then
      if [ "$tidy_mode" = strict ]; then status=1; else echo "lint: clang-tidy findings above (advisory)"; fi
    fi
  fi
else
  echo "lint: no ${build}/compile_commands.json; clang-tidy skipped"
fi
if ((status == 0)); then echo "lint: ${#files[@]} changed C++ file(s) since ${base} pass clang-format and clang-tidy"; fi
exit $status
