// One rank of `apart run`: the plan's stage (or an interleaved plan's chunks), its schedule's actions and the step.
// What each part owns lives beside it: run_setup.h (the plan checks), stage_messenger.h (boundary messages),
// gradient_reducer.h (buckets, all-reduce, ZeRO), tied_params.h (params several stages hold), run_checkpoint.h
// (manifest, shards, resharding); a StageRunner keeps the executors, frames and actions.
#include "train/pipeline.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "codegen/stage_graphs.h"
#include "codegen/tensor_parallel_shard.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/model_proto.h"
#include "plan/plan.h"
#include "train/checkpoint.h"
#include "runtime/executor.h"
#include "train/gradient_reducer.h"
#include "runtime/half_precision.h"
#include "train/preemption.h"
#include "train/run_checkpoint.h"
#include "train/run_setup.h"
#include "train/run_trace.h"
#include "train/stage_messenger.h"
#include "train/tied_params.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

// Rows [begin, end) along axis 0 of a batch-first data tensor.
Tensor batch_rows(const Tensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = t.shape();
  const int64_t row = t.bytes() / shape[0];
  shape[0] = end - begin;
  Tensor out(t.dtype(), shape);
  std::memcpy(out.raw(), t.raw() + begin * row, static_cast<size_t>((end - begin) * row));
  return out;
}

// One stage of the plan on this rank: its programs, frames and actions, with the parts that own its messages
// (StageMessenger), its gradients (GradientReducer) and its tied params (StageTies), and its optimizer. A rank runs
// one, or in an interleaved plan one per chunk it holds (RankRunner), each chunk a stage of the plan's virtual-stage
// view.
class StageRunner {
 public:
  // `saved`: the params --save-model gathers on world rank 0, shared by the rank's stages.
  StageRunner(const RunOptions& options, const RunSetup& setup, Communicator& world, int stage,
              std::map<std::string, Tensor>& saved)
      : options_(options),
        setup_(setup),
        world_(world),
        plan_(setup.plan),
        stage_(setup.plan.stages[static_cast<size_t>(stage)]),
        model_(setup.model.get()),
        saved_(saved),
        backend_(options.backend ? *options.backend : cpu_backend()) {}

  void set_up();  // programs, communicators (collective over the world: every rank's chunks in the same order), reducer
  void begin_step();
  // Runs a forward, backward, send, receive or all-reduce of this stage; the bytes a message carried.
  size_t act(const Action& a, const std::map<std::string, Tensor>& batch, int64_t step);
  // The step, around the rank's sum of tied gradients (RankTies over ties()) and the world all-reduce of every
  // stage's `totals` [Σ‖g‖², loss, then a not-finite flag per rank]: wait for the sends and the reductions and
  // unscale; add this stage's share of `totals`; step the optimizer.
  void unscale_gradients();
  void add_totals(std::vector<double>& totals);
  StepRecord apply_step(int64_t step, const std::vector<double>& totals, const LrSchedule& schedule);
  StageTies& ties() { return *ties_; }
  // --save-model: the params world rank 0 writes, gathered into `saved` (every stage of every rank calls it, chunk
  // by chunk); `write` (rank 0's last stage) writes the model.
  void save_model(bool write);
  // This stage's part of a checkpoint (RunCheckpoint): its params, optimizer state and loss scale.
  StageShard shard();
  std::string optimizer() const { return std::string(optimizer_name(optimizer_->options().kind)); }
  void prepare_optimizer();  // its state before step 1's copies fill the backend's pool; this stage's figures
  std::map<std::string, Tensor> batch(int64_t step) const { return data_->batch(step); }
  const RunResult& result() const { return result_; }
  const PlanStageRecord& stage() const { return stage_; }

