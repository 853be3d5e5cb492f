#!/usr/bin/env bash
# Installs the Debian packages apart needs, only those that are missing (a second run is instant).
# `deps.sh` installs what building apart needs (Open MPI too: `mpirun -np N apart run`); `deps.sh --test` adds what
# the test suite uses (GoogleTest, ONNX's test data and Python checker, Chromium for the report test, Graphviz);
# `deps.sh --fuzz` adds clang with its libFuzzer runtime and GNU time (scripts/fuzz.sh) to the test set.
set -euo pipefail
packages=(cmake g++ make pkg-config lld
  libonnx-dev libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcli11-dev libfmt-dev
  libmetis-dev libopenblas-dev libopenmpi-dev openmpi-bin)
if [ "${1:-}" = "--test" ] || [ "${1:-}" = "--fuzz" ]; then
  packages+=(libgtest-dev libgmock-dev libbenchmark-dev python3-onnx libonnx-testdata chromium graphviz)
fi
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-14-dev time)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "apart: installing missing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
