#!/usr/bin/env bash
# Runs every command the user documents show, so that they cannot go stale: each `$ ` line of a ```console block
# in docs/getting-started.md and README.md (a line ending in `\` continues on the next), in order, in one scratch
# folder, with `apart` on PATH. Fails on the first command that exits non-zero, or that names a path outside the
# scratch folder (absolute, `~` or `..`).
#
#   bash scripts/docs_check.sh path/to/apart [DOC.md …]
#
# The commands run with HOME, TMPDIR and the caches inside the scratch folder, which is removed at the end
# (APART_DOCS_KEEP=1 keeps it). `mpirun` lines run where Open MPI is installed and are skipped where it is not; as
# root they get Open MPI's two run-as-root variables, as the documents say they need.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 path/to/apart [DOC.md …]" >&2
  exit 2
fi
apart_binary=$(realpath "$1")
shift
source_dir=$(realpath "$(dirname "$0")/..")
if [ $# -gt 0 ]; then docs=("$@"); else docs=("$source_dir/docs/getting-started.md" "$source_dir/README.md"); fi
[ -x "$apart_binary" ] || { echo "docs_check: $apart_binary is not an executable" >&2; exit 2; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/apart-docs-check.XXXXXX")
cleanup() { if [ "${APART_DOCS_KEEP:-0}" = 1 ]; then echo "docs_check: kept $scratch"; else rm -rf "$scratch"; fi; }
trap cleanup EXIT
mkdir -p "$scratch/bin" "$scratch/home" "$scratch/tmp" "$scratch/work"
ln -s "$apart_binary" "$scratch/bin/apart"

# Prints each command of a document's console blocks on one line (continuations joined).
extract_commands() {
  awk '
    /^```console[[:space:]]*$/ { in_block = 1; next }
    /^```/                     { in_block = 0; pending = ""; next }
    in_block && pending != ""  { line = $0; sub(/^[[:space:]]*/, "", line); pending = pending " " line
                                 if (pending ~ /\\$/) { sub(/[[:space:]]*\\$/, "", pending); next }
                                 print pending; pending = ""; next }
    in_block && /^\$ /         { line = substr($0, 3)
                                 if (line ~ /\\$/) { sub(/[[:space:]]*\\$/, "", line); pending = line; next }
                                 print line }
  ' "$1"
}

export PATH="$scratch/bin:$PATH" HOME="$scratch/home" TMPDIR="$scratch/tmp" XDG_CACHE_HOME="$scratch/home/.cache"
export APART_CACHE_DIR="$scratch/home/.cache/apart"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
have_mpirun=0
command -v mpirun >/dev/null && have_mpirun=1

start=$SECONDS
ran=0 skipped=0
for doc in "${docs[@]}"; do
  mapfile -t commands < <(extract_commands "$doc")
  [ ${#commands[@]} -gt 0 ] || { echo "docs_check: no \$ lines in a console block of $doc" >&2; exit 1; }
  for cmd in "${commands[@]}"; do
    if [[ "$cmd" =~ (^|[[:space:]=:])(/|~|\.\./)|(^|/|[[:space:]])\.\.($|/|[[:space:]]) ]]; then
      echo "docs_check: FAIL ($(basename "$doc")): names a path outside the scratch folder: $cmd" >&2
      exit 1
    fi
    if [[ "$cmd" == *mpirun* && $have_mpirun = 0 ]]; then
      echo "skip (no mpirun): \$ $cmd"
      skipped=$((skipped + 1))
      continue
    fi
    t0=$SECONDS
    if ! (cd "$scratch/work" && bash -o pipefail -c "$cmd") </dev/null >"$scratch/out.txt" 2>&1; then
      echo "docs_check: FAIL ($(basename "$doc")): \$ $cmd" >&2
      tail -n 40 "$scratch/out.txt" >&2
      exit 1
    fi
    echo "ok $((SECONDS - t0))s: \$ $cmd"
    ran=$((ran + 1))
  done
done
echo "docs_check: $ran commands passed, $skipped skipped, in $((SECONDS - start)) s"
