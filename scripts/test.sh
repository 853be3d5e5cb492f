#!/usr/bin/env bash
# Installs what is missing, builds the dev preset (Debug, ASan+UBSan) and runs every test through CTest;
# the suites labelled slow run in a Release build of the targets they need.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
cmake --preset dev >/dev/null
cmake --build --preset dev -j"$(nproc)"
ctest --preset dev -LE slow
# The slow suites (label slow: the plan goldens of real models on up to 1024 devices, apart run on a ResNet) in Release.
cmake --preset release -DAPART_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release -j"$(nproc)" --target apart cli_plan_goldens_tests runtime_pipeline_resnet_tests
ctest --preset release -L slow
