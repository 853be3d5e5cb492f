// One rank of `apart run`: the plan's stage, its schedule's actions, messages, the bucketed all-reduce and the step.
#include "runtime/pipeline.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>
#include <map>
#include <memory>
#include <set>

#include "codegen/stage_graphs.h"
#include "codegen/tensor_parallel_shard.h"
#include "graph/checked.h"
#include "graph/atomic_file.h"
#include "graph/error.h"
#include "graph/json_reader.h"
#include "graph/output_path.h"
#include "graph/sha256.h"
#include "plan/model_location.h"
#include "graph/text.h"
#include "importer/model_proto.h"
#include "plan/plan.h"
#include "profiler/collectives.h"
#include "runtime/checkpoint.h"
#include "runtime/preemption.h"
#include "runtime/run_checkpoint_files.h"
#include "runtime/device_messages.h"
#include "runtime/half_precision.h"
#include "runtime/executor.h"
#include "runtime/run_trace.h"
#include "runtime/zero_shards.h"

namespace apart {
namespace fs = std::filesystem;

void RunOptions::validate() const {
  if (plan.empty()) throw InvalidArgument("no plan given: apart run PLAN_DIR (what apart partition wrote)");
  checked_integer(steps, 1, limits::kMaxSteps, "--steps");
  checked_integer(schedule.warmup_steps, 0, limits::kMaxSteps, "--warmup-steps");
  checked_number(schedule.min_lr_ratio, 0, 1, "--min-lr-ratio");
  if (schedule.kind == LrScheduleKind::kConstant && schedule.warmup_steps > 0)
    throw InvalidArgument("--warmup-steps needs --lr-schedule cosine");
  checked_integer(save_every, 0, limits::kMaxSteps, "--save-every (0: only at the end)");
  if (save_every > 0 && checkpoint_dir.empty()) throw InvalidArgument("--save-every needs --checkpoint-dir");
  checked_integer(keep_last, 1, limits::kMaxSteps, "--keep-last");
  checked_integer(schedule.total_steps, 0, limits::kMaxSteps, "--lr-schedule-steps (0: --steps)");
  if (trace_all_steps && trace.empty()) throw InvalidArgument("--trace-all-steps needs --trace FILE");
  optimizer.validate();
  if (loss_scale.enabled) loss_scale.validate();
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The plan, the model and this rank's place in them, checked before any message is sent: every rank reads the same
// files and reaches the same verdict, so a bad plan fails everywhere with its own error and exit code.
struct RunSetup {
  // The pipeline this rank runs: the plan itself, or with tensor-parallel stages the view of this rank's TP rank
  // (schedule/ tensor_parallel_view: every stage tp 1, the devices of that TP rank); `full_plan` is plan.json as read.
  PlanDocument plan;
  PlanDocument full_plan;
  int tp = 1;  // the largest TP degree of any stage (schedule/ max_tp_degree); each stage's is its record's
  int positions = 1;  // pipeline positions P: the plan's stages (its view lists P·v chunks, chunk c at c mod P)
  fs::path plan_dir;
  fs::path model_path;
  RankRole role;
  int64_t global_batch = 0;
  int64_t microbatches = 1;
  int64_t microbatch_samples = 0;  // samples of a whole micro-batch (all replicas of a stage together)
  int loss_stage = -1;
  std::string loss;
  std::string plan_sha256;   // of plan.json's bytes: a checkpoint resumes only with the plan it was written for
  std::string model_sha256;
  // The whole model imported at the global batch (graph only): its loss, data roles, param holders and shapes.
  std::shared_ptr<const ImportedModel> model;
};

std::string rank_label(int rank, int world, const RankRole& role) {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world) + " stage " + std::to_string(role.stage) +
         " replica " + std::to_string(role.replica) + (role.tp_rank > 0 ? " tp rank " + std::to_string(role.tp_rank) : "");
}

// The model's loss, by the rule build_training_graph applies (codegen/autodiff.h choose_loss).
std::string model_loss(const TaskGraph& graph, const std::string& requested, const std::string& model) {
  std::vector<LossCandidate> outputs;
  for (ValueId v : graph.graph_outputs()) {
    const Value& value = graph.value(v);
    outputs.push_back({value.name, is_floating(value.dtype) && value.shape_known && value.elements == 1});
  }
  return choose_loss(outputs, requested, model);
}

// A stage file that is ONNX and fits its plan record: a graph input for each of the stage's plan inputs, a graph
// output for each of its plan outputs. Every rank checks every stage's file (protobuf only; weights are read by
// the rank that trains them), so a truncated, foreign or swapped stage_K.onnx fails everywhere before any message.
// `init`: under --init model the stage's external-data files (PLAN/weights/…, linked there by apart partition) must
// exist, or every rank refuses here, naming the file and --init random, which never reads them.
void check_stage_file(const fs::path& file, const PlanStageRecord& stage, ParamInit init) {
  std::vector<std::string> inputs, outputs;
  for (const PlanInput& in : stage.inputs) inputs.push_back(in.value);
  for (const PlanOutput& out : stage.outputs) outputs.push_back(out.value);
  // InvalidModel naming the file when it is not ONNX.
  const onnx::ModelProto proto = load_model_proto(file);
  if (init == ParamInit::kModel)
    for (const auto& t : proto.graph().initializer()) {
      if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
      for (const auto& kv : t.external_data()) {
        std::error_code ec;
        if (kv.key() != "location" || fs::is_regular_file(file.parent_path() / kv.value(), ec)) continue;
        throw InvalidModel("the weights of " + file.string() + " are external data in " +
                           quote((file.parent_path() / kv.value()).string()) + ", which is not present: link or copy the "
                           "model's weights file there to train from its weights, or pass --init random to train from "
                           "freshly initialized ones");
      }
    }
  const MissingInterface missing = missing_interface(proto, inputs, outputs);
  auto refuse = [&](const std::string& what, const std::string& value) {
    throw InvalidModel(file.string() + " is not stage " + std::to_string(stage.id) + " of this plan: plan.json's stages[" +
                       std::to_string(stage.id) + "]." + what + " names " + quote(value) + ", which the file does not " +
                       (what == "inputs" ? "take as an input" : "output") + "; re-run apart partition to rewrite the plan folder");
  };
  if (!missing.inputs.empty()) refuse("inputs", missing.inputs.front());
  if (!missing.outputs.empty()) refuse("outputs", missing.outputs.front());
}

RunSetup check_plan(const RunOptions& options, int rank, int world) {
  RunSetup s;
  s.plan = read_plan(options.plan);
  s.plan_dir = fs::is_directory(options.plan) ? fs::path(options.plan) : fs::path(options.plan).parent_path();
  const PlanDocument& plan = s.plan;
  check_executable(plan);  // before the stage files: a plan the runtime cannot run says so first
  const int devices = plan_devices(plan);
  if (devices != world)
    throw InvalidArgument("the plan " + options.plan + " runs on " + std::to_string(devices) + " processes (" +
                          std::to_string(plan.stages.size()) + " stages); this run has " + std::to_string(world) +
                          ": launch it with mpirun -np " + std::to_string(devices));
  // An interleaved plan runs as its chunks (plan/plan.h virtual_stage_view), each from its chunk_C.onnx.
  const bool interleaved = plan.training.schedule == Schedule::kInterleaved;
  const PlanDocument pipeline = interleaved ? virtual_stage_view(plan) : PlanDocument{};
  const PlanDocument& run = interleaved ? pipeline : plan;
  for (size_t k = 0; k < run.stages.size(); ++k) {
    const fs::path file = s.plan_dir / stage_file_name(run, static_cast<int>(k));
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      throw InvalidArgument("the plan folder " + s.plan_dir.string() + " has no " + file.filename().string() +
                            " (stage " + std::to_string(k) + " of " + std::to_string(run.stages.size()) +
                            "): re-run apart partition to write it");
    check_stage_file(file, run.stages[k], options.init);
  }
  if (!plan.training.global_batch)
    throw InvalidModel(options.plan + ": training.global_batch is missing; apart run needs it to split the batch");
  s.global_batch = *plan.training.global_batch;
  s.microbatches = plan.training.microbatches;
  if (s.global_batch % s.microbatches != 0)
    throw InvalidModel(options.plan + ": training.global_batch " + std::to_string(s.global_batch) +
                       " does not divide into " + std::to_string(s.microbatches) + " micro-batches");
  s.microbatch_samples = s.global_batch / s.microbatches;
  for (const auto& stage : plan.stages)
    if (s.microbatch_samples < stage.replicas)
      throw InvalidModel(options.plan + ": stage " + std::to_string(stage.id) + " has " + std::to_string(stage.replicas) +
                         " replicas, more than the " + std::to_string(s.microbatch_samples) +
                         " samples of a micro-batch: some replica would get none; re-run apart partition");

  // The model: --model, else the one the plan names, found from the plan folder first (plan/model_location.h), and
  // the same bytes (sha256).
  const PlanModelLocation model = locate_plan_model(plan, plan_json_path(options.plan).parent_path(), options.model);
  s.model_path = model.path;
  s.model_sha256 = model.sha256;
  s.plan_sha256 = sha256_file_hex(plan_json_path(options.plan));
  s.role = rank_role(plan, rank);
  s.tp = max_tp_degree(plan);
  if (s.tp > 1) {
    // Every region a TP stage splits needs its shard layout (plans before apart run executed TP stages lack it).
    const bool laid_out = plan.tensor_parallel.has_value() &&
                          std::all_of(plan.tensor_parallel->regions.begin(), plan.tensor_parallel->regions.end(),
                                      [](const PlanTpRegion& r) {
                                        return (r.kind != TpRegionKind::kAttention && r.kind != TpRegionKind::kMlp) ||
                                               r.has_shard_layout();
                                      });
    if (!laid_out)
      throw InvalidModel(options.plan + ": the stages are tensor-parallel (tp " + std::to_string(s.tp) + ") but plan.json "
                         "lacks the regions' shard layout (tensor_parallel.regions[].column_tasks …); re-run apart "
                         "partition to rewrite the plan");
  }
  s.positions = static_cast<int>(plan.stages.size());
  if (interleaved) {  // the chunks are the stages; the rank's role is its first chunk's, d (the stage it sits at)
    s.plan = pipeline;
    s.role = rank_role(s.plan, rank);
  }
  s.full_plan = s.plan;
  s.plan = tensor_parallel_view(s.full_plan, s.role.tp_rank);
  return s;
}

// A value crossing a stage boundary as this rank holds it: its shape for this rank's samples of a micro-batch, and
// the axis along which samples lie (-1: the value does not scale with the batch, e.g. a mask computed from constants).
struct BoundaryValue {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  int batch_axis = -1;
  int64_t rows_per_sample = 0;  // along batch_axis