 private:
  void build();
  void build_executors(const onnx::ModelProto& proto, const ImportOptions& import);
  void collect_params();  // the executors' params, and the order the backward produces their gradients
  void build_communicators();
  void build_reducer_and_optimizer();  // after the communicators: ZeRO shards only params no other stage holds
  void forward(int64_t k, const std::map<std::string, Tensor>& batch, int64_t step);
  void backward(int64_t k, int64_t step);         // the whole backward; under ZB-H1 its B pass
  void backward_weight(int64_t k, int64_t step);  // ZB-H1's W pass
  // What a backward pass calls for each output: hands a param gradient to the reducer (micro-batch `first`/`last`
  // of the pass that produces it, weighted by `weight`). Returns whether `name` is a param gradient (then the
  // executor frees it: it is added in).
  bool accumulate_gradient(const std::string& name, const Tensor& value, bool first, bool last, double weight);
  Tensor* param_tensor(const std::string& name) const;
  SampleRange my_samples() const {
    return replica_samples(setup_.microbatch_samples, stage_.replicas, setup_.role.replica);
  }
  // What this rank's backward is weighted by: its loss is the mean over its slice of n_j samples, and the batch's
  // mean weighs every sample alike, so a loss-stage replica scales its gradients by n_j · r / n (1 with equal
  // slices; the step then divides the sum over micro-batches and replicas by m · r). Scaling everything its backward
  // produces (param and input gradients) is scaling its loss seed: the backward is linear in it.
  double loss_weight() const {
    if (graphs_.loss_output.empty()) return 1;
    const SampleRange mine = my_samples();
    return static_cast<double>(mine.end - mine.begin) * stage_.replicas /
           static_cast<double>(setup_.microbatch_samples);
  }
  // Whether this rank adds param i to the global norm and the tied sums: one holder of a replicated param (TP rank 0),
  // every TP rank for its slice of a sharded one.
  int tp() const { return std::max(1, setup_.full_plan.stages[static_cast<size_t>(stage_.id)].tp); }  // this stage's
  bool tp_counts(size_t param) const { return setup_.role.tp_rank == 0 || tp_sharded_.count(params_.names[param]) > 0; }
  void build_tensor_parallel_shard(onnx::ModelProto& proto);
  // --save-model: every sharded param of this stage whole, gathered over the TP group (every TP rank calls it).
  std::map<std::string, Tensor> gather_tp_params();

  const RunOptions& options_;
  const RunSetup& setup_;
  Communicator& world_;
  const PlanDocument& plan_;
  const PlanStageRecord& stage_;
  const ImportedModel* model_;  // setup_.model: the whole model at the global batch (data roles, param owners)
  std::map<std::string, Tensor>& saved_;
  StageGraphs graphs_;
  // backward_ computes the param gradients: the whole backward, or under ZB-H1 its W pass, with input_pass_ its
  // B pass (nullptr when the stage has no input gradients: W is then the whole backward).
  std::unique_ptr<Executor> forward_, backward_, input_pass_;
  bool zero_bubble_ = false;
  StageParams params_;
  std::map<std::string, size_t> grad_index_;  // gradient output name → param index
  std::vector<size_t> production_order_;      // the params in the order the backward produces their gradients
  // This stage's replicas (nullptr with one), and over options_.device_world (NCCL) the same for the bucket
  // collectives on device buffers: split in build_communicators, then the reducer's.
  std::unique_ptr<Communicator> replicas_, device_replicas_;
  // This replica's TP group (nullptr without TP): the shards' collectives run over it; device_tp_group_ is the same
  // group over options_.device_world (NCCL), which runs them on device tensors (null on the host path).
  std::unique_ptr<Communicator> tp_group_;
  std::unique_ptr<Communicator> device_tp_group_;
  // The params this rank holds a slice of (codegen/tensor_parallel_shard.h), by name.
  std::map<std::string, TpShardedParam> tp_sharded_;
  std::unique_ptr<StageMessenger> messenger_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<StageTies> ties_;
  std::vector<bool> counts_in_norm_;        // by param: this rank adds it to the global norm (one holder, replica 0)
  std::map<std::string, int> owner_stage_;  // param → the lowest stage holding it
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<ParamOptimizer> optimizer_;
  LossScaler scaler_{options_.loss_scale};  // 1 unless --precision fp16: the loss stage's seed, every rank's unscaling
  Backend& backend_;  // options_.backend or the CPU backend: the executors', the gradients' and the optimizer's
  std::vector<Frame> frames_;
  std::vector<double> losses_;
  int64_t backwards_done_ = 0;
  int64_t weight_passes_done_ = 0;
  RunResult result_;
};

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

  build_executors(proto, import);

  // Messages over the device world where there is one (not in interleaved plans), else the host's.
  MessageRoute route{&world_, false, tp_group_.get()};
  if (options_.device_world && plan_.training.schedule != Schedule::kInterleaved)
    route = {options_.device_world, true, device_tp_group_.get()};
  messenger_ =
      std::make_unique<StageMessenger>(setup_, stage_, my_samples(), backend_, route, graphs_.output_gradient_inputs);
  // Shapes of the boundary values at this rank's samples, and where their samples lie (the stage file's dims).
  const ImportedModel stage_import =
      import_model_bytes(proto.SerializeAsString(), setup_.plan_dir, stage_file.string(), import);
  messenger_->add_boundaries(proto, forward_->model().graph, stage_import.batch_dim, stage_file);
  collect_params();

  DataOptions data = options_.data;
  data.seed = options_.seed;
  data_ = make_data_source(data, classify_inputs(model_->graph));
  result_.data_description = data_->describe();
}

