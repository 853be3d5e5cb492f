// A plan in the vocabulary of the people who launch training runs: TP × PP × DP, micro-batch size per GPU,
// accumulation steps, MFU, tokens/s and TFLOP/s per GPU; and the warnings a plan deserves. The one home of MFU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace apart {

// plan.json's `layout`: the plan as Megatron-LM's degrees, derived from its stages (never read back: the stages are
// the truth). tp[k], dp[k] and micro_batch_size[k] are stage k's; accumulation_steps is the micro-batch count m
// (each replica runs m micro-batches of micro_batch_size[k] samples per iteration).
struct PlanLayout {
  int pp = 0;                              // pipeline stages
  std::vector<int> tp;                     // per stage: devices per replica
  std::vector<int> dp;                     // per stage: replicas
  std::vector<int64_t> micro_batch_size;   // per stage: samples per replica per micro-batch (per GPU)
  int64_t accumulation_steps = 0;          // micro-batches per iteration
  std::optional<int> virtual_stages;       // interleaved: chunks per device
};
PlanLayout plan_layout(const PlanDocument& plan);
nlohmann::ordered_json layout_json(const PlanLayout& layout);

// What MFU counts as the model's FLOPs (plan.json's predicted.mfu_flops).
inline constexpr const char* kSixNPerToken = "6N per token";  // 6 × parameters × tokens: Megatron's, for sequence models
inline constexpr const char* kModelFlops = "model FLOPs";     // the cost model's forward + backward FLOPs per sample

// Model FLOPs utilisation and its companions. Sequence models (tokens_per_sample set): 6·N FLOPs per token (Megatron's
// convention for dense decoders: forward 2N, backward 4N, no recomputation, no attention scores); other models:
// the cost model's forward + backward FLOPs per sample. Over every device of the cluster at its peak for the
// plan's precision (idle devices count: they were paid for).
struct Utilization {
  double mfu = 0;                       // model FLOP/s over devices × peak, in [0, 1] for a sound prediction
  double tflops_per_device = 0;         // model TFLOP/s per device
  std::optional<double> tokens_per_s;   // sequence models
  std::string flops;                    // kSixNPerToken or kModelFlops
};
struct UtilizationInputs {
  int64_t params = 0;                          // N
  std::optional<int64_t> tokens_per_sample;    // the sequence length of the model's token input
  std::optional<double> flops_per_sample;      // forward + backward, by the cost model
  double samples_per_s = 0;
  int devices = 0;
  double peak_flops = 0;                       // per device, at the plan's precision
};
// nullopt when it cannot be said: no peak, no throughput, or neither tokens nor FLOPs per sample.
std::optional<Utilization> utilization(const UtilizationInputs& in);

// "TP 8 · PP 16 · DP 8 · micro-batch 1 per GPU · 192 accumulation steps · 1F1B · ZeRO-1 · 53.4 % MFU · 158k
// tokens/s · 166 TFLOP/s per GPU": ranges ("TP 4–8") where stages differ; the figures plan.json lacks are left out.
std::string plan_summary_line(const PlanDocument& plan);

// What a user would want to be told before launching it: devices left idle, a bubble over kBubbleWarning of the
// iteration, a stage above kMemoryWarning of usable memory. Each a sentence with what to do.
inline constexpr double kBubbleWarning = 0.30;
inline constexpr double kMemoryWarning = 0.95;
std::vector<std::string> plan_warnings(const PlanDocument& plan);

// "158k", "1.2M", "950": three significant digits, decimal suffixes in lower-case k as rates are written.
std::string format_rate(double value);
// Model FLOP/s per device given in TFLOP/s: "162 TFLOP/s", or below one "504 GFLOP/s".
std::string format_tflops(double tflops);

}  // namespace apart
