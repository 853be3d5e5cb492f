// The plan in Megatron-LM's vocabulary (layout, MFU, the summary line) and the warnings a plan deserves.
#include "plan/plan_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "graph/units.h"

namespace apart {
namespace {

// "53.4 %" of a fraction.
std::string percent(double fraction, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %%", decimals, 100 * fraction);
  return buf;
}

// "1,023": counts of devices read at a glance.
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
  return (n < 0 ? "-" : "") + digits;
}

// "8", or "4–8" where the stages differ.
template <typename T>
std::string range(const std::vector<T>& values) {
  if (values.empty()) return "?";
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  return *lo == *hi ? std::to_string(*lo) : std::to_string(*lo) + "–" + std::to_string(*hi);
}

std::string schedule_label(const PlanTraining& t) {
  switch (t.schedule) {
    case Schedule::kGPipe: return "GPipe";
    case Schedule::k1F1B: return "1F1B";
    case Schedule::kInterleaved:
      return "interleaved 1F1B (" + std::to_string(t.virtual_stages.value_or(kDefaultVirtualStages)) + " chunks)";
    case Schedule::kZbH1: return "ZB-H1";
  }
  return std::string(schedule_name(t.schedule));
}

std::string zero_label(const PlanDocument& plan) {
  std::vector<int> zeros;
  for (const PlanStageRecord& s : plan.stages)
    if (s.replicas > 1) zeros.push_back(s.zero);  // ZeRO shards among replicas: a lone replica has none
  if (zeros.empty() || *std::max_element(zeros.begin(), zeros.end()) == 0) return "";
  const std::string r = range(zeros);
  return r.find("–") == std::string::npos ? "ZeRO-" + r : "ZeRO " + r;
}

}  // namespace

std::string format_rate(double value) {
  static const char* const units[] = {"", "k", "M", "B", "T"};
  int u = 0;
  while (std::fabs(value) >= 999.5 && u < 4) {
    value /= 1000;
    ++u;
  }
  return format_significant(value, 3) + units[u];
}

std::string format_tflops(double tflops) {
  return tflops >= 1 ? format_significant(tflops, 3) + " TFLOP/s" : format_significant(tflops * 1e3, 3) + " GFLOP/s";
}

PlanLayout plan_layout(const PlanDocument& plan) {
  PlanLayout l;
  l.pp = static_cast<int>(plan.stages.size());
  for (const PlanStageRecord& s : plan.stages) {
    l.tp.push_back(s.tp);
    l.dp.push_back(s.replicas);
    // Older plans without the per-stage figure: the micro-batch split among the stage's replicas, rounded up.
    const int64_t whole = plan.training.microbatch_size.value_or(0);
    l.micro_batch_size.push_back(s.microbatch_size.value_or((whole + s.replicas - 1) / std::max(1, s.replicas)));
  }
  l.accumulation_steps = plan.training.microbatches;
  if (plan.training.schedule == Schedule::kInterleaved)
    l.virtual_stages = plan.training.virtual_stages.value_or(kDefaultVirtualStages);
  return l;
}

nlohmann::ordered_json layout_json(const PlanLayout& l) {
  nlohmann::ordered_json j = {{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"micro_batch_size", l.micro_batch_size},
                              {"accumulation_steps", l.accumulation_steps}};
  if (l.virtual_stages) j["virtual_stages"] = *l.virtual_stages;
  return j;
}

std::optional<Utilization> utilization(const UtilizationInputs& in) {
  if (in.peak_flops <= 0 || in.devices <= 0 || !(in.samples_per_s > 0)) return std::nullopt;
  Utilization u;
  double flops_per_sample = 0;
  if (in.tokens_per_sample && *in.tokens_per_sample > 0 && in.params > 0) {
    // Megatron-LM / PaLM: 6·N FLOPs per token trained (2N forward, 4N backward).
    flops_per_sample = 6.0 * static_cast<double>(in.params) * static_cast<double>(*in.tokens_per_sample);
    u.tokens_per_s = in.samples_per_s * static_cast<double>(*in.tokens_per_sample);
    u.flops = kSixNPerToken;
  } else if (in.flops_per_sample && *in.flops_per_sample > 0) {
    flops_per_sample = *in.flops_per_sample;
    u.flops = kModelFlops;
  } else {
    return std::nullopt;
  }
  const double per_device = flops_per_sample * in.samples_per_s / in.devices;
  u.mfu = per_device / in.peak_flops;
  u.tflops_per_device = per_device / 1e12;
  return u;
}