void StageRunner::build_executors(const onnx::ModelProto& proto, const ImportOptions& import) {
  ExecutorOptions exec;
  exec.backend = &backend_;
  exec.outputs_on_backend = true;  // stash and gradients stay on the backend; boundary values go to the host to be sent
  exec.tensor_parallel = tp_group_.get();
  exec.tensor_parallel_on_backend = device_tp_group_.get();  // NCCL: the shards' collectives on device tensors
  exec.arena = false;  // each pass holds what it needs while it runs, nothing between runs (docs/runtime.md, "ZeRO")
  exec.precompute_max_bytes = 64 << 10;  // shape arithmetic and small masks; no param-sized constant held for good
  forward_ = std::make_unique<Executor>(graphs_.forward, setup_.plan_dir, exec, import);
  backward_ =
      std::make_unique<Executor>(zero_bubble_ ? graphs_.weight_pass : graphs_.backward, setup_.plan_dir, exec, import);
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
}

// Params in the executors' shared storage, and the order in which the backward produces their gradients.
void StageRunner::collect_params() {
  for (const auto& [param, grad] : graphs_.gradients) {
    Tensor* p = param_tensor(param);
    APART_CHECK(p != nullptr, "stage executors have no param " + param);
    if (p->dtype() != DType::kFloat32)
      throw Unsupported("param " + quote(param) + " is " + std::string(dtype_name(p->dtype())) +
                        "; apart run updates float32 params only");
    grad_index_[grad] = params_.size();
    params_.index[param] = params_.size();
    params_.names.push_back(param);
    params_.tensors.push_back(p);
    params_.elements.push_back(p->elements());
    params_.shapes.push_back(p->shape());
    std::vector<Tensor*>& slots = params_.slots.emplace_back();
    for (Executor* e : {forward_.get(), backward_.get(), input_pass_.get()})
      if (Tensor* slot = e ? e->param(param) : nullptr) slots.push_back(slot);
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
  for (const auto& [position, i] : produced) production_order_.push_back(i);
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
  for (size_t i = 0; i < params_.size(); ++i) {  // the same order on every TP rank: the stage's gradients'
    const auto it = tp_sharded_.find(params_.names[i]);
    if (it == tp_sharded_.end()) continue;
    const TpShardedParam& p = it->second;
    const Tensor mine = backend_.to_host(*params_.tensors[i]);
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

// Collective over the world, in the same order on every rank: the stage's replicas (per TP rank), and over the
// device world the same. The tied params' communicators are split once per rank when every stage it runs is built
// (RankTies::split).
void StageRunner::build_communicators() {
  const int s = stage_.id;
  replicas_ = world_.split(s * setup_.tp + setup_.role.tp_rank, setup_.role.replica);  // one group per TP rank
  if (replicas_ && replicas_->size() == 1) replicas_.reset();
  if (options_.device_world) {  // the same split over NCCL, collective in the same order on every rank
    device_replicas_ = options_.device_world->split(s * setup_.tp + setup_.role.tp_rank, setup_.role.replica);
    if (!replicas_) device_replicas_.reset();
  }
  const std::map<std::string, std::set<int>> holders = param_holders(plan_, model_->graph, setup_.plan_dir);
  for (const auto& [param, stages] : holders) owner_stage_[param] = *stages.begin();
  ties_ = std::make_unique<StageTies>(holders, s, params_, tp_sharded_, model_->graph, setup_.role, tp(), backend_);
  counts_in_norm_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = owner_stage_.find(params_.names[i]);
    counts_in_norm_[i] = setup_.role.replica == 0 && (it == owner_stage_.end() || it->second == s) && tp_counts(i);
  }
}

void StageRunner::build_reducer_and_optimizer() {
  ReducerOptions reducer;
  reducer.zero = stage_.zero;
  reducer.production_order = production_order_;
  reducer.tied = ties_->tied();
  reducer.counts_in_norm = counts_in_norm_;
  for (size_t i = 0; i < params_.size(); ++i) reducer.pieces_count_in_norm.push_back(tp_counts(i));
  reducer_ =
      std::make_unique<GradientReducer>(params_, backend_, std::move(replicas_), std::move(device_replicas_), reducer);
  ties_->bind(*reducer_);
  if (reducer_->zero() >= 3)  // the sharded params whole for each task that reads them
    for (Executor* pass : {forward_.get(), backward_.get(), input_pass_.get()})
      if (pass) pass->set_param_source([this](const std::string& name) { return reducer_->gathered_param(name); });
  OptimizerOptions optimizer = options_.optimizer;
  if (options_.optimizer_from_plan) optimizer.kind = plan_.training.optimizer;
  optimizer_ = std::make_unique<ParamOptimizer>(optimizer, reducer_->step_names(), backend_);
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
  NamedTensors outputs =
      forward_->run(inputs, RandomKey{options_.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(k)});
  std::map<std::string, Tensor> by_name;
  for (auto& [name, t] : outputs) by_name[name] = std::move(t);
  if (!graphs_.loss_output.empty())
    losses_.push_back(backend_.to_host(by_name.at(graphs_.loss_output)).scalar_as_double());
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

bool StageRunner::accumulate_gradient(const std::string& name, const Tensor& value, bool first, bool last,
                                      double weight) {
  auto it = grad_index_.find(name);
  if (it == grad_index_.end()) return false;
  reducer_->accumulate(it->second, value, first, last, weight);
  return true;
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
  auto on_output = [&](const std::string& name, const Tensor& value) {
    return accumulate_gradient(name, value, first, last, weight);
  };
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
  if (!zero_bubble_) reducer_->after_pass();
}

void StageRunner::backward_weight(int64_t k, int64_t step) {
  Frame& frame = frames_[static_cast<size_t>(k)];
  std::map<std::string, Tensor> inputs = std::move(frame.carried);
  frame.carried.clear();
  const bool last = ++weight_passes_done_ == setup_.microbatches;
  const bool first = weight_passes_done_ == 1;
  const double weight = loss_weight();
  auto on_output = [&](const std::string& name, const Tensor& value) {
    return accumulate_gradient(name, value, first, last, weight);
  };
  backward_->run(inputs, RandomKey{options_.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(k)}, on_output);
  reducer_->after_pass();
}

void StageRunner::unscale_gradients() {
  messenger_->finish();  // the deferred sends, then every send
  reducer_->finish();    // a stage without kAllReduce has none in flight; harmless
  // The model's loss is a mean over its batch; each loss-stage replica's micro-batch loss is the mean over its
  // share, so the whole batch's gradient is the sum over micro-batches and replicas over (m × its replicas).
  const double loss_replicas = plan_.stages[static_cast<size_t>(setup_.loss_stage)].replicas;
  // Under loss scaling the loss stage seeded its backward with S/(m × r) instead (LossScaler::seed): what is left is
  // to unscale by S (an inf stays inf, found below).
  const float scale = static_cast<float>(
      scaler_.enabled() ? 1.0 / scaler_.scale() : 1.0 / (static_cast<double>(setup_.microbatches) * loss_replicas));
  for (Tensor* g : reducer_->step_grads()) backend_.scale(*g, scale);
}

void StageRunner::add_totals(std::vector<double>& totals) {
  const double loss_replicas = plan_.stages[static_cast<size_t>(setup_.loss_stage)].replicas;
  std::vector<Tensor*> counted;
  for (size_t i = 0; i < reducer_->step_grads().size(); ++i)
    if (reducer_->step_counts_in_norm()[i]) counted.push_back(reducer_->step_grads()[i]);
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
                       std::to_string(role.stage) + " (rank " + std::to_string(r) + ", replica " +
                       std::to_string(role.replica) + ") is not finite; lower --lr or set --clip-grad-norm");
    }
  record.grad_norm = optimizer_->step(reducer_->step_params(), reducer_->step_grads(), record.lr, std::sqrt(totals[0]));
  reducer_->after_step();
  return record;
}

void StageRunner::save_model(bool write) {
  // Every param and BatchNorm statistic of the model, from the replica 0 of the lowest stage holding it; under
  // ZeRO-3 every replica gathers its stage's params whole for it. In an interleaved plan rank 0 takes, with its chunk
  // j·P, the params of every chunk j·P + k (the chunk rank k sends them from at the same turn).
  reducer_->gather_for_save();
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
  std::map<std::string, Tensor>& values = saved_;
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
  reducer_->release_params();  // rank 0's values share or copy what it read
  if (world_.rank() != 0 || !write) return;
  std::map<std::string, const Tensor*> refs;
  for (const auto& [name, t] : values) refs[name] = &t;
  write_trained_model(setup_.model_path, options_.save_model, refs);
}

StageShard StageRunner::shard() {
  StageShard shard;
  shard.stage = stage_.id;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!reducer_->sharded_between_uses(i)) shard.tensors.emplace_back("param/" + params_.names[i], params_.tensors[i]);
    shard.param_shapes[params_.names[i]] = params_.shapes[i];
  }
  // ZeRO-3: this replica's pieces, named as the optimizer names them ("wte[0:4096]")
  std::vector<Tensor>& pieces = reducer_->piece_params();
  if (reducer_->zero() >= 3)
    for (size_t k = 0; k < pieces.size(); ++k)
      shard.tensors.emplace_back("param/" + reducer_->step_names()[k], &pieces[k]);
  for (const auto& [init, out] : graphs_.state_updates)
    if (Tensor* t = forward_->param(init)) shard.tensors.emplace_back("param/" + init, t);
  for (const auto& [name, t] : optimizer_->state()) shard.tensors.emplace_back("optim/" + name, t);
  shard.step_names = reducer_->step_names();
  shard.step_params.assign(reducer_->step_params().begin(), reducer_->step_params().end());
  shard.optimizer = optimizer_.get();
  shard.scaler = &scaler_;
  shard.backend = &backend_;
  return shard;
}

