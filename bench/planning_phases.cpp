// planning_phases: where `apart partition` spends its time, phase by phase (import, costs, the search's phases,
// simulation, baselines, each plan file), as wall and CPU seconds of one run through the same calls compile() makes.
// Usage: planning_phases MODEL.onnx DEVICES BATCH [--no-baselines] [--no-stage-models] [--threads N] [--out DIR]
//        [--full] (--tp auto --schedule auto --zero auto)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "codegen/plan_writer.h"
#include "driver/compile.h"
#include "graph/atomic_file.h"
#include "partition/phases.h"
#include "plan/costs_json.h"

using namespace apart;

namespace {

// One row per phase: wall and process CPU seconds, printed as they come.
struct PhaseTimer {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  std::clock_t cpu = std::clock();
  double total_wall = 0, total_cpu = 0;
  void lap(const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    const std::clock_t cpu_now = std::clock();
    const double w = std::chrono::duration<double>(now - wall).count();
    const double c = static_cast<double>(cpu_now - cpu) / CLOCKS_PER_SEC;
    total_wall += w;
    total_cpu += c;
    std::printf("| %-34s | %7.3f | %7.3f |\n", phase, w, c);
    std::fflush(stdout);
    wall = std::chrono::steady_clock::now();
    cpu = std::clock();
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.onnx DEVICES BATCH [--no-baselines] [--no-stage-models] [--threads N] "
                         "[--out DIR]\n", argv[0]);
    return 2;
  }
  CompileOptions o;
  o.model = argv[1];
  o.cluster.devices = std::atoi(argv[2]);
  o.partition.training.global_batch = std::atoll(argv[3]);
  o.precision = Precision::kMixed;
  bool stage_models = true;
  std::filesystem::path out = std::filesystem::temp_directory_path() / "apart_planning_phases";
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-baselines") o.baselines = false;
    else if (a == "--no-stage-models") stage_models = false;
    else if (a == "--threads" && i + 1 < argc) o.partition.threads = std::atoi(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--full") {  // the full search: --tp auto --schedule auto --zero auto
      o.partition.stage.tp.reset();
      o.partition.stage.schedule.reset();
      o.partition.stage.zero.reset();
    }
  }
  std::filesystem::remove_all(out);
  o.output = PlanFiles{out, false, stage_models, false};

  std::printf("| phase | wall s | CPU s |\n|---|---:|---:|\n");
  PhaseTimer t;
  const Cluster cluster = resolve_cluster(o.cluster);
  PartitionOptions partition = resolve_partition_options(o, cluster);
  CompileResult r;
  r.cluster = cluster;
  r.model = import_for_plan(o.model, o.import);
  t.lap("import");
  r.costs = plan_costs(o, partition, r.model, cluster);
  partition.atomic.graph_batch = r.costs.options.reference_batch;
  t.lap("costs (two tables)");

  const CostTable* other = r.costs.at_other_size ? &*r.costs.at_other_size : nullptr;
  SearchClock clock;
  clock.threads = partition.search_threads();
  check_request(partition);
  const SearchGrid grid = search_grid(partition);
  const AtomicGraph atomic = atomic_level(r.model.graph, r.costs.table, partition, other);
  t.lap("search: atomic level");
  const BlockLevel blocks = block_level(atomic, partition, grid);
  t.lap("search: block level");
  CandidateSet found = block_candidates(atomic, blocks.assignment, partition, grid, clock, CutRefinement::kOn);
  t.lap("search: stage DP + refine + pm");
  for (Method split : {Method::kUniform, Method::kParams, Method::kGpipeBalance})
    found.add(fixed_split_candidates(atomic, split, partition, grid, clock));
  t.lap("search: baseline splits' DP");
  r.plan = choose_plan(r.model.graph, atomic, found, blocks, partition, clock);
  t.lap("search: simulated selection");
  if (o.baselines) {
    // As compile() runs them: in one search with apart's (the search again here; its baselines' share is printed).
    const PlanWithBaselines both = partition_with_baselines(r.model.graph, r.costs.table, partition, other);
    r.baselines = both.baselines;
    std::printf("| %-34s | %7.3f |         |\n", "baselines.json (beyond apart's)", both.baselines_s);
    t = PhaseTimer{.total_wall = t.total_wall + both.baselines_s, .total_cpu = t.total_cpu};
  }
  r.info = describe_model(r.model.graph, o.model);
  t.lap("describe model (sha256)");
  r.document = plan_document(r.plan, r.model.graph, r.info);
  t.lap("plan document");
  write_plan_files(r, o, *o.output);
  t.lap("plan files (all)");
  std::printf("| %-34s | %7.3f | %7.3f |\n", "total", t.total_wall, t.total_cpu);

  // The files one by one, again, into a scratch folder (the same calls write_plan_files makes).
  const auto scratch = out.string() + ".files";
  std::filesystem::remove_all(scratch);
  std::filesystem::create_directories(scratch);
  t = PhaseTimer{};
  std::printf("\n| file | wall s | CPU s |\n|---|---:|---:|\n");
  write_file_atomically(scratch + "/plan.json", plan_to_json(r.document).dump(2) + "\n");
  t.lap("plan.json");
  write_file_atomically(scratch + "/plan.dot", plan_to_dot(r.document, r.model.graph, false));
  t.lap("plan.dot");
  write_file_atomically(scratch + "/report.txt", plan_report(r.document, r.model.graph));
  t.lap("report.txt");
  const StageShapes shapes = stage_shapes(o, r.model);
  t.lap("stage shapes (second import)");
  if (stage_models) {
    write_stage_models(r.document, r.model.graph, o.model, scratch, shapes);
    t.lap("stage_K.onnx");
  }
  const CostTable at_plan = costs_at_plan_size(r);
  t.lap("costs at the plan's size");
  write_costs_json(scratch + "/costs.json", r.model.graph, at_plan);
  t.lap("costs.json");
  std::filesystem::remove_all(scratch);
  std::filesystem::remove_all(out);
  return 0;
}