std::string plan_summary_line(const PlanDocument& plan) {
  const PlanLayout l = plan_layout(plan);
  const std::string per = plan.cluster.device == "cpu" ? " per device" : " per GPU";  // the user's word for it
  std::vector<std::string> parts = {"TP " + range(l.tp), "PP " + std::to_string(l.pp), "DP " + range(l.dp),
                                    "micro-batch " + range(l.micro_batch_size) + per,
                                    grouped(l.accumulation_steps) + " accumulation step" +
                                        (l.accumulation_steps == 1 ? "" : "s"),
                                    schedule_label(plan.training)};
  if (const std::string zero = zero_label(plan); !zero.empty()) parts.push_back(zero);
  if (const std::string r = recompute_summary(plan); r != "off") parts.push_back("recompute " + r);
  if (plan.predicted) {
    const PlanPrediction& p = *plan.predicted;
    if (p.mfu) parts.push_back(percent(*p.mfu, 1) + " MFU");
    if (p.tokens_per_s) parts.push_back(format_rate(*p.tokens_per_s) + " tokens/s");
    else if (p.samples_per_s) parts.push_back(format_rate(*p.samples_per_s) + " samples/s");
    if (p.tflops_per_device) parts.push_back(format_tflops(*p.tflops_per_device) + per);
  }
  std::string line;
  for (const std::string& part : parts) line += (line.empty() ? "" : " · ") + part;
  return line;
}

std::vector<std::string> plan_warnings(const PlanDocument& plan) {
  std::vector<std::string> out;
  const PlanLayout l = plan_layout(plan);
  const int used = plan_devices(plan);
  const int devices = plan.cluster.devices;
  if (used < devices) {
    const int64_t batch = plan.training.global_batch.value_or(0);
    const int idle = devices - used;
    std::string why;
    if (batch > 0 && batch < devices)
      why = "batch " + grouped(batch) + " gives a stage at most " + grouped(batch) +
            " one-sample replicas; a larger --batch would put them to work";
    else
      why = "on the cost model, spreading the batch over more was no faster (the all-reduce and pipeline transfers "
            "would cost more than the compute saved)";
    out.push_back(grouped(idle) + " of " + grouped(devices) + " devices left idle: the plan uses " + grouped(used) +
                  "; " + why);
  }
  if (plan.predicted && plan.predicted->bubble_fraction && *plan.predicted->bubble_fraction > kBubbleWarning) {
    std::vector<std::string> fixes;
    const bool one_sample = std::all_of(l.micro_batch_size.begin(), l.micro_batch_size.end(),
                                        [](int64_t u) { return u <= 1; });
    if (!one_sample) fixes.push_back("smaller micro-batches (--micro-batch-size or --microbatches)");
    if (l.pp > 1) fixes.push_back("fewer stages (--stages)");
    // Tensor parallelism makes stages wider, so fewer: the fix where the model has regions to split and --tp is 1.
    if (l.pp > 1 && plan.tensor_parallel && !plan.tensor_parallel->regions.empty() && plan.options && !plan.options->tp)
      fixes.push_back("--tp auto (wider stages, so fewer)");
    if (plan.training.schedule != Schedule::kInterleaved && l.pp > 1) fixes.push_back("--schedule interleaved");
    std::string fix;
    for (size_t i = 0; i < fixes.size(); ++i) fix += (i == 0 ? "" : i + 1 == fixes.size() ? " or " : ", ") + fixes[i];
    out.push_back("the pipeline bubble is " + percent(*plan.predicted->bubble_fraction, 0) +
                  " of the iteration (devices wait for their neighbours)" + (fix.empty() ? "" : "; " + fix +
                  " would shrink it"));
  }
  const int64_t usable = plan.cluster.memory_bytes.value_or(0);
  if (usable > 0) {
    int worst = -1;
    double worst_share = 0;
    for (const PlanStageRecord& s : plan.stages) {
      const double share = static_cast<double>(s.memory_bytes.value_or(0)) / static_cast<double>(usable);
      if (share > worst_share) { worst_share = share; worst = s.id; }
    }
    if (worst_share > kMemoryWarning) {
      const bool all_recompute = std::all_of(plan.stages.begin(), plan.stages.end(), [](const PlanStageRecord& s) {
        return s.recompute && s.recompute_scope != RecomputeScope::kSelective;
      });
      out.push_back("stage " + std::to_string(worst) + " fills " + percent(worst_share, 1) + " of the " +
                    format_bytes(static_cast<double>(usable)) + " usable per device: an allocator's fragmentation or "
                    "a longer sequence may not fit; a larger --memory-reserve plans with a margin" +
                    (all_recompute ? "" : ", --recompute on trades compute for memory"));
    }
  }
  return out;
}

}  // namespace apart