void StageRunner::set_up() {
  build();
  build_communicators();
  build_reducer_and_optimizer();
  result_.role = setup_.role;
  result_.world = world_.size();
  result_.reports = stage_.id == setup_.loss_stage && setup_.role.replica == 0 && setup_.role.tp_rank == 0;
}

void StageRunner::prepare_optimizer() {
  optimizer_->prepare(reducer_->step_params());  // its state before step 1's copies fill the backend's pool
  result_.zero = reducer_->zero();
  for (const auto& [name, t] : optimizer_->state()) result_.optimizer_state_bytes += t->bytes();
  result_.gradient_bytes += reducer_->gradient_bytes();
  result_.param_bytes += reducer_->param_bytes();
}

void StageRunner::begin_step() {
  frames_.assign(static_cast<size_t>(setup_.microbatches), Frame{});
  losses_.clear();
  backwards_done_ = 0;
  weight_passes_done_ = 0;
  reducer_->begin_step();
}

size_t StageRunner::act(const Action& a, const std::map<std::string, Tensor>& batch, int64_t step) {
  switch (a.kind) {
    case ActionKind::kForward:
      forward(a.microbatch, batch, step);
      break;
    case ActionKind::kBackward:
      backward(a.microbatch, step);
      break;
    case ActionKind::kBackwardWeight:
      backward_weight(a.microbatch, step);
      break;
    case ActionKind::kSend: {
      const Frame& frame = frames_[static_cast<size_t>(a.microbatch)];
      return messenger_->send(a, a.gradient ? frame.input_grads : frame.outputs);
    }
    case ActionKind::kRecv: {
      Frame& frame = frames_[static_cast<size_t>(a.microbatch)];
      return messenger_->recv(a, a.gradient ? frame.output_grads : frame.inputs);
    }
    case ActionKind::kAllReduce:
      reducer_->finish();
      break;
    case ActionKind::kStep:
      APART_CHECK(false, "the step is the rank's (RankRunner)");
  }
  return 0;
}