  int64_t bytes() const { return checked_element_count(shape).value_or(0) * dtype_size(dtype); }
  // Bytes of `samples` of it (the whole value when it does not scale with the batch).
  int64_t slice_bytes(const SampleRange& samples) const {
    if (batch_axis < 0) return bytes();
    return bytes() / shape[static_cast<size_t>(batch_axis)] * (samples.end - samples.begin) * rows_per_sample;
  }
};

// The batch axis of a stage file's boundary value: the dim declared as the batch symbol or a multiple of it.
int batch_axis_of(const onnx::ValueInfoProto& info, const std::string& symbol) {
  if (symbol.empty() || !info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) return -1;
  const auto& dims = info.type().tensor_type().shape().dim();
  for (int a = 0; a < dims.size(); ++a) {
    const std::string& p = dims[a].dim_param();
    if (p == symbol || (p.size() > symbol.size() && p.compare(p.size() - symbol.size() - 1, std::string::npos, "*" + symbol) == 0))
      return a;
  }
  return -1;
}

struct Strided {
  int64_t outer = 1;      // product of the dims before the batch axis
  int64_t row_bytes = 0;  // bytes of one row along the batch axis
};
Strided strides_of(const BoundaryValue& v) {
  Strided s;
  s.row_bytes = dtype_size(v.dtype);
  for (size_t a = 0; a < v.shape.size(); ++a) {
    if (static_cast<int>(a) < v.batch_axis) s.outer *= v.shape[a];
    if (static_cast<int>(a) > v.batch_axis) s.row_bytes *= v.shape[a];
  }
  return s;
}

// Appends samples `samples` of tensor `t` (holding the samples from `first`) to `message`.
void pack(const BoundaryValue& v, const Tensor& t, int64_t first, const SampleRange& samples, std::vector<std::byte>& message) {
  if (v.batch_axis < 0) {
    message.insert(message.end(), t.raw(), t.raw() + t.bytes());
    return;
  }
  const Strided s = strides_of(v);
  const int64_t dim = v.shape[static_cast<size_t>(v.batch_axis)];
  const int64_t row0 = (samples.begin - first) * v.rows_per_sample, rows = (samples.end - samples.begin) * v.rows_per_sample;
  for (int64_t o = 0; o < s.outer; ++o) {
    const std::byte* from = t.raw() + (o * dim + row0) * s.row_bytes;
    message.insert(message.end(), from, from + rows * s.row_bytes);
  }
}

// Reads `v`'s part of a message at `at` into tensor `t` (holding the samples from `first`); `add`: sums into it
// (float32 gradients) instead of copying.
size_t unpack(const BoundaryValue& v, const std::byte* at, Tensor& t, int64_t first, const SampleRange& samples, bool add) {
  auto put = [&](std::byte* to, const std::byte* from, int64_t bytes) {
    if (!add) {
      std::memcpy(to, from, static_cast<size_t>(bytes));
      return;
    }
    float* dst = reinterpret_cast<float*>(to);
    const float* src = reinterpret_cast<const float*>(from);
    for (int64_t i = 0; i < bytes / 4; ++i) dst[i] += src[i];
  };
  if (v.batch_axis < 0) {
    put(t.raw(), at, t.bytes());
    return static_cast<size_t>(t.bytes());
  }
  const Strided s = strides_of(v);
  const int64_t dim = v.shape[static_cast<size_t>(v.batch_axis)];
  const int64_t row0 = (samples.begin - first) * v.rows_per_sample, rows = (samples.end - samples.begin) * v.rows_per_sample;
  size_t used = 0;
  for (int64_t o = 0; o < s.outer; ++o) {
    put(t.raw() + (o * dim + row0) * s.row_bytes, at + used, rows * s.row_bytes);
    used += static_cast<size_t>(rows * s.row_bytes);
  }
  return used;
}

// Where samples `samples` of `v` lie in a tensor holding the samples from `first`: byte runs (device_messages.h).
std::vector<ByteRun> slice_runs(const BoundaryValue& v, int64_t first, const SampleRange& samples) {
  if (v.batch_axis < 0) return {{0, v.bytes()}};
  const Strided s = strides_of(v);
  return row_runs(s.outer, v.shape[static_cast<size_t>(v.batch_axis)], (samples.begin - first) * v.rows_per_sample,
                  (samples.end - samples.begin) * v.rows_per_sample, s.row_bytes);
}

// Bytes [offset, offset + bytes) of a float32 message (both multiples of 4), over the same memory.
Tensor float_range(const Tensor& message, size_t offset, size_t bytes) {
  return message.flat_range(static_cast<int64_t>(offset / 4), static_cast<int64_t>((offset + bytes) / 4));
}

// Rows [begin, end) along axis 0 of a batch-first data tensor.
Tensor batch_rows(const Tensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = t.shape();
  const int64_t row = t.bytes() / shape[0];
  shape[0] = end - begin;
  Tensor out(t.dtype(), shape);
  std::memcpy(out.raw(), t.raw() + begin * row, static_cast<size_t>((end - begin) * row));
  return out;
}

// DIR/manifest.json: which step the folder holds, for which plan, model and world (docs/runtime.md).
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kManifestFormat = "apart.run-checkpoint/1";

struct Manifest {
  int64_t step = 0;
  int world = 0;
  std::string plan_sha256, model_sha256, optimizer, data;
  uint64_t seed = 0;
  std::string folder;  // "step_N", relative to the manifest; "." in the copy inside step_N
  int64_t lr_schedule_steps = 0;     // the span of the writing run's schedule (0: not recorded, an older manifest)
  std::vector<std::string> kept;     // earlier complete step folders still kept (--keep-last), oldest first
  // For a resume at another layout of the same plan (absent in manifests before it): checkpoint_layout of the plan
  // and each rank's role.
  nlohmann::json layout;
  std::vector<RankRole> ranks;
};

// What a checkpoint's state depends on: which tasks (so which params) each stage holds and its TP degree, and the
// global batch (the data continues by step). Not the replicas or the ZeRO stage: resuming reshards over those. An
// interleaved plan's "stages" are its P·v chunks, and "positions" is P (chunk c sits at stage c mod P); absent, the
// stages are the plan's (so a layout written before interleaved checkpoints reads the same).
nlohmann::json checkpoint_layout(const RunSetup& s) {
  nlohmann::json stages = nlohmann::json::array();
  for (const PlanStageRecord& stage : s.full_plan.stages) {
    std::string tasks;
    for (const std::string& t : stage.tasks) tasks += t + "\n";
    stages.push_back({{"tasks_sha256", sha256_hex(tasks)}, {"tp", stage.tp}});
  }
  nlohmann::json layout = {{"global_batch", s.global_batch}, {"stages", stages}};
  if (is_virtual_stage_view(s.full_plan)) layout["positions"] = s.positions;
  return layout;
}

// A layout as the refusals name it: "1 stage", "2 stages", or "4 chunks over 2 stages (interleaved, v = 2)".
std::string describe_layout(const nlohmann::json& layout) {
  const size_t stages = layout.value("stages", nlohmann::json::array()).size();
  if (!layout.contains("positions")) return std::to_string(stages) + (stages == 1 ? " stage" : " stages");
  const nlohmann::json& positions = layout["positions"];
  const int64_t p = positions.is_number_integer() ? positions.get<int64_t>() : 0;
  return std::to_string(stages) + " chunks over " + positions.dump() + " stages (interleaved, v = " +
         (p > 0 ? std::to_string(static_cast<int64_t>(stages) / p) : std::string("?")) + ")";
}

// A rank's shard of a checkpoint: rank_R.apart, or in an interleaved plan one file per chunk C it holds,
// rank_R.chunk_C.apart (each chunk has its own params, optimizer and ZeRO pieces).
std::string shard_name(int rank, int chunk = -1) {
  return "rank_" + std::to_string(rank) + (chunk >= 0 ? ".chunk_" + std::to_string(chunk) : "") + ".apart";
}

Manifest read_manifest(const fs::path& dir) {
  const fs::path file = dir / kManifestFile;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw InvalidArgument("--resume " + dir.string() + ": no " + kManifestFile + " (not a checkpoint folder apart run wrote, "
                          "or its first save did not finish)");
  const nlohmann::json j = read_sealed_manifest(file);  // its checksum verified
  const JsonReader r(file.string(), kManifestFormat, "docs/runtime.md", JsonReader::Null::kInvalid,
                     ErrorKind::kInvalidArgument, "resume from a checkpoint folder apart run wrote");
  if (!j.is_object() || r.string(j, "", "format") != kManifestFormat) r.fail("format", std::string("must be ") + kManifestFormat);
  Manifest m;
  m.step = r.integer(j, "", "step", 0, limits::kMaxSteps);
  m.world = static_cast<int>(r.integer(j, "", "world", 1, limits::kMaxDevices));
  m.plan_sha256 = r.string(j, "", "plan_sha256");
  m.model_sha256 = r.string(j, "", "model_sha256");
  m.optimizer = r.string(j, "", "optimizer");
  m.data = r.string(j, "", "data");
  m.seed = static_cast<uint64_t>(r.integer(j, "", "seed", 0, JsonReader::kMaxInteger));
  m.folder = r.string(j, "", "folder");
  if (m.folder != "step_" + std::to_string(m.step) && m.folder != ".") r.fail("folder", "must be step_" + std::to_string(m.step));
  if (j.contains("lr_schedule_steps")) m.lr_schedule_steps = r.integer(j, "", "lr_schedule_steps", 1, limits::kMaxSteps);
  if (j.contains("kept"))
    for (const auto& k : r.array(j, "", "kept"))
      if (k.is_string() && k.get<std::string>().rfind("step_", 0) == 0 && k.get<std::string>().find('/') == std::string::npos)
        m.kept.push_back(k.get<std::string>());
  if (j.contains("layout") && j.contains("ranks")) {
    m.layout = j["layout"];
    if (!m.layout.is_object()) r.fail("layout", "must be an object");
    if (!j["ranks"].is_array() || static_cast<int>(j["ranks"].size()) != m.world) r.fail("ranks", "must list every rank");
    for (const auto& role : j["ranks"]) {
      if (!role.is_array() || role.size() != 3 || !role[0].is_number_integer() || !role[1].is_number_integer() ||
          !role[2].is_number_integer())
        r.fail("ranks", "each must be [stage, replica, tp_rank]");
      m.ranks.push_back({role[0].get<int>(), role[1].get<int>(), role[2].get<int>()});
    }
  }
  return m;
}

// A checkpoint of another world size or plan resumes when this plan has its layout (checkpoint_layout: the same
// stages, or chunks at the same positions, with the same tasks and TP degrees, and the global batch), at any replicas
// and ZeRO stage; otherwise InvalidArgument naming what differs (both layouts when those do).
void check_resharding(const Manifest& m, const RunSetup& setup, int world, const std::string& where) {
  if (m.layout.is_null())
    throw InvalidArgument(where + " was written by a run on " + std::to_string(m.world) + " ranks of " +
                          (m.plan_sha256 == setup.plan_sha256 ? "this plan" : "another plan") + " (this run has " +
                          std::to_string(world) + ") before checkpoints recorded their layout: resume with the "
                          "plan and the rank count it was written with");
  const nlohmann::json mine = checkpoint_layout(setup);
  auto refuse = [&](const std::string& what) {
    throw InvalidArgument(where + " was written for a plan " + what + "; a checkpoint resumes on a plan of the same "
                          "stages or chunks (tasks and TP degree) and global batch, at any replicas and ZeRO stage: "
                          "re-partition with the same --stages/--tp/--batch/--schedule/--virtual-stages, or resume "
                          "with the plan it was written with");
  };
  const nlohmann::json& theirs = m.layout.value("stages", nlohmann::json::array());
  if (m.layout.value("global_batch", nlohmann::json()) != mine["global_batch"])
    refuse("of global batch " + m.layout.value("global_batch", nlohmann::json()).dump() + " (this plan's: " +
           mine["global_batch"].dump() + ")");
  if (theirs.size() != mine["stages"].size() || m.layout.value("positions", nlohmann::json()) != mine.value("positions", nlohmann::json()))
    refuse("of " + describe_layout(m.layout) + " (this plan has " + describe_layout(mine) + ")");
  const std::string part = mine.contains("positions") ? "chunk " : "stage ";
  auto degrees = [](const nlohmann::json& stages) {  // "[2, 1]": each stage's (or chunk's) TP degree
    std::string listed;
    for (const nlohmann::json& stage : stages)
      listed += (listed.empty() ? "" : ", ") + (stage.is_object() ? stage.value("tp", nlohmann::json()).dump() : "?");
    return "[" + listed + "]";
  };
  if (degrees(theirs) != degrees(mine["stages"]))
    refuse(std::string("whose ") + (mine.contains("positions") ? "chunks" : "stages") + " have TP degrees " +
           degrees(theirs) + " (this plan's: " + degrees(mine["stages"]) + ")");
  for (size_t k = 0; k < theirs.size(); ++k) {
    if (theirs[k].value("tasks_sha256", nlohmann::json()) != mine["stages"][k]["tasks_sha256"])
      refuse("whose " + part + std::to_string(k) + " holds other tasks (the model cut elsewhere)");
  }
}

// One micro-batch's storage on this rank: what its forward received and left for the backward, and the
// gradients of its outputs as they arrive.
struct Frame {
  std::map<std::string, Tensor> inputs;        // boundary values from earlier stages
  std::map<std::string, Tensor> carried;       // ZB-H1: what the W pass reads, from its B pass
  std::map<std::string, Tensor> outputs;       // boundary values for later stages (until sent)
  std::map<std::string, Tensor> stash;         // forward → backward
  std::map<std::string, Tensor> output_grads;  // by gradient input name
  std::map<std::string, Tensor> input_grads;   // by stage input name
};

// The gradients of a stage's params in all-reduce buckets (PyTorch DDP's 25 MB), in the order the backward
// produces them, so a bucket starts reducing while the rest of the last backward runs. On a host-memory backend
// the gradient accumulators are views of their bucket's buffer, which the collective reduces in place.
// Under ZeRO (stage.zero ≥ 1 with replicas) the buckets of params no other stage holds are `sharded`: padded to a
// multiple of the replicas and reduce-scattered (runtime/zero_shards.h); tied params keep whole buckets. Under
// ZeRO-2/3 a sharded bucket holds one param: it is filled, reduce-scattered and freed micro-batch by micro-batch,
// and ZeRO-3 gathers it for each task that reads the param, so that what a replica holds beyond its shards is a
// param or two at a time (the planner's working set), not a 25 MB bucket.
struct Bucket {
  std::vector<size_t> params;
  Tensor flat;  // float32: host memory (counted in tensor_memory()), or `device`'s
  // The backend whose memory holds `flat` when the bucket is reduced there (over RunOptions::device_world: its
  // all-reduce, and under ZeRO its reduce-scatter and the params' all-gather); null: the host.
  Backend* device = nullptr;
  float* values() { return flat.data<float>(); }
  std::span<float> span() { return flat.span<float>(); }
  Tensor fresh(int64_t elements) const {  // a zeroed buffer where the bucket's collectives run
    return device ? device->empty(DType::kFloat32, {elements}) : Tensor(DType::kFloat32, {elements});
  }
  void hold(int64_t elements) {  // zeroed when fresh; the padding stays zero through every collective
    if (flat.elements() != elements || !flat.defined()) flat = fresh(elements);
  }
  size_t ready = 0;
  Pending reduction;
  bool sharded = false;
  int64_t collected = 0;  // ZeRO-2/3: the micro-batches whose reduced shard this step has added into the pieces
};

// What the stages a rank runs share: the communicators of the tied-param sets this rank holds (by the set of stages
// holding them; one per set and rank, however many of its chunks hold them) and the params --save-model gathers
// on world rank 0.
// Calls run(whole, part, count) for each contiguous run of elements rank `rank` of `degree` holds of the sliced
// param `p`: `whole` its offset in the whole param, `part` in the rank's slice.
template <class Run>
void for_each_tp_run(const TpShardedParam& p, int degree, int rank, const Run& run) {
  int64_t outer = 1, inner = 1;
  for (int a = 0; a < p.axis; ++a) outer *= p.shape[static_cast<size_t>(a)];
  for (size_t a = static_cast<size_t>(p.axis) + 1; a < p.shape.size(); ++a) inner *= p.shape[a];
  const int64_t length = p.shape[static_cast<size_t>(p.axis)];
  const auto ranges = tp_param_ranges(p, degree, rank);  // a vocabulary's last rank: fewer rows
  int64_t kept = 0;
  for (const auto& [b, e] : ranges) kept += e - b;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t at = 0;
    for (const auto& [b, e] : ranges) {
      run((o * length + b) * inner, (o * kept + at) * inner, (e - b) * inner);
      at += e - b;
    }
  }
}

// Whether the stages holding a tied param differ in TP degree: their tie then sums whole-size gradients over every
// holder (RankRunner::split_ties) instead of each TP rank's slices over its own group.
bool mixed_tp_degrees(const PlanDocument& plan, const std::set<int>& stages) {
  std::set<int> degrees;
  for (int s : stages) degrees.insert(std::max(1, plan.stages[static_cast<size_t>(s)].tp));
  return degrees.size() > 1;
}

struct RankShared {
  std::vector<std::set<int>> tie_sets;  // the sets of stages holding a common param, the same on every rank
  std::map<std::set<int>, std::unique_ptr<Communicator>> ties;  // the sets this rank holds: their communicators
  // … the same over RunOptions::device_world (NCCL), where the tied gradients are summed on the device
  std::map<std::set<int>, std::unique_ptr<Communicator>> device_ties;
  std::set<std::set<int>> whole_ties;  // … those summed in whole-size buffers (RankRunner::split_ties)
  std::map<std::string, Tensor> saved;
};

// One stage of the plan on this rank: its programs, params, gradients, buckets and optimizer. A rank runs one, or in
// an interleaved plan one per chunk it holds (RankRunner), each chunk a stage of the plan's virtual-stage view.
class StageRunner {
 public:
  StageRunner(const RunOptions& options, const RunSetup& setup, Communicator& world, int stage, RankShared& shared)
      : options_(options), setup_(setup), world_(world), plan_(setup.plan),
        stage_(setup.plan.stages[static_cast<size_t>(stage)]), model_(setup.model.get()), shared_(shared),
        backend_(options.backend ? *options.backend : cpu_backend()) {}

