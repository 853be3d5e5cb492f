// The training vocabulary the planner, the simulator and the runtime share: schedule, optimizer and precision, each
// an enum with one name table (plan.json, costs.json and the flags spell them the same way).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

namespace apart {

// GPipe: all forwards, then all backwards. 1F1B: PipeDream-Flush. Interleaved: Megatron-LM's interleaved 1F1B
// (virtual stages: each plan stage runs as v chunks). ZB-H1: Qi et al., ICLR 2024 "Zero Bubble Pipeline
// Parallelism" §3.1, 1F1B with each backward split into the input gradient (B) and the weight gradient (W), the
// W passes deferred into the bubbles. The planner plans interleaved and zb-h1 when asked (--schedule), the
// simulator replays them, the runtime does not run them yet.
enum class Schedule : uint8_t { kGPipe, k1F1B, kInterleaved, kZbH1 };
// Chunks per device of the interleaved schedule when neither --virtual-stages nor the plan says (Megatron-LM's
// smallest interleaving); at most limits::kMaxVirtualStages.
inline constexpr int kDefaultVirtualStages = 2;
// PyTorch semantics (train/optimizer.h). For memory, adamw is adam: two state slots per parameter.
enum class Optimizer : uint8_t { kSgd, kMomentum, kAdam, kAdamW };
// kMixed: fp16/bf16 math and activations, fp32 master weights.
enum class Precision : uint8_t { kFp32, kTf32, kMixed };
// The 16-bit format of kMixed: bfloat16 ("mixed", "bf16", "amp") or float16 ("fp16"). The planner costs both alike;
// the runtime rounds GEMM operands to it, and trains float16 with dynamic loss scaling (train/loss_scale.h), since
// float16's range (6e-8 … 65504) would lose small gradients and overflow on large ones.
enum class HalfFormat : uint8_t { kBf16, kFp16 };
// Which attention kernel the priced engine runs for each MatMul·scale·mask·Softmax·MatMul chain the cost model's
// find_attention matches (profiler/attention_pattern.h; docs/cost-model.md §2, "Fused attention"):
// - kFused ("flash"): one flash kernel, no S × L tensor written or saved: what apart's runtime launches (the default);
// - kMaterialized ("materialized"): the chain op by op, its scores and probabilities written and saved
//   (scale-mask-softmax one kernel on a fusing device), as Megatron-LM ran it before FlashAttention (Narayanan et al.
//   2021, Korthikanti et al. 2022): for comparing with such measurements, not for plans apart runs.
enum class AttentionKernel : uint8_t { kFused, kMaterialized };
inline constexpr const char* kAttentionHelp =
    "flash or materialized: the attention kernel the costs price. flash: one fused kernel, no seq x seq tensor, as "
    "apart run launches it; materialized: the scores and probabilities written and saved, as Megatron-LM ran "
    "attention before FlashAttention (to compare with such measurements)";

// A stage's parameters are counted as bytes the way the model stores them (the cost table's param_bytes, plan.json's
// stages[].param_bytes) and turned into elements as fp32, 4 bytes each: how training models are exported. A model
// stored in another dtype is costed as if its parameters were fp32. The memory rules (profiler/memory_model.h),
// report.txt and the HTML report all divide by this one constant.
inline constexpr int kParamStorageBytes = 4;

// ZeRO stages (Rajbhandari et al., SC20) a stage's data-parallel replicas may shard with: 0 (none, plain data
// parallelism) to 3 (optimizer state, gradients and weights); plan.json's stages[].zero, partition's --zero.
inline constexpr int kMaxZeroStage = 3;

// The canonical names: "gpipe", "1f1b", "interleaved", "zb-h1"; "sgd", "momentum", "adam", "adamw"; "fp32", "tf32", "mixed".
std::string_view schedule_name(Schedule s);
std::string_view optimizer_name(Optimizer o);
std::string_view precision_name(Precision p);
std::string_view attention_kernel_name(AttentionKernel k);  // "flash", "materialized"

// A canonical name or an alias ("interleaved-1f1b", "interleaved1f1b", "zbh1"; "fp16", "bf16", "amp" for mixed). Throws
// InvalidArgument naming the flag (--schedule, --optimizer, --precision), the text and every accepted name.
Schedule parse_schedule(std::string_view name);
Optimizer parse_optimizer(std::string_view name);
Precision parse_precision(std::string_view name);
AttentionKernel parse_attention_kernel(std::string_view name);  // flag --attention
// The half format a --precision text names: kFp16 for "fp16", kBf16 for everything else (fp32 and tf32 use none).
HalfFormat parse_half_format(std::string_view precision);
// What the parsers accept, for messages: "gpipe, 1f1b or interleaved (also interleaved-1f1b, interleaved1f1b)".
std::string schedule_names();
std::string optimizer_names();
std::string precision_names();
std::string attention_kernel_names();

// Tensor parallelism (partition/tensor_parallel.h finds the regions): the kinds of Megatron-style region, and the
// part a task plays in one.
enum class TpRegionKind : uint8_t { kAttention, kMlp, kEmbedding, kLmHead };
enum class TpRole : uint8_t {
  kReplicated,    // outside every region: every rank of the group runs it whole
  kColumn,        // a linear split over its output features (W's columns)
  kRow,           // a linear split over its input features (W's rows); its output is all-reduced
  kVocab,         // an embedding Gather split over the vocabulary rows, or the vocabulary-parallel loss
  kFollowsSplit,  // runs on each rank's slice of its producer's split
};
// The TP degrees the planner considers: a TP group stays inside one node of at most 8 devices.
inline constexpr int kTpDegrees[] = {1, 2, 4, 8};
inline constexpr int kMaxTpDegree = kTpDegrees[std::size(kTpDegrees) - 1];
// The positions [begin, end) along a sequence axis of `length` that rank `rank` of `degree` holds under sequence
// parallelism (codegen/tensor_parallel_shard.h cuts by it, the runtime's collectives move by it): ⌊length/degree⌋
// each, the first length mod degree ranks one more, so equal parts when the degree divides the length.
// InvalidModel when a rank would hold none (a length below the degree).
std::pair<int64_t, int64_t> tp_sequence_part(int64_t length, int degree, int rank);
// Whether sequence parallelism cuts a stage's sequence of `length` (0: unknown) at `degree`: not one shorter than the
// degree, where a rank would hold no position (the planner's rule, stage_cost.cpp, and the TP check before it).
inline bool tp_sequence_fits(int64_t length, int degree) { return length == 0 || length >= degree; }
// Of a sequence of `length` cut by tp_sequence_part, the share the largest part holds: 1/degree when the degree
// divides the length (or it is unknown: 0), ⌈length/degree⌉/length otherwise (what the planner prices a
// sequence-parallel rank's share of the work between regions at).
double tp_sequence_share(int64_t length, int degree);
// Where `tp` stands in kTpDegrees, or -1 for a degree the planner does not consider.
constexpr int tp_degree_index(int tp) {
  for (size_t i = 0; i < std::size(kTpDegrees); ++i)
    if (kTpDegrees[i] == tp) return static_cast<int>(i);
  return -1;
}
// "attention", "mlp", "embedding", "lm_head"; "replicated", "column", "row", "vocab", "follows-split".
std::string_view tp_region_kind_name(TpRegionKind k);
std::string_view tp_role_name(TpRole r);
TpRegionKind parse_tp_region_kind(std::string_view name);  // InvalidArgument listing the names
std::string tp_region_kind_names();

// What a stage recomputes before its backward (Korthikanti et al., MLSys'23 §4): nothing; its attention cores
// (selective: the score MatMul through the context MatMul, whose s²-sized activations it then does not keep, re-run
// from the q, k and v it keeps; partition/tensor_parallel.h TpRegion::core_tasks); or its whole forward from the
// stage's inputs (full). plan.json's stages[].recompute (bool) and recompute_scope.
enum class RecomputeScope : uint8_t { kNone, kSelective, kFull };
std::string_view recompute_scope_name(RecomputeScope r);  // "none", "selective", "full"
RecomputeScope parse_recompute_scope(std::string_view name);  // InvalidArgument listing the names

// Every value of each enum, in declaration order (tests walk the name tables with these).
inline constexpr Schedule kSchedules[] = {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1};
inline constexpr Optimizer kOptimizers[] = {Optimizer::kSgd, Optimizer::kMomentum, Optimizer::kAdam, Optimizer::kAdamW};
inline constexpr Precision kPrecisions[] = {Precision::kFp32, Precision::kTf32, Precision::kMixed};
inline constexpr TpRegionKind kTpRegionKinds[] = {TpRegionKind::kAttention, TpRegionKind::kMlp, TpRegionKind::kEmbedding,
                                                  TpRegionKind::kLmHead};

}  // namespace apart
