// The stage memory formula per optimizer and precision, schedules and recomputation.
#include "profiler/memory_model.h"

#include <gtest/gtest.h>

namespace apart {
namespace {


TEST(BytesPerParam, MatchesTheClosedFormForEachOptimizerAndPrecision) {
  EXPECT_EQ(bytes_per_param(Optimizer::kSgd, Precision::kFp32), 8);
  EXPECT_EQ(bytes_per_param(Optimizer::kMomentum, Precision::kFp32), 12);
  EXPECT_EQ(bytes_per_param(Optimizer::kAdam, Precision::kFp32), 16);
  // Mixed: fp16 weights and grads (2 + 2) + fp32 master (4) + fp32 state.
  EXPECT_EQ(bytes_per_param(Optimizer::kSgd, Precision::kMixed), 8);
  EXPECT_EQ(bytes_per_param(Optimizer::kMomentum, Precision::kMixed), 12);
  EXPECT_EQ(bytes_per_param(Optimizer::kAdam, Precision::kMixed), 16);
}

TEST(StageMemory, AddsStateActivationsTimesInFlightAndWorkspace) {
  StageMemoryInput in;
  in.param_bytes = 4'000'000;  // 1M fp32 params
  in.saved_bytes_per_microbatch = 1000;
  in.stage_input_bytes_per_microbatch = 100;
  in.max_workspace_bytes = 7;
  in.in_flight = 3;
  for (auto opt : {Optimizer::kSgd, Optimizer::kMomentum, Optimizer::kAdam})
    for (auto prec : {Precision::kFp32, Precision::kMixed}) {
      in.optimizer = opt;
      in.precision = prec;
      const StageMemory m = stage_memory(in);
      EXPECT_EQ(m.weights + m.gradients + m.optimizer_state,
                static_cast<int64_t>(1'000'000 * bytes_per_param(opt, prec)));
      EXPECT_EQ(m.activations, 3000);
      EXPECT_EQ(m.total, m.weights + m.gradients + m.optimizer_state + 3000 + 7);
      EXPECT_EQ(stage_memory_bytes(in), m.total);
    }
  in.optimizer = Optimizer::kAdam;
  in.precision = Precision::kMixed;
  EXPECT_EQ(stage_memory(in).weights, 6'000'000);  // fp16 copy + fp32 master
  EXPECT_EQ(stage_memory(in).gradients, 2'000'000);
  EXPECT_EQ(stage_memory(in).optimizer_state, 8'000'000);
}

TEST(StageMemory, KeepsOnlyStageInputsPerMicroBatchWithRecomputation) {
  StageMemoryInput in;
  in.saved_bytes_per_microbatch = 1000;
  in.stage_input_bytes_per_microbatch = 100;
  in.in_flight = 4;
  in.recompute = true;
  EXPECT_EQ(stage_memory(in).activations, 4 * 100 + 1000);
}

TEST(StateBytesPerParamByte, IsBytesPerParamOverTheFourBytesOfAStoredFp32Param) {
  // Weights + gradients + state per stored fp32 byte: sgd 8/4, momentum 12/4, adam 16/4, mixed alike.
  for (auto prec : {Precision::kFp32, Precision::kTf32, Precision::kMixed}) {
    EXPECT_EQ(state_bytes_per_param_byte(Optimizer::kSgd, prec), 2.0);
    EXPECT_EQ(state_bytes_per_param_byte(Optimizer::kMomentum, prec), 3.0);
    EXPECT_EQ(state_bytes_per_param_byte(Optimizer::kAdam, prec), 4.0);
    EXPECT_EQ(state_bytes_per_param_byte(Optimizer::kAdam, prec) * kParamStorageBytes, bytes_per_param(Optimizer::kAdam, prec));
  }
  EXPECT_EQ(weight_bytes_per_param(Precision::kMixed), 6);  // fp16 copy + fp32 master
  EXPECT_EQ(optimizer_state_bytes_per_param(Optimizer::kMomentum), 4);
}

TEST(TheOptimizerStep, MovesMasterGradientsAndStateThroughMemoryOnce) {
  // Adam fp32 per param: reads weight, gradient, m, v (16 B), writes weight, m, v (12 B), zeroes the gradient (4 B).
  EXPECT_EQ(optimizer_traffic_bytes_per_param_byte(Optimizer::kAdam, Precision::kFp32) * kParamStorageBytes, 32);
  EXPECT_EQ(optimizer_traffic_bytes_per_param_byte(Optimizer::kAdamW, Precision::kTf32) * kParamStorageBytes, 32);
  EXPECT_EQ(optimizer_traffic_bytes_per_param_byte(Optimizer::kMomentum, Precision::kFp32) * kParamStorageBytes, 24);
  EXPECT_EQ(optimizer_traffic_bytes_per_param_byte(Optimizer::kSgd, Precision::kFp32) * kParamStorageBytes, 16);
  // Mixed: the 16-bit copy is written too (2 B), the gradients are 16-bit (2 + 2 B): 4 + 6 + 4 + 16.
  EXPECT_EQ(optimizer_traffic_bytes_per_param_byte(Optimizer::kAdam, Precision::kMixed) * kParamStorageBytes, 30);
  // 1 M fp32 params (4 MB) with Adam at 10 GB/s: 32 MB / 10 GB/s.
  EXPECT_DOUBLE_EQ(optimizer_step_time(4'000'000, Optimizer::kAdam, Precision::kFp32, 10e9), 32e6 / 10e9);
  EXPECT_EQ(optimizer_step_time(0, Optimizer::kAdam, Precision::kFp32, 10e9), 0);
  EXPECT_EQ(optimizer_step_time(4'000'000, Optimizer::kAdam, Precision::kFp32, 0), 0);  // no bandwidth: not costed
}

// Rajbhandari et al., SC20, Figure 1: Ψ = 7.5B parameters, N_d = 64, mixed-precision Adam (K = 12).
TEST(AZeroShardedStage, HoldsThePapersPublishedBytesPerDevice) {
  const double psi = 7.5e9;
  auto gb = [&](int zero) { return psi * param_state_bytes(Optimizer::kAdam, Precision::kMixed, zero, 64).total() / 1e9; };
  EXPECT_DOUBLE_EQ(gb(0), 120.0);                    // (2 + 2 + 12) Ψ
  EXPECT_NEAR(gb(1), 31.4, 0.05);                    // P_os: 2Ψ + 2Ψ + 12Ψ/N_d = 31.40625
  EXPECT_NEAR(gb(2), 16.6, 0.05);                    // P_os+g: 2Ψ + 14Ψ/N_d = 16.640625
  EXPECT_NEAR(gb(3), 1.9, 0.05);                     // P_os+g+p: 16Ψ/N_d = 1.875
  EXPECT_DOUBLE_EQ(gb(1), 30.0 + 90.0 / 64);
  EXPECT_DOUBLE_EQ(gb(2), 15.0 + 105.0 / 64);
  EXPECT_DOUBLE_EQ(gb(3), 120.0 / 64);
}

TEST(AZeroShardedStage, KeepsAnNthOfEachShardedPartForEveryOptimizerAndPrecision) {
  for (Optimizer opt : kOptimizers)
    for (Precision prec : kPrecisions)
      for (int n : {2, 3, 8}) {
        const double w = working_weight_bytes_per_param(prec), master = master_weight_bytes_per_param(prec);
        const double g = gradient_bytes_per_param(prec), k = optimizer_state_bytes_per_param(opt);
        const ParamStateBytes z0 = param_state_bytes(opt, prec, 0, n), z1 = param_state_bytes(opt, prec, 1, n);
        const ParamStateBytes z2 = param_state_bytes(opt, prec, 2, n), z3 = param_state_bytes(opt, prec, 3, n);
        EXPECT_DOUBLE_EQ(z0.total(), bytes_per_param(opt, prec));
        EXPECT_DOUBLE_EQ(z1.total(), w + g + (master + k) / n);
        EXPECT_DOUBLE_EQ(z2.total(), w + (master + g + k) / n);
        EXPECT_DOUBLE_EQ(z3.total(), (w + master + g + k) / n);
        EXPECT_DOUBLE_EQ(state_bytes_per_param_byte(opt, prec, 2, n), z2.total() / kParamStorageBytes);
        EXPECT_DOUBLE_EQ(z1.gradients, g);
        EXPECT_DOUBLE_EQ(z2.gradients, g / n);
      }
  // fp32 Adam: 4 + 4 + 8 → 4 + 4 + 8/N_d, 4 + 12/N_d, 16/N_d.
  EXPECT_DOUBLE_EQ(param_state_bytes(Optimizer::kAdam, Precision::kFp32, 1, 4).total(), 10);
  EXPECT_DOUBLE_EQ(param_state_bytes(Optimizer::kAdam, Precision::kFp32, 2, 4).total(), 7);
  EXPECT_DOUBLE_EQ(param_state_bytes(Optimizer::kAdam, Precision::kFp32, 3, 4).total(), 4);
}

TEST(AZeroShardedStage, OnOneReplicaIsPlainDataParallelism) {
  for (int zero = 0; zero <= kMaxZeroStage; ++zero) {
    EXPECT_EQ(effective_zero(zero, 1), 0);
    EXPECT_EQ(effective_zero(zero, 2), zero);
    EXPECT_DOUBLE_EQ(param_state_bytes(Optimizer::kAdam, Precision::kMixed, zero, 1).total(), 16);
    EXPECT_EQ(zero_gathered_bytes(4e6, Precision::kMixed, zero, 1), 0);
  }
}

TEST(AZeroShardedStage, StepsOnlyItsShardOfTheOptimizerState) {
  const double whole = optimizer_step_time(4'000'000, Optimizer::kAdam, Precision::kFp32, 10e9);
  EXPECT_DOUBLE_EQ(optimizer_step_time(4'000'000, Optimizer::kAdam, Precision::kFp32, 10e9, 0, 8), whole);
  for (int zero = 1; zero <= kMaxZeroStage; ++zero)
    EXPECT_DOUBLE_EQ(optimizer_step_time(4'000'000, Optimizer::kAdam, Precision::kFp32, 10e9, zero, 8), whole / 8);
}

TEST(AZeroThreeStage, GathersTheLargestTasksWorkingWeightsIntoItsWorkspace) {
  StageMemoryInput in;
  in.param_bytes = 40'000'000;  // 10M fp32-stored params
  in.largest_task_param_bytes = 4'000'000;  // the largest task reads 1M of them
  in.max_workspace_bytes = 7;
  in.precision = Precision::kMixed;
  in.replicas = 4;
  for (int zero = 0; zero < 3; ++zero) {
    in.zero = zero;
    EXPECT_EQ(stage_memory(in).workspace, 7) << "ZeRO-" << zero << " keeps whole weights: nothing to gather";
  }
  in.zero = 3;
  const StageMemory m = stage_memory(in);
  EXPECT_EQ(m.workspace, 7 + 2'000'000);  // 1M params in the 16-bit working dtype
  EXPECT_EQ(m.weights + m.gradients + m.optimizer_state, 10'000'000 * 16 / 4);
  in.precision = Precision::kFp32;
  EXPECT_EQ(stage_memory(in).workspace, 7 + 4'000'000);
}

TEST(GradientBytes, AreHalvedOnlyUnderMixedPrecision) {
  EXPECT_EQ(gradient_bytes_per_param_byte(Precision::kFp32), 1.0);
  EXPECT_EQ(gradient_bytes_per_param_byte(Precision::kTf32), 1.0);  // tf32 stores fp32
  EXPECT_EQ(gradient_bytes_per_param_byte(Precision::kMixed), 0.5);
  EXPECT_EQ(activation_bytes_factor(Precision::kFp32), 1.0);
  EXPECT_EQ(activation_bytes_factor(Precision::kTf32), 1.0);
  EXPECT_EQ(activation_bytes_factor(Precision::kMixed), 0.5);
}

TEST(InFlight, IsMForGPipeAndStagesAheadFor1F1B) {
  EXPECT_EQ(stage_in_flight_microbatches(Schedule::kGPipe, 0, 4, 16), 16);
  EXPECT_EQ(stage_in_flight_microbatches(Schedule::k1F1B, 0, 4, 16), 4);
  EXPECT_EQ(stage_in_flight_microbatches(Schedule::k1F1B, 3, 4, 16), 1);
  EXPECT_EQ(stage_in_flight_microbatches(Schedule::k1F1B, 0, 4, 2), 2);
}

}  // namespace
}  // namespace apart
