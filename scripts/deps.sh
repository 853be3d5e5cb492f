#!/usr/bin/env bash
# Installs the Debian packages apart needs, only those that are missing (a second run is instant).
set -euo pipefail
packages=(cmake g++ make pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libmetis-dev libopenblas-dev
  python3-onnx libonnx-testdata chromium graphviz)
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