// The run's learning-rate schedule: over --lr-schedule-steps, else --steps (a resume may keep its checkpoint's).
LrSchedule schedule_of(const RunOptions& options) {
  LrSchedule schedule = options.schedule;
  if (schedule.total_steps == 0) schedule.total_steps = options.steps;
  return schedule;
}

// One rank's share of the plan: its stage, or in an interleaved plan its chunks d, d + P, … (each a StageRunner),
// running the rank's actions, each on the stage it names, and one optimizer step over all of them.
class RankRunner {
 public:
  RankRunner(const RunOptions& options, const RunSetup& setup, Communicator& world)
      : options_(options), setup_(setup), world_(world) {
    for (const PlanStageRecord& stage : setup.plan.stages)  // the rank's stages in order: every rank splits alike
      if (std::find(stage.devices.begin(), stage.devices.end(), world.rank()) != stage.devices.end())
        stages_.push_back(std::make_unique<StageRunner>(options, setup, world, stage.id, saved_));
  }

  RunResult run(const RunStepCallback& on_step);

 private:
  // DIR/step_N: each of the rank's stages' shard, then (every shard on disk) rank 0 the manifest.
  void save_checkpoint(int64_t step_done) {
    checkpoint_.save(step_done, shards(), stages_.front()->optimizer(), schedule_.total_steps);
  }
  // --resume: the manifest checked against this run, then each of the rank's stages restored; the step it is at.
  int64_t restore() {
    std::vector<StageShard> stage_shards = shards();
    return checkpoint_.restore(stage_shards, stages_.front()->optimizer(), schedule_.total_steps);
  }
  std::vector<StageShard> shards() {
    std::vector<StageShard> all;
    for (auto& stage : stages_) all.push_back(stage->shard());
    return all;
  }
  std::vector<StageTies*> stage_ties() {
    std::vector<StageTies*> ties;
    for (auto& stage : stages_) ties.push_back(&stage->ties());
    return ties;
  }
  StageRunner& runner_of(const Action& a) {
    // Compute and all-reduce name their stage in a view; a message is for the stage at this end of it.
    const int stage = a.stage >= 0                  ? a.stage
                      : a.kind == ActionKind::kSend ? (a.gradient ? a.to_stage : a.from_stage)
                      : a.kind == ActionKind::kRecv ? (a.gradient ? a.from_stage : a.to_stage)
                                                    : -1;
    if (stage < 0 || stages_.size() == 1) return *stages_.front();
    for (const auto& runner : stages_)
      if (runner->stage().id == stage) return *runner;
    APART_CHECK(false, "rank " + std::to_string(world_.rank()) + " runs no stage " + std::to_string(stage));
    return *stages_.front();
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
        if (std::find(r.fallback_ops.begin(), r.fallback_ops.end(), op) == r.fallback_ops.end())
          r.fallback_ops.push_back(op);
      r.tp_whole_regions.insert(r.tp_whole_regions.end(), o.tp_whole_regions.begin(), o.tp_whole_regions.end());
    }
    return r;
  }

  const RunOptions& options_;
  const RunSetup& setup_;
  Communicator& world_;
  LrSchedule schedule_ = schedule_of(options_);  // its span the checkpoint's when resumed (restore)
  std::map<std::string, Tensor> saved_;          // --save-model: the params world rank 0 writes
  RankTies ties_;
  RunCheckpoint checkpoint_{options_, setup_, world_};
  std::vector<std::unique_ptr<StageRunner>> stages_;
};

RunResult RankRunner::run(const RunStepCallback& on_step) {
  const auto setup_start = Clock::now();
  for (auto& stage : stages_) stage->set_up();
  ties_.split(stage_ties(), setup_, world_, options_.device_world);
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
        ties_.sum(stage_ties(), backend(), setup_.role.replica);
        // [norm², loss, a not-finite flag per rank, stop requests]: a stop request (train/preemption.h) rides the
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
    const bool periodic =
        options_.save_every > 0 && record.step % options_.save_every == 0 && record.step < options_.steps;
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
  const RunSetup setup = set_up_run(options, world.rank(), world.size());
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
    abort_world(options, world, rank_label(world.rank(), world.size(), setup.role) + ": " + e.what(),
                exit_code(e.kind()));
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
