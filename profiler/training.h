// Training-run choices the cost and memory model depend on: precision, optimizer, schedule.
// partition/ uses these same enums (partition/options.h brings them into namespace apart).
#pragma once

#include <cstdint>
#include <string_view>

namespace apart::profiler {

// kMixed: fp16/bf16 math and activations, fp32 master weights.
enum class Precision : uint8_t { kFp32, kTf32, kMixed };
std::string_view precision_name(Precision p);
Precision parse_precision(std::string_view name);  // "fp32", "tf32", "mixed" (also "fp16", "bf16", "amp")

enum class Optimizer : uint8_t { kSgd, kMomentum, kAdam };
std::string_view optimizer_name(Optimizer o);
Optimizer parse_optimizer(std::string_view name);  // "sgd", "momentum", "adam" (also "adamw")

enum class Schedule : uint8_t { kGPipe, k1F1B };
std::string_view schedule_name(Schedule s);
Schedule parse_schedule(std::string_view name);  // "gpipe", "1f1b"

}  // namespace apart::profiler