  void set_up();  // programs, communicators (collective over the world: every rank's chunks in the same order), buckets
  void begin_step();
  // Runs a forward, backward, send, receive or all-reduce of this stage; the bytes a message carried.
  size_t act(const Action& a, const std::map<std::string, Tensor>& batch, int64_t step);
  // The step, around the rank's sum of tied gradients and the world all-reduce of every stage's `totals` [Σ‖g‖²,
  // loss, then a not-finite flag per rank]: wait for the sends and the all-reduce and unscale; the gradients of the
  // params this stage shares with the stages `stages` (RankShared::ties' keys), in the tie's param order (none when it
  // holds none); add this stage's share of `totals`; step the optimizer.
  void unscale_gradients();
  std::vector<Tensor*> tied_gradients(const std::set<int>& stages);
  // A tie summed in whole-size buffers (RankRunner::split_ties): adds this stage's gradients of its params into whole-size buffers
  // (one per param, created at the first stage holding them) when it contributes — replica 0, its slice at its rows,
  // a param it holds whole from TP rank 0 only —, and takes its own rows back from their sums. The buffers are host
  // tensors, or with `on_device` the backend's (summed over the device world).
  void add_tied_gradients(const std::set<int>& stages, std::vector<Tensor>& whole, bool on_device);
  // How this stage holds a tie's params: -1 not at all, 1 cut over its TP group (a vocabulary region), 0 whole.
  int tied_layout(const std::set<int>& stages) const {
    for (const Tie& tie : ties_)
      if (tie.stages == stages)
        return std::any_of(tie.params.begin(), tie.params.end(), [&](size_t i) { return tp_sharded_.count(param_names_[i]) > 0; });
    return -1;
  }
  void take_tied_gradients(const std::set<int>& stages, const std::vector<Tensor>& whole);
  void add_totals(std::vector<double>& totals);
  StepRecord apply_step(int64_t step, const std::vector<double>& totals, const LrSchedule& schedule);
  // --save-model: the params world rank 0 writes, gathered into shared_.saved (every stage of every rank calls it,
  // chunk by chunk); `write` (rank 0's last stage) writes the model.
  void save_model(bool write);
  // Checkpoints, around RankRunner's manifest: this stage's shard written into the step's `folder`, and read back
  // from a checkpoint of this plan and world size; or, from one of another world size or plan of the same layout
  // (check_resharding), this stage's shards at this TP rank put together whole and cut as this run's replicas and
  // ZeRO stage lay them out.
  void write_checkpoint_shard(const fs::path& folder, int64_t step_done);
  void restore(const fs::path& folder, const std::string& where);
  void restore_resharded(const fs::path& folder, const Manifest& m, const std::string& where);
  std::string optimizer() const { return std::string(optimizer_name(optimizer_->options().kind)); }
  void prepare_optimizer();  // its state before step 1's copies fill the backend's pool; this stage's figures
  std::map<std::string, Tensor> batch(int64_t step) const { return data_->batch(step); }
  const RunResult& result() const { return result_; }
  const PlanStageRecord& stage() const { return stage_; }

 private:
  void build();
  void build_communicators();
  void build_buckets_and_optimizer();  // after the communicators: ZeRO shards only params no other stage holds
  void forward(int64_t k, const std::map<std::string, Tensor>& batch, int64_t step);
  void backward(int64_t k, int64_t step);         // the whole backward; under ZB-H1 its B pass
  void backward_weight(int64_t k, int64_t step);  // ZB-H1's W pass
  // What a backward pass calls for each output: accumulates a param gradient (micro-batch `first`/`last` of the
  // pass that produces it), weighted by `weight`, and starts its bucket's collective when it completes.
  // Returns whether `name` is a param gradient (then the executor frees it: it is added in).
  bool accumulate_gradient(const std::string& name, const Tensor& value, bool first, bool last, double weight);
  void after_param_gradients();  // ZeRO-2: collect the pass's reduce-scatters
  Tensor* param_tensor(const std::string& name) const;
  size_t send(const Action& a);  // bytes sent
  size_t recv(const Action& a);  // bytes received
  // This TP rank's part of a boundary message of `bytes` for `a` (host messages). When this stage and the stage at
  // the other end are cut over TP groups of one degree t, TP rank r sends and receives part r of the message padded
  // to a multiple of 4·t bytes, and the receivers all-gather the whole message over their group, as the planner
  // costs a TP stage's boundary (partition/stage_cost.h boundary_share); otherwise the part is the whole message.
  struct MessagePart {
    int parts = 1;
    size_t offset = 0, bytes = 0;  // this rank's part of the message
    size_t padded = 0;             // the whole message's length: parts · bytes
  };
  MessagePart message_part(const Action& a, size_t bytes) const;
  // The same over options_.device_world: packed and unpacked on the backend, sends grouped with the next receive.
  size_t send_on_device(const Action& a);
  size_t recv_on_device(const Action& a);
  void finish_allreduce();
  // Where bucket b's collectives run: the device replicas (NCCL) when its buffer is the backend's, else the host's.
  Communicator& replicas_of(const Bucket& b) { return b.device ? *device_replicas_ : *replicas_; }
  // ZeRO-2/3: waits for bucket b's reduce-scatter of one micro-batch, adds this replica's shard into the pieces it
  // steps and frees the bucket's buffer.
  void collect_shard(Bucket& b);
  // ZeRO-2/3: collects every reduce-scatter still in flight.
  void collect_shards();
  // ZeRO: this replica's pieces of sharded bucket `bucket` into `flat` (its whole buffer), and its all-gather started.
  Pending start_allgather(size_t bucket, Tensor& flat);
  // ZeRO: every replica's shards of the sharded buckets into every replica's params, a few buckets in flight at a
  // time: after the step under ZeRO-1/2 (copied into the whole params), for --save-model under ZeRO-3 (bound whole
  // into the executors' slots until release_params).
  void allgather_params();
  // ZeRO-3: param `name` whole, gathered for one task (the executors' param source, Executor::set_param_source).
  Tensor gathered_param(const std::string& name);
  // ZeRO-3: empties the sharded params' slots, so that between tasks this replica holds only its pieces.
  void release_params();
  // The elements of bucket b's flat buffer: its params', padded to a multiple of the replicas when it is sharded.
  int64_t flat_length(const Bucket& b) const {
    int64_t n = 0;
    for (size_t p : b.params) n += param_elements_[p];
    return b.sharded ? sharded_bucket_length(n, replicas_ ? replicas_->size() : 1) : n;
  }
  // ZeRO-3 empties this param's tensors between passes: a param of a sharded bucket.
  bool sharded_between_uses(size_t param) const { return zero_ >= 3 && buckets_[bucket_of_[param]].sharded; }
  // The tensors a checkpoint shard holds: "param/<name>" (trained and BatchNorm statistics) and "optim/<name>/<slot>".
  std::vector<std::pair<std::string, Tensor*>> checkpoint_tensors();
  SampleRange my_samples() const { return replica_samples(setup_.microbatch_samples, stage_.replicas, setup_.role.replica); }
  // What this rank's backward is weighted by: its loss is the mean over its slice of n_j samples, and the batch's
  // mean weighs every sample alike, so a loss-stage replica scales its gradients by n_j · r / n (1 with equal
  // slices; the step then divides the sum over micro-batches and replicas by m · r). Scaling everything its backward
  // produces (param and input gradients) is scaling its loss seed: the backward is linear in it.
  double loss_weight() const {
    if (graphs_.loss_output.empty()) return 1;
    const SampleRange mine = my_samples();
    return static_cast<double>(mine.end - mine.begin) * stage_.replicas / static_cast<double>(setup_.microbatch_samples);
  }
  // The values of a message on the edge from → to (the receiving stage's inputs from `from`, in plan order);
  // gradient messages carry the float ones.
  std::vector<std::string> edge_values(int from, int to, bool gradient) const;
  const BoundaryValue& boundary(const std::string& name) const;

  const RunOptions& options_;
  const RunSetup& setup_;
  Communicator& world_;
  const PlanDocument& plan_;
  const PlanStageRecord& stage_;
  const ImportedModel* model_;  // setup_.model: the whole model at the global batch (data roles, param owners)
  RankShared& shared_;
  StageGraphs graphs_;
  // backward_ computes the param gradients: the whole backward, or under ZB-H1 its W pass, with input_pass_ its
  // B pass (nullptr when the stage has no input gradients: W is then the whole backward).
  std::unique_ptr<Executor> forward_, backward_, input_pass_;
  bool zero_bubble_ = false;
  std::map<std::string, BoundaryValue> boundary_;
  std::vector<std::string> param_names_;
  std::vector<Tensor*> params_;
  std::vector<int64_t> param_elements_;  // by param: what its tensor holds whole (ZeRO-3 empties it between uses)
  std::vector<std::vector<int64_t>> param_shapes_;
  // By param: each executor's slot for it (forward, backward, B pass; shared storage). ZeRO-3 binds the gathered
  // param into every slot for a pass and empties them after it.
  std::vector<std::vector<Tensor*>> param_slots_;
  std::map<std::string, size_t> param_index_;  // param name → index
  std::vector<Tensor> grads_;              // accumulated over the step's micro-batches
  bool grads_in_buckets_ = false;          // grads_ are views of their buckets' buffers (a host-memory backend)
  std::map<std::string, size_t> grad_index_;  // gradient output name → param index
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> bucket_at_;        // by param: where it starts in its bucket's buffer
  std::deque<size_t> reducing_;           // ZeRO-2/3: buckets whose reduce-scatter is in flight, oldest first
  std::vector<std::pair<uint32_t, size_t>> production_order_;  // (producer position in the backward, param)
  std::unique_ptr<Communicator> replicas_;  // this stage's replicas (nullptr with one)
  // Over options_.device_world (NCCL): the replicas again, for the bucket all-reduce on device buffers (without
  // ZeRO), and the stage boundaries' messages (not in interleaved plans). Null on the host path.
  std::unique_ptr<Communicator> device_replicas_;
  std::unique_ptr<DeviceMessages> device_messages_;
  // This replica's TP group (nullptr without TP): the shards' collectives run over it; device_tp_group_ is the same
  // group over options_.device_world (NCCL), which runs them on device tensors (null on the host path).
  std::unique_ptr<Communicator> tp_group_;
  std::unique_ptr<Communicator> device_tp_group_;
  // The params this rank holds a slice of (codegen/tensor_parallel_shard.h), by name.
  std::map<std::string, TpShardedParam> tp_sharded_;
  // Whether this rank adds param i to the global norm and the tied sums: one holder of a replicated param (TP rank 0),
  // every TP rank for its slice of a sharded one.
  int tp() const { return std::max(1, setup_.full_plan.stages[static_cast<size_t>(stage_.id)].tp); }  // this stage's
  bool tp_counts(size_t param) const { return setup_.role.tp_rank == 0 || tp_sharded_.count(param_names_[param]) > 0; }
  void build_tensor_parallel_shard(onnx::ModelProto& proto);
  // --save-model: every sharded param of this stage whole, gathered over the TP group (every TP rank calls it).
  std::map<std::string, Tensor> gather_tp_params();
  int zero_ = 0;  // the ZeRO stage the replicas run: stage.zero, 0 without replicas
  // What the optimizer steps: every param whole without ZeRO; under ZeRO the pieces of the sharded buckets this
  // replica owns (views of the params; gradients: views of grads_ for ZeRO-1, accumulators for ZeRO-2) and the
  // tied params whole. Names are the params', "name[begin:end]" for a piece of one.
  std::vector<std::string> step_names_;
  std::vector<Tensor*> step_params_;
  std::vector<Tensor*> step_grads_;
  std::vector<bool> step_counts_in_norm_;
  std::vector<ShardPiece> pieces_;
  std::vector<std::vector<size_t>> pieces_of_bucket_;  // by bucket: indices into pieces_
  std::vector<Tensor> piece_params_, piece_grads_;
  // Params held by several stages (tied embeddings): one communicator per set of holding stages.
  struct Tie {
    std::set<int> stages;  // the stages holding them
    std::vector<size_t> params;
  };
  std::vector<Tie> ties_;
  std::vector<bool> counts_in_norm_;  // by param: this rank adds it to the global norm (one holder, replica 0)
  std::map<std::string, int> owner_stage_;  // param → the lowest stage holding it
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<ParamOptimizer> optimizer_;
  LossScaler scaler_{options_.loss_scale};  // 1 unless --precision fp16: the loss stage's seed, every rank's unscaling
  Backend& backend_;  // options_.backend or the CPU backend: the executors', the gradients' and the optimizer's
  std::vector<Frame> frames_;
  std::vector<std::pair<std::vector<std::byte>, Pending>> sends_;
  std::vector<double> losses_;
  int64_t backwards_done_ = 0;
  int64_t weight_passes_done_ = 0;
  RunResult result_;
};

std::vector<std::string> StageRunner::edge_values(int from, int to, bool gradient) const {
  std::vector<std::string> names;
  for (const PlanInput& in : plan_.stages[static_cast<size_t>(to)].inputs) {
    if (in.from_stage != from) continue;
    const auto id = model_->graph.find_value(in.value);
    APART_CHECK(id.has_value(), "plan value " + in.value + " is not in the model");
    if (gradient && !is_floating(model_->graph.value(*id).dtype)) continue;
    names.push_back(in.value);
  }
  return names;
}

const BoundaryValue& StageRunner::boundary(const std::string& name) const {
  auto it = boundary_.find(name);
  APART_CHECK(it != boundary_.end(), "stage " + std::to_string(stage_.id) + " has no boundary value " + name);
  return it->second;
}

