#!/usr/bin/env bash
# Installs what is missing, builds apart in Release and runs the main job on the bundled model:
# what is in it, then a plan for 8 A100s (printed, and written to out/plan/), then its simulation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release -DAPART_BUILD_TESTS=OFF -DAPART_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release --target apart -j"$(nproc)"
apart=build/release/cli/apart
echo
echo "== apart inspect models/gpt-tiny.onnx --batch 8"
"$apart" inspect models/gpt-tiny.onnx --batch 8
echo
echo "== apart partition models/gpt-tiny.onnx --devices 8 --device a100-80gb --batch 256 -o out/plan/"
"$apart" partition models/gpt-tiny.onnx --devices 8 --device a100-80gb --devices-per-node 8 --batch 256 -o out/plan/
echo
echo "== apart simulate out/plan/ --trace out/plan/trace.json   (open it in https://ui.perfetto.dev)"
"$apart" simulate out/plan/ --trace out/plan/trace.json
