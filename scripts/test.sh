#!/usr/bin/env bash
# Installs what is missing, builds the dev preset (Debug, ASan+UBSan) and runs every test through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
cmake --preset dev >/dev/null
cmake --build --preset dev -j"$(nproc)"
ctest --preset dev