void StageRunner::build() {
  const int s = stage_.id;
  const fs::path stage_file = setup_.plan_dir / stage_file_name(plan_, s);

  onnx::ModelProto proto = load_model_proto(stage_file);
  ImportOptions import;
  const SampleRange mine = my_samples();  // this replica's slice: ⌈n/r⌉ or ⌊n/r⌋ samples
  import.batch = mine.end - mine.begin;
  import.batch_explicit = true;
  import.require_external_data = options_.init == ParamInit::kModel;
  import.constants_as_params = false;  // the stage file as partition wrote it (its Constant weights already converted)
  // The stage reads exactly what the plan sends it: values of another stage it reads only for their shape (replicated
  // Shape tasks) are folded at this rank's micro-batch, before the TP shard (its inputs are whole).
  std::set<std::string> sent;
  for (const PlanInput& in : stage_.inputs) sent.insert(in.value);
  fold_shape_only_inputs(proto, sent, import);
  if (options_.init == ParamInit::kRandom) randomize_params(proto, options_.seed);
  widen_half_precision(proto, setup_.plan_dir);  // a float16/bfloat16 stage trains in float32, as apart train does
  if (tp() > 1) {
    build_tensor_parallel_shard(proto);
  } else if (setup_.tp > 1) {  // the TP groups' splits are collective over the world (and the device world)
    world_.split(-1, world_.rank());
    if (options_.device_world) options_.device_world->split(-1, world_.rank());
  }

  // Boundary values: those from earlier stages come in (their gradients go out), those for later stages go out.
  StageGraphOptions g;
  g.training.import = import;
  g.recompute = stage_.recompute;
  zero_bubble_ = plan_.training.schedule == Schedule::kZbH1;
  g.split_weight_pass = zero_bubble_;
  if (scaler_.enabled()) g.training.loss_seed_input = kLossScaleInput;  // used on the loss's stage only
  g.training.fuse_attention = backend_.find_kernel("ai.apart.AttentionGrad") != nullptr;  // as apart train decides
  auto floating = [&](const std::string& v) {
    const auto id = model_->graph.find_value(v);
    return id && is_floating(model_->graph.value(*id).dtype);
  };
  for (const PlanOutput& out : stage_.outputs) {
    if (out.value == setup_.loss) g.training.loss = setup_.loss;
    if (!out.to_stages.empty() && floating(out.value)) g.training.output_gradients.push_back(out.value);
  }
  for (const PlanInput& in : stage_.inputs)
    if (in.from_stage >= 0 && floating(in.value)) g.training.input_gradients.push_back(in.value);
  graphs_ = build_stage_graphs(proto, g);

  ExecutorOptions exec;
  exec.backend = &backend_;
  exec.outputs_on_backend = true;  // stash and gradients stay on the backend; boundary values go to the host to be sent
  exec.tensor_parallel = tp_group_.get();
  exec.tensor_parallel_on_backend = device_tp_group_.get();  // NCCL: the shards' collectives on device tensors
  exec.arena = false;  // each pass holds what it needs while it runs, nothing between runs (docs/runtime.md, "ZeRO")
  exec.precompute_max_bytes = 64 << 10;  // shape arithmetic and small masks; no param-sized constant held for good
  forward_ = std::make_unique<Executor>(graphs_.forward, setup_.plan_dir, exec, import);
  backward_ = std::make_unique<Executor>(zero_bubble_ ? graphs_.weight_pass : graphs_.backward, setup_.plan_dir, exec, import);
  backward_->share_params(*forward_);
  if (zero_bubble_ && graphs_.input_pass.graph().output_size() > 0) {
    input_pass_ = std::make_unique<Executor>(graphs_.input_pass, setup_.plan_dir, exec, import);
    input_pass_->share_params(*forward_);
  }
  result_.arena_bytes = std::max({forward_->memory_plan().peak_bytes, backward_->memory_plan().peak_bytes,
                                  input_pass_ ? input_pass_->memory_plan().peak_bytes : int64_t{0}});
  result_.backend = backend_.describe();
  std::set<std::string> fallback(forward_->fallback_ops().begin(), forward_->fallback_ops().end());
  fallback.insert(backward_->fallback_ops().begin(), backward_->fallback_ops().end());
  if (input_pass_) fallback.insert(input_pass_->fallback_ops().begin(), input_pass_->fallback_ops().end());
  result_.fallback_ops.assign(fallback.begin(), fallback.end());

  // Shapes of the boundary values at this rank's samples, and where their samples lie (the stage file's dims).
  const ImportedModel& fm = forward_->model();
  const ImportedModel stage_import = import_model_bytes(proto.SerializeAsString(), setup_.plan_dir, stage_file.string(), import);
  const std::string symbol = stage_import.batch_dim;
  const int64_t samples = import.batch;
  auto add_boundary = [&](const onnx::ValueInfoProto& info) {
    const auto id = fm.graph.find_value(info.name());
    if (!id) return;
    const Value& value = fm.graph.value(*id);
    BoundaryValue b;
    b.name = info.name();
    b.dtype = value.dtype;
    b.shape = value.shape;
    b.batch_axis = batch_axis_of(info, symbol);
    if (b.batch_axis >= 0) {
      const int64_t dim = b.shape[static_cast<size_t>(b.batch_axis)];
      if (dim % samples != 0)
        throw InvalidModel(stage_file.string() + ": boundary value " + quote(b.name) + " has " + std::to_string(dim) +
                           " rows along its batch axis for " + std::to_string(samples) + " samples");
      b.rows_per_sample = dim / samples;
    }
    boundary_[b.name] = b;
  };
  for (const auto& info : proto.graph().input()) add_boundary(info);
  for (const auto& info : proto.graph().output()) add_boundary(info);

  // Params, their accumulated gradients, and the buckets in the backward's production order.
  for (const auto& [param, grad] : graphs_.gradients) {
    Tensor* p = param_tensor(param);
    APART_CHECK(p != nullptr, "stage executors have no param " + param);
    if (p->dtype() != DType::kFloat32)
      throw Unsupported("param " + quote(param) + " is " + std::string(dtype_name(p->dtype())) + "; apart run updates float32 params only");
    grad_index_[grad] = params_.size();
    param_index_[param] = params_.size();
    param_names_.push_back(param);
    params_.push_back(p);
    param_elements_.push_back(p->elements());
    param_shapes_.push_back(p->shape());
    std::vector<Tensor*>& slots = param_slots_.emplace_back();
    for (Executor* e : {forward_.get(), backward_.get(), input_pass_.get()})
      if (Tensor* slot = e ? e->param(param) : nullptr) slots.push_back(slot);
    grads_.push_back(backend_.empty(DType::kFloat32, p->shape()));
    result_.params += p->elements();
  }
  result_.param_tensors = static_cast<int64_t>(params_.size());
  const TaskGraph& bg = backward_->model().graph;
  std::vector<std::pair<uint32_t, size_t>> produced;  // (producer position, param)
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto id = bg.find_value(graphs_.gradients[i].second);
    if (!id && input_pass_ && input_pass_->model().graph.find_value(graphs_.gradients[i].second)) {
      produced.emplace_back(0, i);  // ZB-H1: a param gradient its B pass computes, before any of W's
      continue;
    }
    APART_CHECK(id.has_value(), "backward has no gradient " + graphs_.gradients[i].second);
    const TaskId producer = bg.value(*id).producer;
    produced.emplace_back(producer.valid() ? producer.value() : 0, i);
  }
  std::stable_sort(produced.begin(), produced.end());
  production_order_ = std::move(produced);

  DataOptions data = options_.data;
  data.seed = options_.seed;
  data_ = make_data_source(data, classify_inputs(model_->graph));
  result_.data_description = data_->describe();
}

// This rank's shard of the stage (codegen/tensor_parallel_shard.h), in place of the whole stage, made after the
// weights are final (read or randomized, widened), so that every TP rank cuts the same whole params. The TP group is
// split here, before the executors that run the shard's collectives over it.
void StageRunner::build_tensor_parallel_shard(onnx::ModelProto& proto) {
  // This stage's record (in an interleaved plan this chunk's: its stage's devices and sequence parallelism).
  const PlanStageRecord& full = setup_.full_plan.stages[static_cast<size_t>(stage_.id)];
  const int color = full.devices[static_cast<size_t>(setup_.role.replica * tp())];
  tp_group_ = world_.split(color, setup_.role.tp_rank);
  if (options_.device_world) device_tp_group_ = options_.device_world->split(color, setup_.role.tp_rank);
  const std::vector<TpShardRegion> regions = tp_shard_regions(setup_.full_plan);
  // The shard cuts initializers held inline: external data is read in first.
  for (auto& init : *proto.mutable_graph()->mutable_initializer()) {
    if (init.data_location() != onnx::TensorProto::EXTERNAL) continue;
    const Tensor t = tensor_from_proto(init, setup_.plan_dir);
    init.clear_external_data();
    init.clear_data_location();
    init.set_raw_data(std::string(reinterpret_cast<const char*>(t.raw()), static_cast<size_t>(t.bytes())));
  }
  TpShard shard = shard_stage_for_tensor_parallel(proto, regions, tp(), setup_.role.tp_rank, TpWeights::kCut,
                                                  full.sequence_parallel ? TpSequence::kSharded : TpSequence::kWhole);
  for (const TpShardedParam& p : shard.params) tp_sharded_[p.name] = p;
  result_.tp_whole_regions = shard.replicated;
  if (is_virtual_stage_view(plan_))  // a rank holds several chunks: say which one computes each region whole
    for (std::string& region : result_.tp_whole_regions) region = "chunk " + std::to_string(stage_.id) + ": " + region;
  proto = std::move(shard.model);
}

std::map<std::string, Tensor> StageRunner::gather_tp_params() {
  std::map<std::string, Tensor> whole;
  for (size_t i = 0; i < param_names_.size(); ++i) {  // the same order on every TP rank: the stage's gradients'
    const auto it = tp_sharded_.find(param_names_[i]);
    if (it == tp_sharded_.end()) continue;
    const TpShardedParam& p = it->second;
    const Tensor mine = backend_.to_host(*params_[i]);
    Tensor t(DType::kFloat32, p.shape);  // zeros: each rank writes its ranges, the sum is the whole param
    const float* from = mine.data<float>();
    float* to = t.data<float>();
    for_each_tp_run(p, tp(), setup_.role.tp_rank, [&](int64_t whole_at, int64_t part_at, int64_t count) {
      std::memcpy(to + whole_at, from + part_at, static_cast<size_t>(count) * sizeof(float));
    });
    tp_group_->allreduce_sum(t.span<float>())->wait();
    whole[p.name] = std::move(t);
  }
  return whole;
}

void StageRunner::build_buckets_and_optimizer() {
  zero_ = replicas_ ? stage_.zero : 0;
  std::vector<bool> tied(params_.size(), false);
  for (const Tie& tie : ties_)
    for (size_t i : tie.params) tied[i] = true;
  // Buckets in the backward's production order; under ZeRO sharded and whole ones fill side by side.
  bucket_of_.assign(params_.size(), 0);
  bucket_at_.assign(params_.size(), 0);
  std::optional<size_t> open[2];  // the bucket being filled: whole, sharded
  std::vector<double> filled;
  for (const auto& [position, i] : production_order_) {
    const bool sharded = zero_ > 0 && !tied[i];
    std::optional<size_t>& current = open[sharded ? 1 : 0];
    if (!current || filled[*current] >= kAllreduceBucketBytes || (sharded && zero_ >= 2)) {  // ZeRO-2/3: one param each
      current = buckets_.size();
      buckets_.emplace_back().sharded = sharded;
      filled.push_back(0);
    }
    bucket_at_[i] = static_cast<int64_t>(filled[*current] / 4);
    buckets_[*current].params.push_back(i);
    bucket_of_[i] = *current;
    filled[*current] += static_cast<double>(param_elements_[i]) * 4;  // float32
  }
  for (Bucket& b : buckets_) {
    if (device_replicas_) b.device = &backend_;  // reduced over NCCL where the gradients are
    if (zero_ < 2 || !b.sharded) b.hold(flat_length(b));
  }  // ZeRO-2/3 hold their sharded buckets only while they reduce
  // The accumulators of the buckets held through the step live in them (no second copy of the gradients) where
  // the backend's memory is the host's, which the collectives run on.
  grads_in_buckets_ = backend_.host_memory() || device_replicas_;
  if (grads_in_buckets_)
    for (Bucket& b : buckets_)
      for (size_t p : b.flat.defined() ? b.params : std::vector<size_t>{})
        grads_[p] = b.flat.flat_range(bucket_at_[p], bucket_at_[p] + param_elements_[p]).view(param_shapes_[p]);

  if (zero_ == 0) {
    step_names_ = param_names_;
    step_params_ = params_;
    for (Tensor& g : grads_) step_grads_.push_back(&g);
    step_counts_in_norm_ = counts_in_norm_;
  } else {
    std::vector<std::vector<size_t>> bucket_params;
    for (const Bucket& b : buckets_) bucket_params.push_back(b.sharded ? b.params : std::vector<size_t>{});
    pieces_ = owned_pieces(bucket_params, param_elements_, replicas_->size(), replicas_->rank());
    pieces_of_bucket_.assign(buckets_.size(), {});
    for (size_t k = 0; k < pieces_.size(); ++k) pieces_of_bucket_[pieces_[k].bucket].push_back(k);
    for (const ShardPiece& piece : pieces_) {
      const Tensor& p = *params_[piece.param];
      if (zero_ >= 3) {  // storage of its own: the whole param is emptied below
        Tensor& own = piece_params_.emplace_back(backend_.empty(DType::kFloat32, {piece.end - piece.begin}));
        backend_.copy(p.flat_range(piece.begin, piece.end), own);
      } else {
        piece_params_.push_back(p.flat_range(piece.begin, piece.end));  // a view: the step updates the param
      }
      // ZeRO-2/3 keep no whole gradient of a sharded param: its pieces accumulate their own.
      piece_grads_.push_back(zero_ >= 2 ? backend_.empty(DType::kFloat32, {piece.end - piece.begin})
                                        : grads_[piece.param].flat_range(piece.begin, piece.end));
      const bool whole = piece.begin == 0 && piece.end == p.elements();
      step_names_.push_back(whole ? param_names_[piece.param]
                                  : param_names_[piece.param] + "[" + std::to_string(piece.begin) + ":" +
                                        std::to_string(piece.end) + "]");
      step_counts_in_norm_.push_back(tp_counts(piece.param));  // only this stage holds it, and only this replica owns the piece
    }
    for (size_t k = 0; k < pieces_.size(); ++k) {
      step_params_.push_back(&piece_params_[k]);
      step_grads_.push_back(&piece_grads_[k]);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!tied[i]) continue;
      step_names_.push_back(param_names_[i]);
      step_params_.push_back(params_[i]);
      step_grads_.push_back(&grads_[i]);
      step_counts_in_norm_.push_back(counts_in_norm_[i]);
    }
    if (zero_ >= 2)
      for (size_t i = 0; i < params_.size(); ++i)
        if (!tied[i]) grads_[i] = Tensor();
  }
  if (zero_ >= 3) {  // from here this replica holds only its pieces of the sharded params, between tasks
    for (Executor* pass : {forward_.get(), backward_.get(), input_pass_.get()})
      if (pass) pass->set_param_source([this](const std::string& name) { return gathered_param(name); });
    release_params();
  }
  OptimizerOptions optimizer = options_.optimizer;
  if (options_.optimizer_from_plan) optimizer.kind = plan_.training.optimizer;
  optimizer_ = std::make_unique<ParamOptimizer>(optimizer, step_names_, backend_);
}

