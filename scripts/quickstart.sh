#!/usr/bin/env bash
# Installs what is missing, builds apart in Release and runs the main job on the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release -DAPART_BUILD_TESTS=OFF -DAPART_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release --target apart -j"$(nproc)"
apart=build/release/cli/apart
echo
echo "== apart inspect models/gpt-tiny.onnx --dim batch=8"
"$apart" inspect models/gpt-tiny.onnx --dim batch=8
