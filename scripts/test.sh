#!/usr/bin/env bash
# Installs what is missing, builds the dev preset (Debug, ASan+UBSan) and runs every test through CTest;
# the suites labelled slow run in a Release build of the targets they need; with the CUDA toolkit, the gpu preset too.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, printed at the end (and when a phase fails), so a CI log says where its minutes went.
phase_times=()
current_phase="" phase_start=0
phase() {
  current_phase=$1 phase_start=$SECONDS
  shift
  "$@"
  phase_times+=("$(printf '%6d s  %s' $((SECONDS - phase_start)) "$current_phase")")
  current_phase=""
}
report_phases() {
  local rc=$?
  echo "apart test: wall time by phase (${SECONDS} s in all, exit status ${rc}):"
  for line in "${phase_times[@]}"; do echo "$line"; done
  [ -z "$current_phase" ] || printf '%6d s  %s (failed)\n' $((SECONDS - phase_start)) "$current_phase"
}
trap report_phases EXIT
phase "install missing packages" bash scripts/deps.sh --test
phase "configure dev" cmake --preset dev >/dev/null
phase "build dev (ASan+UBSan)" cmake --build --preset dev -j"$(nproc)"
# The last commit's C++ lines formatted as .clang-format says (failing); clang-tidy's findings on its library and CLI
# files printed (advisory until the files are free of older findings; 4 files at most, 10-30 CPU s each).
phase "lint (the last commit's C++ files)" env APART_LINT_MAX_TIDY=4 bash scripts/lint.sh HEAD~1 build/dev advisory
# The test presets run two tests at a time with one compute thread each (OMP_NUM_THREADS=1 in CMakePresets.json):
# two cores, and a test's ranks as threads each spawning kernel threads would otherwise oversubscribe them (a ZeRO
# run: 12.7 → 7.9 CPU s). Tests of the thread count set it themselves.
phase "dev suite (-LE slow)" ctest --preset dev -LE slow
# The slow suites (label slow: the end-to-end runs of apart train and apart run — ZeRO, tensor-parallel, interleaved,
# loss-scaled and device-message plans, under mpirun too —, the plan goldens of real models on up to 1024 devices, the
# real models' plans and stage files, apart run on a ResNet and on GPT-2 small, the documents' commands) in a Release
# build of the targets they need: under ASan+UBSan the end-to-end runs were two thirds of the dev suite's time.
# Where the CUDA toolkit is
# installed that build is the gpu preset (Release, APART_CUDA=ON; CI: sm_90 only, to halve nvcc's time), so one
# Release build both runs the slow suites and compiles and links the CUDA backend, its tests and the GPU benchmark:
# the CUDA code never rots without a GPU. Its suites (label cuda) run too: the host-side plans pass, the GPU tests
# skip with the reason where there is no device.
# The slow suites' targets, as the configured build lists them (tests/CMakeLists.txt), and apart itself.
read_slow_targets() {
  local list
  list=$(cat "$1/slow_test_targets.txt")
  IFS=';' read -r -a slow_targets <<<"apart;$list"
}
if [ -x /usr/local/cuda/bin/nvcc ]; then
  launchers=()
  if command -v ccache >/dev/null; then
    launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  phase "configure gpu" cmake --preset gpu "${launchers[@]}" -DCMAKE_CUDA_ARCHITECTURES="${APART_CUDA_ARCHITECTURES:-90}" \
    >/dev/null
  read_slow_targets build/gpu
  phase "build gpu (Release, CUDA)" cmake --build --preset gpu -j"$(nproc)" --target "${slow_targets[@]}" \
    runtime_cuda_tests runtime_cuda_plan_tests bench_gpu_layers
  phase "slow suite (-L slow)" ctest --test-dir build/gpu --output-on-failure -j2 --timeout 900 -L slow
  phase "gpu suite (-L cuda)" ctest --preset gpu
else
  phase "configure release" cmake --preset release -DAPART_BUILD_BENCH=OFF >/dev/null
  read_slow_targets build/release
  phase "build release" cmake --build --preset release -j"$(nproc)" --target "${slow_targets[@]}"
  phase "slow suite (-L slow)" ctest --preset release -L slow
fi
