#!/usr/bin/env bash
# Installs what is missing, builds the dev preset (Debug, ASan+UBSan) and runs every test through CTest;
# the suites labelled slow run in a Release build of the targets they need; with the CUDA toolkit, the gpu preset too.
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
# The CUDA backend: where the toolkit is installed, the gpu preset (Release, APART_CUDA=ON) compiles and links
# everything, so the CUDA code never rots without a GPU; then its suites (label cuda) run: the host-side plans pass,
# the GPU tests skip with the reason where there is no device. About 45 min cold on 2 cores, 1.5 min with a warm
# ccache: used when installed.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  launchers=()
  if command -v ccache >/dev/null; then
    launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake --preset gpu "${launchers[@]}" >/dev/null
  cmake --build --preset gpu -j"$(nproc)"
  ctest --preset gpu
fi