// Collective over the world, in the same order on every rank: the stage's replicas, then one communicator per
// set of stages that hold a common param (the tied embedding of a GPT is in its first and its last stage).
void StageRunner::build_communicators() {
  const int s = stage_.id;
  replicas_ = world_.split(s * setup_.tp + setup_.role.tp_rank, setup_.role.replica);  // one group per TP rank
  if (replicas_ && replicas_->size() == 1) replicas_.reset();
  if (options_.device_world) {  // the same split over NCCL, collective in the same order on every rank
    device_replicas_ = options_.device_world->split(s * setup_.tp + setup_.role.tp_rank, setup_.role.replica);
    if (!replicas_) device_replicas_.reset();
    if (plan_.training.schedule != Schedule::kInterleaved)
      device_messages_ = std::make_unique<DeviceMessages>(*options_.device_world, backend_);
  }

  // Which stages read each param, from the plan's task lists on the whole model.
  std::map<std::string, std::set<int>> holders;
  for (const PlanStageRecord& stage : plan_.stages)
    for (const std::string& task : stage.tasks) {
      const auto t = model_->graph.find_task(task);
      if (!t) throw InvalidModel(setup_.plan_dir.string() + ": stage " + std::to_string(stage.id) + " names task " +
                                 quote(task) + ", which the model does not have (another model?)");
      for (ValueId in : model_->graph.task(*t).inputs)
        if (in.valid() && model_->graph.value(in).kind == ValueKind::kParam) holders[model_->graph.value(in).name].insert(stage.id);
    }
  for (const auto& [param, stages] : holders) owner_stage_[param] = *stages.begin();
  std::map<std::set<int>, std::vector<std::string>> tied;
  for (const auto& [param, stages] : holders)
    if (stages.size() > 1) tied[stages].push_back(param);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < param_names_.size(); ++i) index[param_names_[i]] = i;
  // The ties' communicators are split once per rank when every stage it runs is built (RankRunner::split_ties).
  shared_.tie_sets.clear();
  for (const auto& [stages, names] : tied) {
    shared_.tie_sets.push_back(stages);
    if (stages.count(s) == 0) continue;
    Tie tie;
    tie.stages = stages;
    for (const std::string& n : names)
      if (auto it = index.find(n); it != index.end()) tie.params.push_back(it->second);
    ties_.push_back(std::move(tie));
  }
  counts_in_norm_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = owner_stage_.find(param_names_[i]);
    counts_in_norm_[i] = setup_.role.replica == 0 && (it == owner_stage_.end() || it->second == s) && tp_counts(i);
  }
}

void StageRunner::forward(int64_t k, const std::map<std::string, Tensor>& batch, int64_t step) {
  Frame& frame = frames_[static_cast<size_t>(k)];
  const SampleRange mine = my_samples();
  const int64_t first = k * setup_.microbatch_samples;
  std::map<std::string, Tensor> inputs = frame.inputs;
  for (const PlanInput& in : stage_.inputs) {
    if (in.from_stage >= 0) continue;
    auto it = batch.find(in.value);
    if (it == batch.end()) continue;  // an input with an initializer as its default
    inputs[in.value] = batch_rows(it->second, first + mine.begin, first + mine.end);
  }
  NamedTensors outputs = forward_->run(inputs, RandomKey{options_.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(k)});
  std::map<std::string, Tensor> by_name;
  for (auto& [name, t] : outputs) by_name[name] = std::move(t);
  if (!graphs_.loss_output.empty()) losses_.push_back(backend_.to_host(by_name.at(graphs_.loss_output)).scalar_as_double());
  for (const PlanOutput& out : stage_.outputs)
    if (!out.to_stages.empty()) frame.outputs[out.value] = by_name.at(out.value);
  for (const std::string& name : graphs_.stash) {
    auto it = by_name.find(name);
    frame.stash[name] = it != by_name.end() ? it->second : inputs.at(name);  // recompute keeps the inputs
  }
  for (const auto& [init, out] : graphs_.state_updates) {  // BatchNorm running statistics, micro-batch by micro-batch
    Tensor* target = forward_->param(init);
    const Tensor& value = by_name.at(out);
    if (target && target->bytes() == value.bytes()) backend_.copy(value, *target);
  }
  frame.inputs.clear();
}

Tensor* StageRunner::param_tensor(const std::string& name) const {
  if (Tensor* t = forward_->param(name)) return t;
  if (Tensor* t = backward_->param(name)) return t;
  return input_pass_ ? input_pass_->param(name) : nullptr;
}

bool StageRunner::accumulate_gradient(const std::string& name, const Tensor& value, bool first, bool last, double weight) {
  auto it = grad_index_.find(name);
  if (it == grad_index_.end()) return false;
  const size_t i = it->second;
  Bucket& b = buckets_[bucket_of_[i]];
  if (zero_ >= 2 && b.sharded) {  // ZeRO-2/3: each micro-batch's gradient goes straight into its bucket
    if (b.ready == 0) b.hold(flat_length(b));
    Tensor into = b.flat.flat_range(bucket_at_[i], bucket_at_[i] + value.elements());
    backend_.copy(value, into);
    if (weight != 1) (b.device ? backend_ : cpu_backend()).scale(into, weight);  // where the bucket is
    if (++b.ready < b.params.size()) return true;
    b.ready = 0;
    b.reduction = replicas_of(b).reduce_scatter_sum(b.span());
    reducing_.push_back(bucket_of_[i]);
    constexpr size_t kReductionsInFlight = 2;  // their buffers are what ZeRO-2/3 hold beyond the shards
    while (reducing_.size() > kReductionsInFlight) {
      Bucket& oldest = buckets_[reducing_.front()];
      reducing_.pop_front();
      if (oldest.reduction) collect_shard(oldest);
    }
    for (Bucket& other : buckets_)
      if (other.reduction) other.reduction->test();  // progress for MPI's non-blocking collectives
    return true;
  }
  if (first) backend_.copy(value, grads_[i]);  // accumulated on the backend, micro-batch by micro-batch
  else backend_.add_into(grads_[i], value);
  if (last && weight != 1) backend_.scale(grads_[i], static_cast<float>(weight));  // every micro-batch's alike
  if (!last || !replicas_) return true;
  if (++b.ready < b.params.size()) return true;
  for (size_t p : grads_in_buckets_ ? std::vector<size_t>{} : b.params)  // the collectives run on host buffers (MPI)
    backend_.copy_to_host(grads_[p].raw(), reinterpret_cast<std::byte*>(b.values() + bucket_at_[p]), grads_[p].bytes());
  b.reduction = b.sharded ? replicas_of(b).reduce_scatter_sum(b.span())  // ZeRO-1
                          : replicas_of(b).allreduce_sum(b.span());
  for (Bucket& other : buckets_)
    if (other.reduction) other.reduction->test();  // progress for MPI's non-blocking collectives
  return true;
}

void StageRunner::after_param_gradients() {
  if (zero_ >= 2) collect_shards();  // this micro-batch's reduce-scatters, so that no whole gradient outlives its backward
}

void StageRunner::collect_shards() {
  for (Bucket& b : buckets_)
    if (b.sharded && b.reduction) collect_shard(b);
  reducing_.clear();
}

void StageRunner::backward(int64_t k, int64_t step) {
  Frame& frame = frames_[static_cast<size_t>(k)];
  std::map<std::string, Tensor> inputs = std::move(frame.stash);
  for (const auto& [output, grad_input] : graphs_.output_gradient_inputs) {
    auto it = frame.output_grads.find(grad_input);
    APART_CHECK(it != frame.output_grads.end(), "no gradient arrived for " + output);
    inputs[grad_input] = std::move(it->second);
  }
  frame.output_grads.clear();
  if (!graphs_.loss_seed_input.empty()) {  // the loss scale over m·r: the seed of the loss's gradient (a scalar)
    const TaskGraph& fg = forward_->model().graph;
    const double microbatches_and_replicas = static_cast<double>(setup_.microbatches) * stage_.replicas;
    inputs[graphs_.loss_seed_input] =
        scaler_.seed(fg.value(*fg.find_value(graphs_.loss_output)).shape, 1.0 / microbatches_and_replicas);
  }
  const bool last = ++backwards_done_ == setup_.microbatches;
  const bool first = backwards_done_ == 1;
  const double weight = loss_weight();
  auto on_output = [&](const std::string& name, const Tensor& value) { return accumulate_gradient(name, value, first, last, weight); };
  const RandomKey key{options_.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(k)};
  NamedTensors outputs;
  if (!zero_bubble_) {
    outputs = backward_->run(std::move(inputs), key, on_output);  // the stash freed as the backward consumes it
  } else {  // B now; W later reads the backward inputs it needs and what B carries
    if (input_pass_) {
      std::map<std::string, Tensor> reads;  // B takes the backward inputs it reads, no others
      for (const auto& in : graphs_.input_pass.graph().input())
        if (auto it = inputs.find(in.name()); it != inputs.end()) reads[in.name()] = it->second;
      outputs = input_pass_->run(reads, key, on_output);
    }
    for (const auto& in : graphs_.weight_pass.graph().input()) {
      if (auto it = inputs.find(in.name()); it != inputs.end()) frame.carried[in.name()] = it->second;
    }
    for (const std::string& c : graphs_.carried)
      for (auto& [name, t] : outputs)
        if (name == c) frame.carried[c] = t;
  }
  for (const auto& [input, grad] : graphs_.input_gradients)
    for (auto& [name, t] : outputs)
      if (name == grad) {
        if (weight != 1) backend_.scale(t, static_cast<float>(weight));
        frame.input_grads[input] = std::move(t);
      }
  if (!zero_bubble_) after_param_gradients();
}

void StageRunner::backward_weight(int64_t k, int64_t step) {
  Frame& frame = frames_[static_cast<size_t>(k)];
  std::map<std::string, Tensor> inputs = std::move(frame.carried);
  frame.carried.clear();
  const bool last = ++weight_passes_done_ == setup_.microbatches;
  const bool first = weight_passes_done_ == 1;
  const double weight = loss_weight();
  auto on_output = [&](const std::string& name, const Tensor& value) { return accumulate_gradient(name, value, first, last, weight); };
  backward_->run(inputs, RandomKey{options_.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(k)}, on_output);
  after_param_gradients();
}

StageRunner::MessagePart StageRunner::message_part(const Action& a, size_t bytes) const {
  const int peer = (a.kind == ActionKind::kSend) != a.gradient ? a.to_stage : a.from_stage;
  const int degree = tp();
  if (degree == 1 || setup_.full_plan.stages[static_cast<size_t>(peer)].tp != degree) return {1, 0, bytes, bytes};
  // Whole float32 shards, so that the receivers' all-gather moves them.
  const size_t t = static_cast<size_t>(degree), part = (bytes + 4 * t - 1) / (4 * t) * 4;
  return {degree, part * static_cast<size_t>(setup_.role.tp_rank), part, part * t};
}

size_t StageRunner::send(const Action& a) {
  if (device_messages_) return send_on_device(a);
  Frame& frame = frames_[static_cast<size_t>(a.microbatch)];
  const SampleRange mine = my_samples();
  std::vector<std::byte> message;
  for (const std::string& name : edge_values(a.from_stage, a.to_stage, a.gradient)) {
    const BoundaryValue& v = boundary(name);
    if (!a.gradient) {
      pack(v, backend_.to_host(frame.outputs.at(name)), mine.begin, a.samples, message);  // MPI sends host bytes
      continue;
    }
    auto it = frame.input_grads.find(name);
    if (it != frame.input_grads.end()) {
      pack(v, backend_.to_host(it->second), mine.begin, a.samples, message);
    } else {  // the stage's params and outputs do not depend on this input: its gradient is zero
      message.resize(message.size() + static_cast<size_t>(v.slice_bytes(a.samples)), std::byte{0});
    }
  }
  const MessagePart part = message_part(a, message.size());
  message.resize(part.padded, std::byte{0});
  auto& [buffer, request] = sends_.emplace_back(std::move(message), nullptr);
  request = world_.send(std::span<const std::byte>(buffer).subspan(part.offset, part.bytes), a.peer, action_tag(a, plan_));
  return part.bytes;
}

size_t StageRunner::recv(const Action& a) {
  if (device_messages_) return recv_on_device(a);
  Frame& frame = frames_[static_cast<size_t>(a.microbatch)];
  const SampleRange mine = my_samples();
  const std::vector<std::string> names = edge_values(a.from_stage, a.to_stage, a.gradient);
  size_t bytes = 0;
  for (const std::string& name : names) bytes += static_cast<size_t>(boundary(name).slice_bytes(a.samples));
  const MessagePart part = message_part(a, bytes);
  std::vector<std::byte> message(part.padded);
  world_.recv(std::span<std::byte>(message).subspan(part.offset, part.bytes), a.peer, action_tag(a, plan_))->wait();
  if (part.parts > 1)  // every TP rank received its part: the whole message on each
    tp_group_->allgather(std::span<float>(reinterpret_cast<float*>(message.data()), message.size() / sizeof(float)))->wait();
  size_t at = 0;
  for (const std::string& name : names) {
    const BoundaryValue& v = boundary(name);
    if (!a.gradient) {
      Tensor& t = frame.inputs[name];
      if (!t.defined()) t = Tensor(v.dtype, v.shape);
      at += unpack(v, message.data() + at, t, mine.begin, a.samples, false);
      continue;
    }
    // The gradient of an output read by several stages (or replicas) is the sum of what each sends back.
    std::string grad_input;
    for (const auto& [output, input] : graphs_.output_gradient_inputs)
      if (output == name) grad_input = input;
    if (grad_input.empty()) {
      at += static_cast<size_t>(v.slice_bytes(a.samples));
      continue;
    }
    Tensor& t = frame.output_grads[grad_input];
    if (!t.defined()) t = Tensor(v.dtype, v.shape);
    at += unpack(v, message.data() + at, t, mine.begin, a.samples, true);
  }
  return part.bytes;
}

size_t StageRunner::send_on_device(const Action& a) {
  Frame& frame = frames_[static_cast<size_t>(a.microbatch)];
  const SampleRange mine = my_samples();
  const std::vector<std::string> names = edge_values(a.from_stage, a.to_stage, a.gradient);
  int64_t bytes = 0;
  for (const std::string& name : names) bytes += boundary(name).slice_bytes(a.samples);
  const MessagePart part = message_part(a, static_cast<size_t>(bytes));
  // Zeros: a gradient no param or output depends on stays zero, and so does the padding of TP parts.
  Tensor message = device_messages_->buffer(static_cast<int64_t>(part.padded));
  int64_t at = 0;
  for (const std::string& name : names) {
    const BoundaryValue& v = boundary(name);
    const auto grad = frame.input_grads.find(name);
    const Tensor* t = !a.gradient ? &frame.outputs.at(name) : grad != frame.input_grads.end() ? &grad->second : nullptr;
    if (!t) {
      at += v.slice_bytes(a.samples);
      continue;
    }
    const Tensor on_backend = t->on_host() ? backend_.to_device(*t) : *t;  // a host-memory backend: itself
    at = device_messages_->pack(on_backend, slice_runs(v, mine.begin, a.samples), message, at);
  }
  device_messages_->send(part.parts == 1 ? std::move(message) : float_range(message, part.offset, part.bytes), a.peer,
                         action_tag(a, plan_));
  return part.bytes;
}

