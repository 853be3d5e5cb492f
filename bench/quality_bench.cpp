// quality_bench: every partition method (apart and the baselines) on the same cost model, memory check and
// simulator, on zoo models and the real torch exports in shared/models, × 8…1024 devices, and pinned pure
// pipelines (--stages S --replicas 1 --microbatches 16 on S devices, batch 64) against the exact compute-optimal
// contiguous split of the topological order ("× exact"). Writes a Markdown table (bench/RESULTS.md holds one run).
// Usage: quality_bench [--out FILE] [--time-limit S] [--models a,b,…] [--devices 8,64,…] [--methods apart,metis,…]
//                      [--shared-models DIR]
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/compile.h"
#include "graph/error.h"
#include "models/zoo.h"
#include "partition/select.h"
#include "partition/stage_refine.h"
#include "simulator/simulate.h"

using namespace apart;

namespace {

struct Case {
  std::string model;   // zoo name or file stem in shared/models
  bool zoo = true;
  int64_t batch = 0;   // global batch (sequences or images)
  std::vector<int> devices;
  bool pinned = false;  // a pure pipeline: --stages devices --replicas 1 --microbatches 16
};
constexpr int64_t kPinnedMicrobatches = 16;

// The exact compute-optimal contiguous split of the components' topological order for a pinned pure pipeline
// (exact_stage_cuts' compute-balanced split, which tests/partition/real_model_optimum_test.cpp holds to an
// independent exact DP), replayed by the simulator as the selection replays candidates; 0 when it does not fit.
double exact_split_simulated_s(const CompileResult& result, int stages) {
  const PartitionOptions& po = result.plan.options;
  const AtomicGraph atomic = build_atomic_graph(result.model.graph, result.costs.table, po.atomic,
                                                result.costs.at_other_size ? &*result.costs.at_other_size : nullptr);
  StageSolution pipeline;
  pipeline.stages = stages;
  pipeline.microbatches = kPinnedMicrobatches;
  pipeline.schedule = Schedule::k1F1B;
  pipeline.replicas.assign(stages, 1);
  ExactCuts exact = exact_stage_cuts(atomic, pipeline, po.cluster, po.training);
  if (!exact.least_compute) return 0;
  RefinedCandidate& split = *exact.least_compute;
  auto assignment = std::make_shared<const BlockAssignment>(std::move(split.assignment));
  const Candidate candidate = place_candidate(std::move(split.solution), split.sequence, assignment,
                                              std::shared_ptr<const StageEvaluator>(std::move(split.evaluator)), "exact");
  return sim::simulate(candidate_sim_plan(candidate)).iteration_s;
}

struct Row {
  std::string method;
  bool feasible = false;
  std::string reason;
  double estimate_s = 0;     // the analytic estimate of the chosen plan
  double iteration_s = 0;    // the plan's prediction: its simulated time (what the method's choice was made by)
  double replayed_s = 0;     // `apart simulate`'s replay of the written plan.json (must equal iteration_s)
  double planning_s = 0, bound_s = 0;
  int64_t peak_memory = 0;
  std::string shape;
};

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  double time_limit = 0;
  std::string only, only_devices, only_methods;  // ",a,b," filters; empty = all
  std::filesystem::path shared = std::filesystem::path(APART_SOURCE_DIR) / ".." / "shared" / "models";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--out") out_path = next();
    else if (a == "--time-limit") time_limit = std::stod(next());
    else if (a == "--models") only = "," + next() + ",";
    else if (a == "--devices") only_devices = "," + next() + ",";
    else if (a == "--methods") only_methods = "," + next() + ",";
    else if (a == "--shared-models") shared = next();
    else {
      const bool help = a == "--help" || a == "-h";
      std::fprintf(help ? stdout : stderr,
                   "usage: quality_bench [--out FILE] [--time-limit S] [--models a,b] [--devices 8,64] "
                   "[--methods apart,metis] [--shared-models DIR]\n"
                   "  --models, --devices, --methods: run only these (comma-separated); the table's \"× apart\"\n"
                   "  column needs apart among the methods\n");
      return help ? 0 : 2;
    }
  }
  const std::vector<Case> all = {
      {"gpt2-xl", true, 512, {8, 64, 512}},          {"gpt3-13b", true, 1024, {8, 64, 512, 1024}},
      {"gpt3-175b", true, 1536, {8, 64, 512, 1024}}, {"bert-large", true, 1024, {8, 64, 512}},
      {"t5-3b", true, 1024, {8, 64, 512, 1024}},     {"resnet152x8", true, 2048, {8, 64, 512}},
      {"gpt2_small", false, 512, {8, 64, 512}},      {"resnet50", false, 2048, {8, 64, 512}},
      {"densenet121", false, 2048, {8, 64, 512}},    {"inception_v3", false, 2048, {8, 64, 512}},
      // Pinned pure pipelines (issue 15): the torch exports and zoo models of other shapes.
      {"resnet50", false, 64, {4, 8}, true},         {"densenet121", false, 64, {4, 8}, true},
      {"inception_v3", false, 64, {4, 8}, true},     {"gpt2_small", false, 64, {4, 8}, true},
      {"gpt2-medium", true, 64, {4, 8}, true},       {"bert-base", true, 64, {4, 8}, true},
      {"t5-small", true, 64, {4, 8}, true},          {"resnet101", true, 64, {4, 8}, true}};
  const auto dir = std::filesystem::temp_directory_path() / "apart_quality_bench";
  std::filesystem::create_directories(dir);
  const Precision precision = Precision::kMixed;

  std::ostringstream md;
  md << "| model | devices | batch | method | estimate s | simulated s | × bound | × attainable | × apart | × exact | "
        "memory | planning CPU s | plan |\n"
     << "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|\n";
  int replay_mismatches = 0, capped_plans = 0, simulated_total = 0, placed_total = 0;
  int not_best = 0, pinned_worse_than_exact = 0;
  double worst_vs_exact = 0, best_vs_exact = std::numeric_limits<double>::infinity();
  double worst_vs_baseline = 0;  // apart / the best baseline of a row, over all rows
  const auto bench_start = std::chrono::steady_clock::now();
  for (const Case& c : all) {
    if (!only.empty() && only.find("," + c.model + ",") == std::string::npos) continue;
    std::string path;
    if (c.zoo) {
      models::ZooOptions zo = models::options_for(c.model);
      zo.weights = models::WeightsMode::kNone;
      path = (dir / (c.model + ".onnx")).string();
      models::write_zoo_model(zo, path);
    } else {
      path = (shared / (c.model + ".onnx")).string();
      if (!std::filesystem::exists(path)) {
        std::fprintf(stderr, "quality_bench: %s missing, skipped\n", path.c_str());
        continue;
      }
    }
    for (const int devices : c.devices) {
      if (!only_devices.empty() && only_devices.find("," + std::to_string(devices) + ",") == std::string::npos) continue;
      // What `apart partition <model> --devices N --batch B --method M --no-baselines --time-limit S` plans.
      CompileOptions o;
      o.model = path;
      o.cluster.device = "a100-80gb";
      o.cluster.devices = devices;
      o.cluster.devices_per_node = 8;
      o.precision = precision;
      o.partition.training.global_batch = c.batch;
      o.partition.stage.time_limit_s = time_limit;
      o.baselines = false;
      if (c.pinned) {
        o.partition.stage.stages = devices;
        o.partition.stage.replicas = 1;
        o.partition.stage.microbatches = kPinnedMicrobatches;
      }
      std::vector<Row> rows;
      std::optional<CompileResult> any;  // one compile's inputs (model, costs, options) for the attainable bound
      double exact_s = 0;                // pinned rows: the exact compute-optimal split's simulated time
      for (Method method : kAllMethods) {
        if (!only_methods.empty() && only_methods.find("," + std::string(method_name(method)) + ",") == std::string::npos)
          continue;
        o.partition.method = method;
        Row r;
        r.method = std::string(method_name(method));
        // Planning time as process CPU seconds of the partition phase (single-threaded), so a shared machine does
        // not inflate it; an infeasible request has no result to read it from, so its row counts all of compile().
        const std::clock_t start = std::clock();
        try {
          CompileResult result = compile(o);
          const Plan& plan = result.plan;
          r.planning_s = result.times.partition.cpu_s;
          r.feasible = true;
          r.estimate_s = plan.estimate.iteration_s;
          r.iteration_s = plan.simulated.iteration_s;
          r.bound_s = plan.compute_lower_bound_s;
          r.peak_memory = plan.peak_memory_bytes;
          int used = 0;
          for (const PlanStage& s : plan.stages) used += s.replicas;
          r.shape = "S=" + std::to_string(plan.stages.size()) + " m=" + std::to_string(plan.microbatches) +
                    " dev=" + std::to_string(used) + (plan.recompute ? " rc" : "") +
                    (plan.layout == Layout::kPipelineMajor ? " pm" : "");
          // The same simulator as `apart simulate`, through plan.json.
          const auto j = nlohmann::json::parse(plan_to_json(plan_document(plan, result.model.graph, result.info)).dump());
          r.replayed_s = sim::simulate(sim::plan_from_json(j, c.model)).iteration_s;
          if (plan.search.not_simulated > 0) ++capped_plans;
          simulated_total += plan.search.simulated;
          placed_total += plan.search.candidates_placed;
          if (std::abs(r.replayed_s - r.iteration_s) > 1e-9 * r.iteration_s) ++replay_mismatches;
          if (!any) any = std::move(result);
          if (c.pinned && exact_s == 0) exact_s = exact_split_simulated_s(*any, devices);
        } catch (const Infeasible& e) {
          r.planning_s = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
          r.reason = e.what();
        }
        rows.push_back(std::move(r));
      }
      // What the batch allows (the "× attainable" column): an ideal pipeline of S ≥ S_min stages (every device
      // must hold its stage's weights, gradients and optimizer state) and R = ⌊devices/S⌋ replicas, perfectly
      // balanced, without communication: each of its S devices runs (W·B/R + F·m)/S per iteration, where W is the
      // per-sample forward+backward time and F the per-kernel fixed time of the whole model (from the two cost
      // tables, fitted per component exactly as the planner fits them), idle (S−1)/m of the time under 1F1B;
      // minimised over S and the m that give every replica ≥ 1 sample. No plan under this cost model can be faster.
      // From one feasible plan's inputs (every method's are the same); when none fits, no row prints the column.
      double per_sample = 0, fixed = 0;
      int s_min = devices + 1;
      if (any) {
        const PartitionOptions& po = any->plan.options;
        const double state = static_cast<double>(any->info.param_bytes) *
                             state_bytes_per_param_byte(po.training.optimizer, po.training.precision);
        s_min = static_cast<int>(std::max(1.0, std::ceil(state / static_cast<double>(po.cluster.usable_memory_bytes()))));
        const CostTable* other = any->costs.at_other_size ? &*any->costs.at_other_size : nullptr;
        const AtomicGraph atomic = build_atomic_graph(any->model.graph, any->costs.table, po.atomic, other);
        for (const AtomicComponent& component : atomic.components) {
          per_sample += component.cost.forward.per_sample_s + component.cost.backward.per_sample_s;
          fixed += component.cost.forward.fixed_s + component.cost.backward.fixed_s;
        }
      }
      double attainable = std::numeric_limits<double>::infinity();
      for (int stages = s_min; stages <= devices; ++stages) {
        const int replicas = devices / stages;
        for (int64_t m = 1; m <= c.batch; ++m) {
          if (c.batch % m != 0 || c.batch / m < replicas) continue;
          const double per_device = (per_sample * static_cast<double>(c.batch) / replicas + fixed * m) / stages;
          attainable = std::min(attainable, per_device * static_cast<double>(m + stages - 1) / static_cast<double>(m));
        }
      }
      Row apart_row;  // infeasible (so "× apart" prints —) when --methods leaves apart out
      for (const Row& r : rows)
        if (r.method == method_name(Method::kApart)) apart_row = r;
      for (const Row& r : rows) {
        md << "| " << c.model << " | " << devices << " | " << c.batch << " | " << r.method << " | ";
        if (!r.feasible) {
          md << "— | — | — | — | — | — | infeasible | " << fmt("%.2f", r.planning_s) << " | |\n";
          continue;
        }
        const bool worse = apart_row.feasible && apart_row.iteration_s > r.iteration_s * (1 + 1e-9);
        if (worse) ++not_best;
        md << fmt("%.4f", r.estimate_s) << " | " << fmt("%.4f", r.iteration_s) << " | "
           << fmt("%.2f", r.iteration_s / r.bound_s) << " | "
           << fmt("%.2f", r.iteration_s / attainable) << " | "
           << (apart_row.feasible ? fmt("%.3f", r.iteration_s / apart_row.iteration_s) : std::string("—"))
           << (worse ? " ⚠" : "") << " | " << (exact_s > 0 ? fmt("%.4f", r.iteration_s / exact_s) : std::string("—"))
           << " | " << fmt("%.1f GB ok", static_cast<double>(r.peak_memory) / 1e9) << " | "
           << fmt("%.2f", r.planning_s) << " | " << r.shape << " |\n";
      }
      if (apart_row.feasible) {
        double best_baseline = std::numeric_limits<double>::infinity();
        for (const Row& r : rows)
          if (r.feasible && r.method != apart_row.method) best_baseline = std::min(best_baseline, r.iteration_s);
        if (std::isfinite(best_baseline)) worst_vs_baseline = std::max(worst_vs_baseline, apart_row.iteration_s / best_baseline);
        if (exact_s > 0) {
          const double ratio = apart_row.iteration_s / exact_s;
          worst_vs_exact = std::max(worst_vs_exact, ratio);
          best_vs_exact = std::min(best_vs_exact, ratio);
          if (ratio > 1 + 1e-9) ++pinned_worse_than_exact;
        }
      }
      std::fprintf(stderr, "quality_bench: %s × %d done (%.0f s so far)\n", c.model.c_str(), devices,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count());
    }
  }
  md << "\nRows where a baseline beats apart's predicted (simulated) iteration time: " << not_best
     << " (apart / the best baseline of its row: at most " << fmt("%.4f", worst_vs_baseline) << ")\n";
  if (std::isfinite(best_vs_exact))
    md << "Pinned rows where apart replays slower than the exact compute-optimal split: " << pinned_worse_than_exact
       << " (apart / exact: " << fmt("%.4f", best_vs_exact) << "–" << fmt("%.4f", worst_vs_exact) << ")\n";
  md << "Plans whose plan.json replay differs from their prediction by more than 1e-9: " << replay_mismatches << "\n";
  md << "Plans where the simulation cap or a time limit left candidates unsimulated: " << capped_plans << " (the "
     << "simulator replayed " << simulated_total << " of " << placed_total << " placed candidates over all plans; the "
     << "lower bound ruled out the rest)\n";
  std::fputs(md.str().c_str(), stdout);
  if (!out_path.empty()) std::ofstream(out_path) << md.str();
  return 0;
}
