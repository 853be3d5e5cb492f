// The name tables of the training vocabulary: the first row of a value is its canonical name, later rows aliases.
#include "plan/training.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>

#include "graph/error.h"

namespace apart {
namespace {

template <typename Enum>
using NameTable = std::span<const std::pair<std::string_view, Enum>>;

constexpr std::pair<std::string_view, Schedule> kScheduleNames[] = {
    {"gpipe", Schedule::kGPipe},
    {"1f1b", Schedule::k1F1B},
    {"interleaved", Schedule::kInterleaved},
    {"interleaved-1f1b", Schedule::kInterleaved},
    {"interleaved1f1b", Schedule::kInterleaved},
    {"zb-h1", Schedule::kZbH1},
    {"zbh1", Schedule::kZbH1},
};
constexpr std::pair<std::string_view, Optimizer> kOptimizerNames[] = {
    {"sgd", Optimizer::kSgd},
    {"momentum", Optimizer::kMomentum},
    {"adam", Optimizer::kAdam},
    {"adamw", Optimizer::kAdamW},
};
constexpr std::pair<std::string_view, Precision> kPrecisionNames[] = {
    {"fp32", Precision::kFp32},
    {"tf32", Precision::kTf32},
    {"mixed", Precision::kMixed},  // fp16/bf16 math, fp32 master weights
    {"fp16", Precision::kMixed},
    {"bf16", Precision::kMixed},
    {"amp", Precision::kMixed},
};
constexpr std::pair<std::string_view, AttentionKernel> kAttentionKernelNames[] = {
    {"flash", AttentionKernel::kFused},
    {"materialized", AttentionKernel::kMaterialized},
};
constexpr std::pair<std::string_view, RecomputeScope> kRecomputeScopeNames[] = {
    {"none", RecomputeScope::kNone}, {"selective", RecomputeScope::kSelective}, {"full", RecomputeScope::kFull}};
constexpr std::pair<std::string_view, TpRegionKind> kTpRegionKindNames[] = {
    {"attention", TpRegionKind::kAttention},
    {"mlp", TpRegionKind::kMlp},
    {"embedding", TpRegionKind::kEmbedding},
    {"lm_head", TpRegionKind::kLmHead},
};
constexpr std::pair<std::string_view, TpRole> kTpRoleNames[] = {
    {"replicated", TpRole::kReplicated}, {"column", TpRole::kColumn},          {"row", TpRole::kRow},
    {"vocab", TpRole::kVocab},           {"follows-split", TpRole::kFollowsSplit},
};

template <typename Enum>
std::string_view name_of(NameTable<Enum> table, Enum value) {
  for (const auto& [name, v] : table)
    if (v == value) return name;
  return "?";
}

// "gpipe, 1f1b or interleaved (also interleaved-1f1b, interleaved1f1b)".
template <typename Enum>
std::string accepted(NameTable<Enum> table) {
  std::string canonical, aliases;
  size_t canonical_count = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    const bool alias = name_of(table, table[i].second) != table[i].first;
    std::string& list = alias ? aliases : canonical;
    if (!alias) ++canonical_count;
    list += std::string(list.empty() ? "" : ", ") + std::string(table[i].first);
  }
  // "a, b, c" → "a, b or c".
  if (canonical_count > 1) canonical.replace(canonical.rfind(", "), 2, " or ");
  return canonical + (aliases.empty() ? "" : " (also " + aliases + ")");
}

template <typename Enum>
Enum parse(NameTable<Enum> table, std::string_view flag, std::string_view text) {
  for (const auto& [name, v] : table)
    if (name == text) return v;
  throw InvalidArgument(std::string(flag) + " " + std::string(text) + ": expected " + accepted(table));
}

}  // namespace

std::string_view schedule_name(Schedule s) { return name_of<Schedule>(kScheduleNames, s); }
std::string_view optimizer_name(Optimizer o) { return name_of<Optimizer>(kOptimizerNames, o); }
std::string_view precision_name(Precision p) { return name_of<Precision>(kPrecisionNames, p); }
std::string_view attention_kernel_name(AttentionKernel k) { return name_of<AttentionKernel>(kAttentionKernelNames, k); }

Schedule parse_schedule(std::string_view name) { return parse<Schedule>(kScheduleNames, "--schedule", name); }
Optimizer parse_optimizer(std::string_view name) { return parse<Optimizer>(kOptimizerNames, "--optimizer", name); }
Precision parse_precision(std::string_view name) { return parse<Precision>(kPrecisionNames, "--precision", name); }
AttentionKernel parse_attention_kernel(std::string_view name) {
  return parse<AttentionKernel>(kAttentionKernelNames, "--attention", name);
}
HalfFormat parse_half_format(std::string_view precision) {
  return precision == "fp16" ? HalfFormat::kFp16 : HalfFormat::kBf16;
}

std::string_view tp_region_kind_name(TpRegionKind k) { return name_of<TpRegionKind>(kTpRegionKindNames, k); }
std::string_view tp_role_name(TpRole r) { return name_of<TpRole>(kTpRoleNames, r); }
TpRegionKind parse_tp_region_kind(std::string_view name) {
  return parse<TpRegionKind>(kTpRegionKindNames, "tensor_parallel.regions[].kind", name);
}
std::string_view recompute_scope_name(RecomputeScope r) { return name_of<RecomputeScope>(kRecomputeScopeNames, r); }
RecomputeScope parse_recompute_scope(std::string_view name) {
  return parse<RecomputeScope>(kRecomputeScopeNames, "stages[].recompute_scope", name);
}
std::string tp_region_kind_names() { return accepted<TpRegionKind>(kTpRegionKindNames); }

std::string schedule_names() { return accepted<Schedule>(kScheduleNames); }
std::string optimizer_names() { return accepted<Optimizer>(kOptimizerNames); }
std::string precision_names() { return accepted<Precision>(kPrecisionNames); }
std::string attention_kernel_names() { return accepted<AttentionKernel>(kAttentionKernelNames); }

std::pair<int64_t, int64_t> tp_sequence_part(int64_t length, int degree, int rank) {
  if (degree < 1 || rank < 0 || rank >= degree || length < degree)
    throw InvalidModel("sequence parallelism: " + std::to_string(length) + " positions leave rank " +
                       std::to_string(rank) + " of " + std::to_string(degree) +
                       " none; plan with --sequence-parallel off");
  const int64_t each = length / degree, extra = length % degree;
  const int64_t begin = rank * each + std::min<int64_t>(rank, extra);
  return {begin, begin + each + (rank < extra ? 1 : 0)};
}

double tp_sequence_share(int64_t length, int degree) {
  if (degree < 1) return 1;
  if (length < degree) return 1.0 / degree;  // unknown (0): priced as equal parts
  const int64_t largest = length / degree + (length % degree != 0 ? 1 : 0);  // ⌈length/degree⌉
  return static_cast<double>(largest) / static_cast<double>(length);
}

}  // namespace apart