size_t StageRunner::recv_on_device(const Action& a) {
  Frame& frame = frames_[static_cast<size_t>(a.microbatch)];
  const SampleRange mine = my_samples();
  const std::vector<std::string> names = edge_values(a.from_stage, a.to_stage, a.gradient);
  int64_t bytes = 0;
  for (const std::string& name : names) bytes += boundary(name).slice_bytes(a.samples);
  const MessagePart part = message_part(a, static_cast<size_t>(bytes));
  Tensor message = device_messages_->buffer(static_cast<int64_t>(part.padded));
  if (part.parts == 1) {
    device_messages_->recv(message, a.peer, action_tag(a, plan_));
  } else {  // every TP rank receives its part: the whole message on each (message_part)
    Tensor mine = float_range(message, part.offset, part.bytes);
    device_messages_->recv(mine, a.peer, action_tag(a, plan_));
    device_tp_group_->allgather(message.span<float>())->wait();
  }
  int64_t at = 0;
  for (const std::string& name : names) {
    const BoundaryValue& v = boundary(name);
    std::string grad_input;  // a gradient: the sum of what each reader sends back (recv above says so)
    for (const auto& [output, input] : graphs_.output_gradient_inputs)
      if (output == name) grad_input = input;
    if (a.gradient && grad_input.empty()) {
      at += v.slice_bytes(a.samples);
      continue;
    }
    Tensor& t = a.gradient ? frame.output_grads[grad_input] : frame.inputs[name];
    if (!t.defined()) t = backend_.empty(v.dtype, v.shape);
    at = device_messages_->unpack(message, at, slice_runs(v, mine.begin, a.samples), t, a.gradient);
  }
  return part.bytes;
}

void StageRunner::finish_allreduce() {
  if (zero_ >= 2) collect_shards();
  for (Bucket& b : buckets_) {
    if (!b.reduction) continue;
    b.reduction->wait();
    b.reduction.reset();
    if (b.sharded) continue;  // ZeRO-1: the pieces are copied into grads_ below
    for (size_t p : grads_in_buckets_ ? std::vector<size_t>{} : b.params)  // views of the bucket: reduced in place
      backend_.copy_to_device(reinterpret_cast<const std::byte*>(b.values() + bucket_at_[p]), grads_[p].raw(),
                              grads_[p].bytes());
  }
  if (zero_ != 1) return;
  // ZeRO-1: this replica's reduced shards into the gradients it steps, views of grads_ (the same bytes when those
  // are views of the bucket).
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const float* from = buckets_[pieces_[k].bucket].values() + pieces_[k].at;
    if (reinterpret_cast<const std::byte*>(from) != piece_grads_[k].raw())
      backend_.copy_to_device(reinterpret_cast<const std::byte*>(from), piece_grads_[k].raw(), piece_grads_[k].bytes());
  }
}

void StageRunner::collect_shard(Bucket& b) {
  b.reduction->wait();
  b.reduction.reset();
  // This replica's shard of the micro-batch's sum, added into the pieces it steps (the first micro-batch's copied).
  for (size_t k : pieces_of_bucket_[static_cast<size_t>(&b - buckets_.data())]) {
    const Tensor reduced = b.flat.flat_range(pieces_[k].at, pieces_[k].at + piece_grads_[k].elements());
    const Tensor shard = backend_.host_memory() || b.device ? reduced : backend_.to_device(reduced);
    if (b.collected == 0) backend_.copy(shard, piece_grads_[k]);
    else backend_.add_into(piece_grads_[k], shard);
  }
  ++b.collected;
  b.flat = Tensor();  // ZeRO-2/3 hold no whole gradient between micro-batches
}

void StageRunner::allgather_params() {
  constexpr size_t kInFlight = 2;  // buckets gathering at once: their flat buffers are the transient memory
  struct Gathering {
    size_t bucket = 0;
    Tensor flat;  // the bucket's whole flat buffer, every replica's shards
    Pending done;
  };
  std::vector<Gathering> gathering;
  gathering.reserve(kInFlight);
  auto finish = [&](Gathering& g) {
    g.done->wait();
    for (size_t p : buckets_[g.bucket].params) {
      const Tensor gathered = g.flat.flat_range(bucket_at_[p], bucket_at_[p] + param_elements_[p]).view(param_shapes_[p]);
      if (zero_ >= 3) {  // bound until release_params(); over the buffer itself where it is the backend's, no copy
        const Tensor whole = buckets_[g.bucket].device ? gathered : backend_.to_device(gathered);
        for (Tensor* slot : param_slots_[p]) *slot = whole;
      } else {
        backend_.copy(gathered, *params_[p]);
      }
    }
  };
  for (size_t index = 0; index < buckets_.size(); ++index) {
    Bucket& b = buckets_[index];
    if (!b.sharded) continue;
    if (gathering.size() == kInFlight) {
      finish(gathering.front());
      gathering.erase(gathering.begin());
    }
    Gathering& g = gathering.emplace_back();
    g.bucket = index;
    // ZeRO-1 keeps its buckets' buffers (idle after the step; their gradients, if they are views of them, are
    // overwritten by the next step's first): the gather reuses them. ZeRO-2/3 hold none between reductions.
    g.flat = zero_ == 1 ? b.flat : b.fresh(flat_length(b));  // zero padding
    g.done = start_allgather(index, g.flat);
  }
  for (Gathering& g : gathering) finish(g);
}

Pending StageRunner::start_allgather(size_t bucket, Tensor& flat) {
  for (size_t k : pieces_of_bucket_[bucket]) {
    Tensor into = flat.flat_range(pieces_[k].at, pieces_[k].at + piece_params_[k].elements());
    backend_.copy(piece_params_[k], into);
  }
  return replicas_of(buckets_[bucket]).allgather(flat.span<float>());
}

Tensor StageRunner::gathered_param(const std::string& name) {
  const size_t p = param_index_.at(name);
  const size_t b = bucket_of_[p];
  Tensor flat = buckets_[b].fresh(flat_length(buckets_[b]));  // zero padding
  start_allgather(b, flat)->wait();
  // Where the buffer is the backend's, a view of it (no copy), alive while the task that asked reads it.
  const Tensor gathered = flat.flat_range(bucket_at_[p], bucket_at_[p] + param_elements_[p]).view(param_shapes_[p]);
  return buckets_[b].device ? gathered : backend_.to_device(gathered);
}

void StageRunner::release_params() {
  if (zero_ < 3) return;
  for (size_t i = 0; i < params_.size(); ++i)
    if (sharded_between_uses(i))
      for (Tensor* slot : param_slots_[i]) *slot = Tensor();
}

void StageRunner::unscale_gradients() {
  if (device_messages_) device_messages_->finish();  // the deferred sends, then every send
  for (auto& [buffer, request] : sends_) request->wait();
  sends_.clear();
  finish_allreduce();  // a stage without kAllReduce has none in flight; harmless
  // The model's loss is a mean over its batch; each loss-stage replica's micro-batch loss is the mean over its
  // share, so the whole batch's gradient is the sum over micro-batches and replicas over (m × its replicas).
  const double loss_replicas = plan_.stages[static_cast<size_t>(setup_.loss_stage)].replicas;
  // Under loss scaling the loss stage seeded its backward with S/(m × r) instead (LossScaler::seed): what is left is
  // to unscale by S (an inf stays inf, found below).
  const float scale = static_cast<float>(scaler_.enabled() ? 1.0 / scaler_.scale()
                                                           : 1.0 / (static_cast<double>(setup_.microbatches) * loss_replicas));
  for (Tensor* g : step_grads_) backend_.scale(*g, scale);
}

std::vector<Tensor*> StageRunner::tied_gradients(const std::set<int>& stages) {
  std::vector<Tensor*> grads;
  for (Tie& tie : ties_)
    if (tie.stages == stages)
      for (size_t i : tie.params) grads.push_back(&grads_[i]);
  return grads;
}

void StageRunner::add_tied_gradients(const std::set<int>& stages, std::vector<Tensor>& whole, bool on_device) {
  Backend& buffers = on_device ? backend_ : cpu_backend();  // where `whole` lives and is summed
  for (const Tie& tie : ties_) {
    if (tie.stages != stages) continue;
    whole.resize(tie.params.size());
    for (size_t k = 0; k < tie.params.size(); ++k) {
      const size_t i = tie.params[k];
      const auto id = model_->graph.find_value(param_names_[i]);
      APART_CHECK(id.has_value(), "tied param " + param_names_[i] + " is not in the model");
      if (!whole[k].defined()) whole[k] = buffers.empty(DType::kFloat32, {model_->graph.value(*id).elements});
      const auto cut = tp_sharded_.find(param_names_[i]);
      if (setup_.role.replica != 0 || (cut == tp_sharded_.end() && setup_.role.tp_rank != 0)) continue;
      const Tensor part = on_device ? grads_[i] : backend_.to_host(grads_[i]);
      if (cut == tp_sharded_.end()) {
        APART_CHECK(part.elements() == whole[k].elements(), "tied param " + param_names_[i] + " is not whole");
        buffers.add_into(whole[k], part);
        continue;
      }
      for_each_tp_run(cut->second, tp(), setup_.role.tp_rank, [&](int64_t whole_at, int64_t part_at, int64_t count) {
        Tensor to = whole[k].flat_range(whole_at, whole_at + count);
        buffers.add_into(to, part.flat_range(part_at, part_at + count));
      });
    }
  }
}

void StageRunner::take_tied_gradients(const std::set<int>& stages, const std::vector<Tensor>& whole) {
  for (const Tie& tie : ties_) {
    if (tie.stages != stages) continue;
    for (size_t k = 0; k < tie.params.size(); ++k) {
      const size_t i = tie.params[k];
      const auto cut = tp_sharded_.find(param_names_[i]);
      if (cut == tp_sharded_.end()) {
        backend_.copy(whole[k], grads_[i]);
        continue;
      }
      for_each_tp_run(cut->second, tp(), setup_.role.tp_rank, [&](int64_t whole_at, int64_t part_at, int64_t count) {
        Tensor to = grads_[i].flat_range(part_at, part_at + count);
        backend_.copy(whole[k].flat_range(whole_at, whole_at + count), to);
      });
    }
  }
}

void StageRunner::add_totals(std::vector<double>& totals) {
  const double loss_replicas = plan_.stages[static_cast<size_t>(setup_.loss_stage)].replicas;
  std::vector<Tensor*> counted;
  for (size_t i = 0; i < step_grads_.size(); ++i)
    if (step_counts_in_norm_[i]) counted.push_back(step_grads_[i]);
  const double local_sq = grad_sum_of_squares(counted, backend_);
  totals[0] += local_sq;
  double local_loss = 0;
  for (double l : losses_) local_loss += l;
  if (!graphs_.loss_output.empty() && setup_.role.tp_rank == 0)  // the TP ranks of a replica compute one loss
    totals[1] += local_loss * loss_weight() / static_cast<double>(setup_.microbatches) / loss_replicas;
  const bool finite = std::isfinite(local_sq) && std::isfinite(local_loss);
  totals[2 + static_cast<size_t>(world_.rank())] += finite ? 0.0 : 1.0;
}

StepRecord StageRunner::apply_step(int64_t step, const std::vector<double>& totals, const LrSchedule& schedule) {
  StepRecord record;
  record.lr = schedule.lr_at(step, options_.optimizer.lr);
  record.step = step + 1;
  record.loss = totals[1];
  if (scaler_.enabled()) {  // one global overflow flag: every rank skips the same steps and keeps the same scale
    bool overflow = false;
    for (int r = 0; r < world_.size(); ++r) overflow = overflow || totals[2 + static_cast<size_t>(r)] != 0.0;
    record.loss_scale = scaler_.scale();
    record.skipped = !scaler_.update(overflow);
    if (record.skipped) {
      record.grad_norm = std::numeric_limits<double>::infinity();
      return record;
    }
  }
  for (int r = 0; r < world_.size() && !scaler_.enabled(); ++r)
    if (totals[2 + static_cast<size_t>(r)] != 0.0) {
      const RankRole role = rank_role(setup_.full_plan, r);
      throw Infeasible("training diverged at step " + std::to_string(step + 1) + ": the loss or a gradient of stage " +
                       std::to_string(role.stage) + " (rank " + std::to_string(r) + ", replica " + std::to_string(role.replica) +
                       ") is not finite; lower --lr or set --clip-grad-norm");
    }
  record.grad_norm = optimizer_->step(step_params_, step_grads_, record.lr, std::sqrt(totals[0]));
  if (zero_ == 1 || zero_ == 2) allgather_params();  // ZeRO-3: for each task
  return record;
}

void StageRunner::save_model(bool write) {
  // Every param and BatchNorm statistic of the model, from the replica 0 of the lowest stage holding it; under
  // ZeRO-3 every replica gathers its stage's params whole for it. In an interleaved plan rank 0 takes, with its chunk
  // j·P, the params of every chunk j·P + k (the chunk rank k sends them from at the same turn).
  if (zero_ >= 3) allgather_params();
  const int positions = setup_.positions;
  std::map<std::string, int> owner_rank;  // replica 0 (TP rank 0) of the lowest stage holding it
  for (const auto& [param, stage] : owner_stage_) {
    const bool mine = world_.rank() == 0 ? stage / positions == stage_.id / positions : stage == stage_.id;
    if (mine) owner_rank[param] = setup_.full_plan.stages[static_cast<size_t>(stage)].devices[0];
  }
  const std::map<std::string, Tensor> tp_whole = tp_group_ ? gather_tp_params() : std::map<std::string, Tensor>{};
  auto whole_param = [&](const std::string& name) -> const Tensor* {
    const auto it = tp_whole.find(name);
    return it != tp_whole.end() ? &it->second : param_tensor(name);
  };
  std::map<std::string, Tensor>& values = shared_.saved;
  std::vector<Pending> pending;
  std::vector<Tensor> sent;  // host copies of the params being sent, alive until their sends complete
  for (const auto& [param, rank] : owner_rank) {
    const auto id = model_->graph.find_value(param);
    const Value& value = model_->graph.value(*id);
    if (!is_floating(value.dtype)) continue;
    if (world_.rank() == rank && rank != 0) {
      const Tensor* t = whole_param(param);
      APART_CHECK(t != nullptr, "stage " + std::to_string(stage_.id) + " lacks param " + param);
      const Tensor& host = sent.emplace_back(backend_.to_host(*t));
      pending.push_back(world_.send(std::span<const std::byte>(host.raw(), static_cast<size_t>(host.bytes())), 0, 0));
    } else if (world_.rank() == 0) {
      if (rank == 0) {
        const Tensor* t = whole_param(param);
        if (t) values[param] = backend_.to_host(*t);
      } else {
        Tensor t(value.dtype, value.shape);
        world_.recv(std::span<std::byte>(t.raw(), static_cast<size_t>(t.bytes())), rank, 0)->wait();
        values[param] = t;
      }
    }
  }
  for (Pending& p : pending) p->wait();
  release_params();  // rank 0's values share or copy what it read
  if (world_.rank() != 0 || !write) return;
  std::map<std::string, const Tensor*> refs;
  for (const auto& [name, t] : values) refs[name] = &t;
  write_trained_model(setup_.model_path, options_.save_model, refs);
}

std::vector<std::pair<std::string, Tensor*>> StageRunner::checkpoint_tensors() {
  std::vector<std::pair<std::string, Tensor*>> tensors;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!sharded_between_uses(i)) tensors.emplace_back("param/" + param_names_[i], params_[i]);
  if (zero_ >= 3)  // this replica's pieces, named as the optimizer names them ("wte[0:4096]")
    for (size_t k = 0; k < pieces_.size(); ++k) tensors.emplace_back("param/" + step_names_[k], &piece_params_[k]);
  for (const auto& [init, out] : graphs_.state_updates)
    if (Tensor* t = forward_->param(init)) tensors.emplace_back("param/" + init, t);
  for (const auto& [name, t] : optimizer_->state()) tensors.emplace_back("optim/" + name, t);
  return tensors;
}

void StageRunner::write_checkpoint_shard(const fs::path& folder, int64_t step_done) {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& [name, t] : checkpoint_tensors()) tensors.emplace_back(name, t);
  nlohmann::json meta = {{"stage", stage_.id}, {"replica", setup_.role.replica}, {"tp_rank", setup_.role.tp_rank},
                         {"rank", world_.rank()}, {"optimizer_steps", optimizer_->steps_taken()}};
  scaler_.save(meta);
  const int chunk = is_virtual_stage_view(setup_.full_plan) ? stage_.id : -1;
  write_checkpoint_file(folder / shard_name(world_.rank(), chunk), step_done, meta, tensors, backend_);
}

void StageRunner::restore(const fs::path& folder, const std::string& where) {
  const int chunk = is_virtual_stage_view(setup_.full_plan) ? stage_.id : -1;
  Checkpoint ck = read_checkpoint(folder / shard_name(world_.rank(), chunk));  // its checksums verified
  if (!ck.warning.empty() && options_.on_warning && world_.rank() == 0) options_.on_warning(ck.warning);
  if (ck.meta.value("stage", -1) != stage_.id || ck.meta.value("replica", -1) != setup_.role.replica ||
      ck.meta.value("tp_rank", 0) != setup_.role.tp_rank)
    throw InvalidArgument(where + ": the shard of rank " + std::to_string(world_.rank()) + " holds another " +
                          (chunk >= 0 ? "chunk" : "stage") + " or replica");
  std::map<std::string, Tensor> saved;
  for (auto& [name, t] : ck.tensors) saved[name] = std::move(t);
  std::vector<std::pair<std::string, Tensor>> state;
  for (auto& [name, t] : saved)
    if (name.rfind("optim/", 0) == 0) state.emplace_back(name.substr(6), t);
  for (const auto& [name, t] : checkpoint_tensors()) {
    if (name.rfind("param/", 0) != 0) continue;
    auto it = saved.find(name);
    if (it == saved.end() || it->second.shape() != t->shape() || it->second.dtype() != t->dtype())
      throw InvalidArgument(where + ": rank " + std::to_string(world_.rank()) + "'s shard has no matching " + name);
    backend_.copy(it->second, *t);
  }
  optimizer_->restore(ck.meta.value("optimizer_steps", int64_t{0}), std::move(state));
  scaler_.load(ck.meta);
}

void StageRunner::set_up() {
  build();
  build_communicators();
  build_buckets_and_optimizer();
  result_.role = setup_.role;
  result_.world = world_.size();
  result_.reports = stage_.id == setup_.loss_stage && setup_.role.replica == 0 && setup_.role.tp_rank == 0;
}

void StageRunner::prepare_optimizer() {
  optimizer_->prepare(step_params_);  // its state before step 1's copies fill the backend's pool
  result_.zero = zero_;
  for (const auto& [name, t] : optimizer_->state()) result_.optimizer_state_bytes += t->bytes();
  for (const Tensor& g : grads_) result_.gradient_bytes += g.bytes();
  for (size_t i = 0; i < params_.size(); ++i)
    if (!sharded_between_uses(i)) result_.param_bytes += params_[i]->bytes();
  if (zero_ >= 3)
    for (const Tensor& p : piece_params_) result_.param_bytes += p.bytes();
  if (zero_ >= 2)
    for (const Tensor& g : piece_grads_) result_.gradient_bytes += g.bytes();
}

void StageRunner::begin_step() {
  frames_.assign(static_cast<size_t>(setup_.microbatches), Frame{});
  losses_.clear();
  backwards_done_ = 0;
  weight_passes_done_ = 0;
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.collected = 0;
  }
}

size_t StageRunner::act(const Action& a, const std::map<std::string, Tensor>& batch, int64_t step) {
  switch (a.kind) {
    case ActionKind::kForward: forward(a.microbatch, batch, step); break;
    case ActionKind::kBackward: backward(a.microbatch, step); break;
    case ActionKind::kBackwardWeight: backward_weight(a.microbatch, step); break;
    case ActionKind::kSend: return send(a);
    case ActionKind::kRecv: return recv(a);
    case ActionKind::kAllReduce: finish_allreduce(); break;
    case ActionKind::kStep: APART_CHECK(false, "the step is the rank's (RankRunner)");
  }
  return 0;
}

// One rank's share of the plan: its stage, or in an interleaved plan its chunks d, d + P, … (each a StageRunner),
// running the rank's actions, each on the stage it names, and one optimizer step over all of them.
// A checkpoint that some rank could not write (RankRunner::save_checkpoint): every rank throws it together.
struct CheckpointWriteFailed : SystemError {
  using SystemError::SystemError;
};

// The run's learning-rate schedule: over --lr-schedule-steps, else --steps (a resume may keep its checkpoint's).
LrSchedule schedule_of(const RunOptions& options) {
  LrSchedule schedule = options.schedule;
  if (schedule.total_steps == 0) schedule.total_steps = options.steps;
  return schedule;
}

class RankRunner {
 public:
  RankRunner(const RunOptions& options, const RunSetup& setup, Communicator& world)
      : options_(options), setup_(setup), world_(world) {
    for (const PlanStageRecord& stage : setup.plan.stages)  // the rank's stages in order: every rank splits alike
      if (std::find(stage.devices.begin(), stage.devices.end(), world.rank()) != stage.devices.end())
        stages_.push_back(std::make_unique<StageRunner>(options, setup, world, stage.id, shared_));
  }

  RunResult run(const RunStepCallback& on_step);

 private:
  // DIR/step_N: each of the rank's stages writes its shard, then (every shard on disk) rank 0 the manifest.
  void save_checkpoint(int64_t step_done);
  // --resume: the manifest checked against this run, then each of the rank's stages restored; the step it is at.
  int64_t restore();
  StageRunner& runner_of(const Action& a) {
    // Compute and all-reduce name their stage in a view; a message is for the stage at this end of it.
    const int stage = a.stage >= 0                      ? a.stage
                      : a.kind == ActionKind::kSend     ? (a.gradient ? a.to_stage : a.from_stage)
                      : a.kind == ActionKind::kRecv     ? (a.gradient ? a.from_stage : a.to_stage)
                                                        : -1;
    if (stage < 0 || stages_.size() == 1) return *stages_.front();
    for (const auto& runner : stages_)
      if (runner->stage().id == stage) return *runner;
    APART_CHECK(false, "rank " + std::to_string(world_.rank()) + " runs no stage " + std::to_string(stage));
    return *stages_.front();
  }
  // Each tie's communicator, tie by tie in one order on every rank: per TP rank (each sums its slices with its
  // counterparts'), or one over every holder summing whole-size buffers when the holding stages differ in TP degree
  // or some cut the params and others hold them whole (a last stage whose LM head stays whole: its logits a stage
  // output). Which holders cut them is known once every stage is sharded: one world all-reduce of the counts (none
  // without TP stages, where nothing is cut).
  void split_ties() {
    const std::vector<std::set<int>>& sets = shared_.tie_sets;
    std::vector<float> layouts(2 * sets.size(), 0.0f);  // per tie: [stages holding it cut, stages holding it whole]
    for (size_t k = 0; k < sets.size(); ++k)
      for (const auto& stage : stages_)
        if (const int layout = stage->tied_layout(sets[k]); layout >= 0) layouts[2 * k + (layout == 1 ? 0 : 1)] += 1;
    if (!sets.empty() && setup_.tp > 1) world_.allreduce_sum(std::span<float>(layouts))->wait();  // small counts: exact
    for (size_t k = 0; k < sets.size(); ++k) {
      const bool held = std::any_of(stages_.begin(), stages_.end(), [&](const auto& stage) { return stage->tied_layout(sets[k]) >= 0; });
      const bool whole = mixed_tp_degrees(setup_.full_plan, sets[k]) || (layouts[2 * k] > 0 && layouts[2 * k + 1] > 0);
      const int color = !held ? -1 : whole ? 0 : setup_.role.tp_rank;
      std::unique_ptr<Communicator> comm = world_.split(color, world_.rank());
      std::unique_ptr<Communicator> device_comm = options_.device_world ? options_.device_world->split(color, world_.rank()) : nullptr;
      if (!held) continue;
      shared_.ties[sets[k]] = std::move(comm);
      if (device_comm) shared_.device_ties[sets[k]] = std::move(device_comm);
      if (whole) shared_.whole_ties.insert(sets[k]);
    }
  }
  // A tied param's gradient is the sum over the stages holding it (replica 0 of each): this rank's stages' summed,
  // then all-reduced over the ranks holding it, into each of its stages; set by set in one order on every rank.
  void sum_tied_gradients() {
    Backend& backend = this->backend();
    for (const auto& [stages, host_comm] : shared_.ties) {
      // Over the device world the sums are the backend's tensors; on the host path host tensors.
      const auto device_comm = shared_.device_ties.find(stages);
      const bool on_device = device_comm != shared_.device_ties.end();
      Communicator& comm = on_device ? *device_comm->second : *host_comm;
      Backend& buffers = on_device ? backend : cpu_backend();
      if (shared_.whole_ties.count(stages)) {
        std::vector<Tensor> whole;
        for (auto& stage : stages_) stage->add_tied_gradients(stages, whole, on_device);
        for (Tensor& w : whole) comm.allreduce_sum(w.span<float>())->wait();
        for (auto& stage : stages_) stage->take_tied_gradients(stages, whole);
        continue;
      }
      std::vector<std::vector<Tensor*>> held;  // per stage of this rank holding them
      for (auto& stage : stages_)
        if (std::vector<Tensor*> grads = stage->tied_gradients(stages); !grads.empty()) held.push_back(std::move(grads));
      for (size_t i = 0; !held.empty() && i < held.front().size(); ++i) {
        Tensor contribution = buffers.empty(DType::kFloat32, held.front()[i]->shape());
        for (const auto& grads : held)
          if (setup_.role.replica == 0) buffers.add_into(contribution, on_device ? *grads[i] : backend.to_host(*grads[i]));
        comm.allreduce_sum(contribution.span<float>())->wait();
        for (const auto& grads : held) backend.copy(contribution, *grads[i]);
      }
    }
  }
  Backend& backend() const { return options_.backend ? *options_.backend : cpu_backend(); }  // the stages'
  // The step's world all-reduce of `totals`: over the device world where there is one (NCCL: a device buffer).
  void reduce_totals(std::vector<double>& totals) {
    if (!options_.device_world) {
      world_.allreduce_sum(std::span<double>(totals))->wait();
      return;
    }
    Backend& backend = this->backend();
    const int64_t bytes = static_cast<int64_t>(totals.size() * sizeof(double));
    Tensor on_device = backend.empty(DType::kFloat64, {static_cast<int64_t>(totals.size())});
    backend.copy_to_device(reinterpret_cast<const std::byte*>(totals.data()), on_device.raw(), bytes);
    options_.device_world->allreduce_sum(on_device.span<double>())->wait();
    backend.copy_to_host(on_device.raw(), reinterpret_cast<std::byte*>(totals.data()), bytes);
  }
  // This rank's figures: the stages' summed (their largest pass for the arena), the role its first stage's.
  RunResult merged() const {
    RunResult r = stages_.front()->result();
    for (size_t k = 1; k < stages_.size(); ++k) {
      const RunResult& o = stages_[k]->result();
      r.reports = r.reports || o.reports;
      r.params += o.params;
      r.param_tensors += o.param_tensors;
      r.arena_bytes = std::max(r.arena_bytes, o.arena_bytes);
      r.param_bytes += o.param_bytes;
      r.optimizer_state_bytes += o.optimizer_state_bytes;
      r.gradient_bytes += o.gradient_bytes;
      for (const std::string& op : o.fallback_ops)
        if (std::find(r.fallback_ops.begin(), r.fallback_ops.end(), op) == r.fallback_ops.end()) r.fallback_ops.push_back(op);
      r.tp_whole_regions.insert(r.tp_whole_regions.end(), o.tp_whole_regions.begin(), o.tp_whole_regions.end());
    }
    return r;
  }

  const RunOptions& options_;
  const RunSetup& setup_;
  Communicator& world_;
  LrSchedule schedule_ = schedule_of(options_);  // its span the checkpoint's when resumed (restore)
  RankShared shared_;
  std::vector<std::unique_ptr<StageRunner>> stages_;
};

void StageRunner::restore_resharded(const fs::path& folder, const Manifest& m, const std::string& where) {
  // The writing run's ranks of this stage at this TP rank: every replica's pieces. In an interleaved plan (the same
  // chunks at the same positions: check_resharding) the ranks at this chunk's position, each its file of the chunk.
  const bool chunks = is_virtual_stage_view(setup_.full_plan);
  const int position = stage_.id % setup_.positions;
  std::vector<fs::path> shards;
  for (int q = 0; q < m.world; ++q)
    if (m.ranks[static_cast<size_t>(q)].stage == position && m.ranks[static_cast<size_t>(q)].tp_rank == setup_.role.tp_rank)
      shards.push_back(folder / shard_name(q, chunks ? stage_.id : -1));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (size_t i = 0; i < params_.size(); ++i) shapes[param_names_[i]] = param_shapes_[i];
  const WholeCheckpoint whole = assemble_checkpoint_shards(shards, shapes, where);
  if (whole.optimizer_steps < 0)
    throw InvalidArgument(where + ": no shard holds " + (chunks ? "chunk " : "stage ") + std::to_string(stage_.id) +
                          " at TP rank " + std::to_string(setup_.role.tp_rank));
  for (const auto& [name, t] : checkpoint_tensors()) {
    if (name.rfind("param/", 0) != 0) continue;
    const CheckpointPiece piece = checkpoint_piece(name.substr(6));
    backend_.copy(whole.cut("param/" + piece.param, piece, t->shape(), name, where), *t);
  }
  std::vector<std::pair<std::string, Tensor>> state;  // each step name's slots, cut from the whole
  for (size_t i = 0; i < step_names_.size(); ++i) {
    const CheckpointPiece piece = checkpoint_piece(step_names_[i]);
    const std::string prefix = "optim/" + piece.param + "/";
    for (auto it = whole.tensors.lower_bound(prefix); it != whole.tensors.end() && it->first.rfind(prefix, 0) == 0; ++it)
      if (const std::string slot = it->first.substr(prefix.size()); slot.find('/') == std::string::npos)
        state.emplace_back(step_names_[i] + "/" + slot, whole.cut(it->first, piece, step_params_[i]->shape(), it->first, where));
  }
  optimizer_->restore(whole.optimizer_steps, std::move(state));
}

void RankRunner::save_checkpoint(int64_t step_done) {
  const fs::path dir(options_.checkpoint_dir);
  const std::string folder = "step_" + std::to_string(step_done);
  std::error_code ec;
  fs::create_directories(dir / folder, ec);
  if (ec) throw SystemError("cannot create " + (dir / folder).string() + ": " + ec.message());
  // A shard that cannot be written (a full disk, a quota, a file-size limit) fails the save on every rank alike: the
  // flag rides one world all-reduce, so no rank waits at the barrier for it and none is killed mid-write.
  std::string failed;
  try {
    for (auto& stage : stages_) stage->write_checkpoint_shard(dir / folder, step_done);
  } catch (const SystemError& e) {
    failed = e.what();
  }
  double failures = failed.empty() ? 0.0 : 1.0;
  world_.allreduce_sum(std::span<double>(&failures, 1))->wait();  // also: every shard is on disk before the manifest
  std::optional<Manifest> previous;
  if (world_.rank() == 0 && fs::exists(dir / kManifestFile, ec)) previous = read_manifest(dir);
  if (failures > 0) {
    // The step's folder goes unless a manifest names it (a re-save of the latest): the previous stays the latest.
    const bool named = previous && (previous->folder == folder ||
                                     std::find(previous->kept.begin(), previous->kept.end(), folder) != previous->kept.end());
    world_.barrier();
    if (world_.rank() == 0 && !named) fs::remove_all(dir / folder, ec);
    // The ranks whose shard was written report the failure as a consequence (CommError), so the in-process run
    // reports the rank that names the folder and the bytes.
    if (failed.empty())
      throw CommError("the checkpoint of step " + std::to_string(step_done) + " into " + (dir / folder).string() +
                      " failed on another rank (it names the folder and the bytes); the previous checkpoint is still "
                      "the latest");
    throw CheckpointWriteFailed(failed);
  }
  if (world_.rank() == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < world_.size(); ++r) {
      const RankRole role = rank_role(setup_.full_plan, r);
      ranks.push_back({role.stage, role.replica, role.tp_rank});
    }
    int shards = 0;  // one per rank, or per rank and chunk
    for (const PlanStageRecord& stage : setup_.full_plan.stages) shards += static_cast<int>(stage.devices.size());
    // --keep-last N: the N - 1 newest earlier complete folders stay, the rest (only folders a manifest named) go.
    std::vector<std::string> kept = previous ? previous->kept : std::vector<std::string>{};
    if (previous && previous->folder != folder && previous->folder != ".") kept.push_back(previous->folder);
    std::erase(kept, folder);
    std::vector<std::string> dropped;
    while (!kept.empty() && static_cast<int64_t>(kept.size()) >= options_.keep_last) {
      dropped.push_back(kept.front());
      kept.erase(kept.begin());
    }
    nlohmann::ordered_json manifest = {
        {"format", kManifestFormat}, {"step", step_done}, {"world", world_.size()}, {"folder", folder},
        {"plan_sha256", setup_.plan_sha256}, {"model_sha256", setup_.model_sha256},
        {"optimizer", stages_.front()->optimizer()}, {"seed", options_.seed},
        {"data", options_.data.spec}, {"shards", shards}, {"layout", checkpoint_layout(setup_)}, {"ranks", ranks},
        {"lr_schedule_steps", schedule_.total_steps}, {"kept", kept}};
    // A copy inside the step's folder makes it resumable on its own (--resume DIR/step_N), once the latest moved on.
    nlohmann::ordered_json own = manifest;
    own["folder"] = ".";
    own["kept"] = nlohmann::json::array();
    write_file_atomically(dir / folder / kManifestFile, sealed_manifest_text(own));
    write_file_atomically(dir / kManifestFile, sealed_manifest_text(manifest));
    if (options_.on_note)
      options_.on_note("checkpoint of step " + std::to_string(step_done) + " written: " + (dir / folder).string() + " (" +
                       std::to_string(shards) + " shard" + (shards == 1 ? "" : "s") + "; resume with --resume " + dir.string() + ")");
    // The steps it replaced were ours (a manifest named them): removed now that they are no longer kept.
    for (const std::string& old : dropped) {
      fs::remove_all(dir / old, ec);
      if (options_.on_note) options_.on_note("checkpoint " + (dir / old).string() + " deleted (--keep-last " + std::to_string(options_.keep_last) + ")");
    }
  }
  world_.barrier();
}

int64_t RankRunner::restore() {
  const fs::path dir(options_.resume);
  const Manifest m = read_manifest(dir);
  const std::string where = "--resume " + dir.string();
  const bool same_plan = m.world == world_.size() && m.plan_sha256 == setup_.plan_sha256;
  if (!same_plan) check_resharding(m, setup_, world_.size(), where);
  if (m.model_sha256 != setup_.model_sha256)
    throw InvalidArgument(where + " was written for another model (sha256 differs)");
  if (const std::string optimizer = stages_.front()->optimizer(); m.optimizer != optimizer)
    throw InvalidArgument(where + " was written with --optimizer " + m.optimizer + "; resume with the same optimizer");
  if (m.seed != options_.seed || m.data != options_.data.spec)
    throw InvalidArgument(where + " was written with --seed " + std::to_string(m.seed) + " --data " + m.data +
                          "; resume with the same seed and data, so that the batches continue where they stopped");
  if (m.step > options_.steps)
    throw InvalidArgument(where + " is at step " + std::to_string(m.step) + ", past --steps " + std::to_string(options_.steps));
  schedule_.total_steps = resumed_lr_schedule_steps(options_.schedule, options_.steps,
                                                    m.lr_schedule_steps > 0 ? m.lr_schedule_steps : options_.steps,
                                                    world_.rank() == 0 ? options_.on_note : nullptr);
  for (auto& stage : stages_) {
    if (same_plan) stage->restore(dir / m.folder, where);
    else stage->restore_resharded(dir / m.folder, m, where);
  }
  return m.step;
}

RunResult RankRunner::run(const RunStepCallback& on_step) {
  const auto setup_start = Clock::now();
  for (auto& stage : stages_) stage->set_up();
  split_ties();
  // The whole plan's (setup_.plan is this TP rank's view): a send to a stage of another TP degree goes to each of
  // its TP ranks that takes the value from this one (schedule/ tp_send_targets).
  const std::vector<Action> actions = rank_actions(setup_.full_plan, world_.rank());
  StageRunner& first_stage = *stages_.front();
  int64_t first = 0;
  if (!options_.resume.empty()) first = restore();
  for (auto& stage : stages_) stage->prepare_optimizer();
  RunResult result = merged();
  result.first_step = first;
  result.setup_seconds = seconds_since(setup_start);

  // --trace: times from a common origin, taken when every rank has left a barrier.
  std::vector<TimelineEvent> trace;
  if (!options_.trace.empty()) world_.barrier();
  reset_tensor_memory_peak();  // from here: the steps' peak over what setup left (params, state, gradients)
  const auto run_start = Clock::now();
  for (int64_t step = first; step < options_.steps; ++step) {
    const bool traced = !options_.trace.empty() && (options_.trace_all_steps || step + 1 == options_.steps);
    const auto step_start = Clock::now();
    bool stop = false;  // set by the step's world all-reduce
    const std::map<std::string, Tensor> batch = first_stage.batch(step);
    for (auto& stage : stages_) stage->begin_step();
    StepRecord record;
    for (const Action& a : actions) {
      const double start_s = traced ? seconds_since(run_start) : 0;
      size_t bytes = 0;
      if (a.kind == ActionKind::kStep) {
        // One world all-reduce for all the rank's stages: the clip norm, the loss and the flags are global.
        for (auto& stage : stages_) stage->unscale_gradients();
        sum_tied_gradients();
        // [norm², loss, a not-finite flag per rank, stop requests]: a stop request (runtime/preemption.h) rides the
        // same reduction, so every rank stops after the same step, whenever each saw the signal.
        std::vector<double> totals(3 + static_cast<size_t>(world_.size()), 0.0);
        for (auto& stage : stages_) stage->add_totals(totals);
        totals.back() = stop_requested() != 0 ? 1.0 : 0.0;
        reduce_totals(totals);
        stop = totals.back() > 0;
        for (auto& stage : stages_) record = stage->apply_step(step, totals, schedule_);
      } else {
        bytes = runner_of(a).act(a, batch, step);
      }
      if (traced)
        trace.push_back(action_event(a, setup_.role, world_.rank(), step, start_s, seconds_since(run_start),
                                     static_cast<double>(bytes), stages_.size() > 1 ? setup_.positions : 0));
    }
    record.seconds = seconds_since(step_start);
    record.samples_per_s = static_cast<double>(setup_.global_batch) / std::max(record.seconds, 1e-9);
    record.tokens_per_s = record.samples_per_s * static_cast<double>(tokens_per_sample(batch));
    result.steps.push_back(record);
    if (on_step) on_step(result, record);
    const bool periodic = options_.save_every > 0 && record.step % options_.save_every == 0 && record.step < options_.steps;
    stop = stop && record.step < options_.steps;
    if (!options_.checkpoint_dir.empty() && (periodic || stop)) save_checkpoint(record.step);
    if (stop) {
      const int signal = stop_requested();
      result.stopped_by_signal = signal != 0 ? signal : -1;
      break;
    }
  }
  if (!options_.checkpoint_dir.empty() && !result.stopped_by_signal) save_checkpoint(options_.steps);
  result.seconds = seconds_since(run_start);
  result.peak_tensor_bytes = tensor_memory().peak;
  result.planned_memory_bytes = first_stage.stage().memory_bytes.value_or(0);
  result.samples_per_s = static_cast<double>(setup_.global_batch * static_cast<int64_t>(result.steps.size())) /
                         std::max(result.seconds, 1e-9);
  if (!options_.save_model.empty() && !result.stopped_by_signal)
    for (size_t k = 0; k < stages_.size(); ++k) stages_[k]->save_model(k + 1 == stages_.size());
  if (!options_.trace.empty()) gather_and_write_trace(world_, setup_.full_plan, options_.plan, trace, options_.trace);
  world_.barrier();
  return result;
}

// Ends the run on every rank: the device world first (NCCL: its communicator aborted, so that no rank waits in NCCL
// for this one until --comm-timeout; it aborts its bootstrap, the world, too), then the world.
void abort_world(const RunOptions& options, Communicator& world, const std::string& reason, int exit_code) {
  if (options.device_world) options.device_world->abort(reason, exit_code);
  world.abort(reason, exit_code);
}
}  // namespace

RunResult run_plan(const RunOptions& options, Communicator& world, const RunStepCallback& on_step) {
  options.validate();
  // Checks that need no messages: every rank reads the same files and fails the same way, with its own exit code.
  RunSetup setup = check_plan(options, world.rank(), world.size());
  {
    ImportOptions whole = planned_import(setup.plan);  // with the loss the plan appended, if any
    if (options.added_loss.enabled() && (options.added_loss.form != whole.loss.form ||
                                         options.added_loss.labels != whole.loss.labels))
      throw InvalidArgument("--loss " + std::string(added_loss_form_name(options.added_loss.form)) + " --labels " +
                            options.added_loss.labels + ": the plan " + options.plan + " was made " +
                            (whole.loss.enabled() ? "with --loss " + std::string(added_loss_form_name(whole.loss.form)) +
                                                        " --labels " + whole.loss.labels
                                                  : std::string("without a loss to append")) +
                            ", and its stage files hold what it was made with: partition the model again with the "
                            "--loss you mean, or leave --loss out");
    whole.batch = setup.global_batch;
    whole.batch_explicit = true;
    setup.model = std::make_shared<const ImportedModel>(import_model(setup.model_path.string(), whole));
    setup.loss = model_loss(setup.model->graph, options.loss, setup.model_path.string());
    for (const PlanStageRecord& stage : setup.plan.stages)
      for (const PlanOutput& out : stage.outputs)
        if (out.value == setup.loss) setup.loss_stage = stage.id;
    if (setup.loss_stage < 0)
      throw InvalidModel(options.plan + ": no stage outputs the loss " + quote(setup.loss) + " (a plan for another model?)");
  }
  if (!options.save_model.empty()) {
    std::vector<InputFile> inputs{{"the model", setup.model_path}, {"the plan", plan_json_path(options.plan)}};
    for (const PlanStageRecord& stage : setup.plan.stages)  // the plan's stage files are inputs too
      inputs.push_back({"stage " + std::to_string(stage.id) + "'s file", setup.plan_dir / stage_file_name(setup.plan, stage.id)});
    check_output_file(options.save_model, inputs, "--save-model");
    check_output_not_input(options.save_model + ".data", inputs, "--save-model (its external data)");
  }
  if (!options.checkpoint_dir.empty()) {
    check_output_directory_writable(options.checkpoint_dir, "--checkpoint-dir");
    const fs::path manifest = fs::path(options.checkpoint_dir) / kManifestFile;
    std::error_code ec;
    if (fs::exists(fs::symlink_status(manifest, ec))) read_manifest(options.checkpoint_dir);  // ours, or refused
  }
  if (!options.trace.empty())
    check_output_file(options.trace, {{"the model", setup.model_path}, {"the plan", plan_json_path(options.plan)}}, "--trace");
  RankRunner runner(options, setup, world);
  try {
    return runner.run(on_step);
  } catch (const CommError&) {
    throw;  // another rank failed (and aborted), or this one's peer vanished
  } catch (const Infeasible&) {
    throw;  // found by the world all-reduce: every rank throws it
  } catch (const CheckpointWriteFailed&) {
    throw;  // the same: every rank throws it
  } catch (const Error& e) {
    abort_world(options, world, rank_label(world.rank(), world.size(), setup.role) + ": " + e.what(), exit_code(e.kind()));
    throw;
  } catch (const std::bad_alloc&) {
    abort_world(options, world, rank_label(world.rank(), world.size(), setup.role) + ": out of memory",
                exit_code(ErrorKind::kSystemError));
    throw;
  } catch (const std::exception& e) {
    abort_world(options, world, rank_label(world.rank(), world.size(), setup.role) + ": " + e.what(),
                exit_code(ErrorKind::kInternal));
    throw;
  }
}

}  // namespace apart
