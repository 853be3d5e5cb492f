// apart export's four formats: Megatron-LM flags, a torchtitan TOML config, a torch.distributed.pipelining
// fragment, a DeepSpeed config and pipeline partition. Every name is the engine's own (engine_capabilities' release);
// tests/export/export_test.cpp keeps the lists they are checked against.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "export/export.h"
#include "graph/error.h"
#include "plan/plan_summary.h"

namespace apart {
namespace {

using ordered = nlohmann::ordered_json;

// The plan's figures every engine needs (inexpressible_fields has already checked they are uniform).
struct Layout {
  int pp = 1, vpp = 1, tp = 1, dp = 1, zero = 0;
  int64_t microbatch_size = 1, microbatches = 1, global_batch = 1;
  RecomputeScope recompute = RecomputeScope::kNone;
  bool sequence_parallel = false;
  std::vector<int> layers;  // per part
  int max_layers = 0;
};

Layout layout_of(const PlanDocument& plan, const LayerCut& cut) {
  Layout l;
  const PlanStageRecord& s = plan.stages.front();
  l.pp = static_cast<int>(plan.stages.size());
  l.vpp = static_cast<int>(cut.layers.size()) / l.pp;
  l.tp = s.tp;
  l.dp = s.replicas;
  l.zero = s.zero;
  l.microbatches = plan.training.microbatches;
  l.global_batch = plan.training.global_batch.value_or(s.microbatch_size.value_or(1) * l.dp * l.microbatches);
  l.microbatch_size = s.microbatch_size.value_or(l.global_batch / (l.dp * l.microbatches));
  l.recompute = !s.recompute                                 ? RecomputeScope::kNone
                : s.recompute_scope == RecomputeScope::kNone ? RecomputeScope::kFull
                                                             : s.recompute_scope;
  l.sequence_parallel = s.sequence_parallel && s.tp > 1;
  for (const auto& [first, end] : cut.layers) {
    l.layers.push_back(end - first);
    l.max_layers = std::max(l.max_layers, end - first);
  }
  return l;
}

bool all_equal(const std::vector<int>& v, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i)
    if (v[i] != v[from]) return false;
  return true;
}

std::string predicted_line(const PlanDocument& plan) { return "# apart's plan: " + plan_summary_line(plan) + "\n"; }

// Megatron-LM: a bash array of pretrain_gpt.py's flags.
std::string megatron_args(const PlanDocument& plan, const LayerCut& cut, const Layout& l, ordered& notes) {
  std::vector<std::string> args;
  auto flag = [&](const std::string& name, const std::string& value = "") {
    args.push_back(name + (value.empty() ? "" : " " + value));
  };
  const int L = static_cast<int>(cut.stack.layers.size());
  flag("--num-layers", std::to_string(L));
  flag("--tensor-model-parallel-size", std::to_string(l.tp));
  flag("--pipeline-model-parallel-size", std::to_string(l.pp));
  if (l.sequence_parallel) flag("--sequence-parallel");
  const size_t parts = l.layers.size();
  if (parts > 1) {
    const bool even = all_equal(l.layers, 0, parts);
    if (l.vpp > 1 && even) {
      flag("--num-layers-per-virtual-pipeline-stage", std::to_string(l.layers.front()));
    } else if (l.vpp == 1 && even) {
      // Megatron's default: L / P layers per stage.
    } else if (l.vpp == 1 && parts >= 3 && all_equal(l.layers, 1, parts - 1)) {
      flag("--decoder-first-pipeline-num-layers", std::to_string(l.layers.front()));
      flag("--decoder-last-pipeline-num-layers", std::to_string(l.layers.back()));
    } else {  // E: embedding, t: a decoder layer, L: the loss; parts in virtual-stage order (part c on rank c mod P)
      std::string layout;
      for (size_t c = 0; c < parts; ++c) {
        layout += c == 0 ? "E" : "|";
        if (l.layers[c] > 0) layout += "t*" + std::to_string(l.layers[c]);
      }
      flag("--pipeline-model-parallel-layout", "\"" + layout + "L\"");
    }
  }
  flag("--micro-batch-size", std::to_string(l.microbatch_size));
  flag("--global-batch-size", std::to_string(l.global_batch));
  if (l.zero == 1) flag("--use-distributed-optimizer");
  if (l.recompute == RecomputeScope::kSelective) flag("--recompute-granularity", "selective");
  if (l.recompute == RecomputeScope::kFull) {
    // One checkpoint per (virtual) stage: apart's full recomputation keeps only the stage's input.
    flag("--recompute-granularity", "full");
    flag("--recompute-method", "uniform");
    flag("--recompute-num-layers", std::to_string(std::max(1, l.max_layers)));
  }
  if (plan.training.precision == Precision::kMixed) flag("--bf16");
  if (plan.training.overlap_allreduce.value_or(true) && l.dp > 1) flag("--overlap-grad-reduce");
  if (plan.training.precision == Precision::kMixed)
    notes.push_back({{"field", "training.precision"},
                     {"reason", "mixed precision is written as --bf16; use --fp16 for a float16 run"}});
  std::string out = "# Megatron-LM flags (apart export; names checked against " +
                    std::string(engine_capabilities(Engine::kMegatron).release) + ")\n" + predicted_line(plan) +
                    "# Add them to pretrain_gpt.py's other flags: torchrun --nproc-per-node ... pretrain_gpt.py "
                    "\"${APART_MEGATRON_ARGS[@]}\" ...\n# World size: TP " +
                    std::to_string(l.tp) + " x PP " + std::to_string(l.pp) + " x DP " + std::to_string(l.dp) + " = " +
                    std::to_string(l.tp * l.pp * l.dp) + " GPUs\nAPART_MEGATRON_ARGS=(\n";
  for (const std::string& a : args) out += "  " + a + "\n";
  return out + ")\n";
}

std::string toml_list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + std::string("\"") + names[i] + "\"";
  return out + "]";
}

std::string_view torch_schedule(Schedule s) {
  switch (s) {
    case Schedule::kGPipe:
      return "GPipe";
    case Schedule::k1F1B:
      return "1F1B";
    case Schedule::kInterleaved:
      return "Interleaved1F1B";
    case Schedule::kZbH1:
      break;
  }
  throw Unsupported("no torch.distributed.pipelining schedule runs ZB-H1 with one stage per rank");
}

std::string torchtitan_toml(const PlanDocument& plan, const LayerCut& cut, const Layout& l, ordered& notes) {
  std::ostringstream t;
  t << "# torchtitan job config (apart export; keys checked against "
    << engine_capabilities(Engine::kTorchtitan).release << "): merge into your model's TOML\n"
    << predicted_line(plan) << "\n[parallelism]\n"
    << "pipeline_parallel_degree = " << l.pp << "\n"
    << "pipeline_parallel_schedule = \"" << torch_schedule(l.pp > 1 ? plan.training.schedule : Schedule::k1F1B)
    << "\"\n"
    << "pipeline_parallel_microbatch_size = " << l.microbatch_size << "\n"
    << "module_fqns_per_model_part = [\n";
  for (size_t c = 0; c < cut.layers.size(); ++c) t << "  " << toml_list(cut.modules(static_cast<int>(c))) << ",\n";
  t << "]\n"
    << "tensor_parallel_degree = " << l.tp << "\n";
  if (l.zero == 0)
    t << "data_parallel_replicate_degree = " << l.dp << "\ndata_parallel_shard_degree = 1\n";
  else
    t << "data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = " << l.dp
      << "\nfsdp_reshard_after_forward = \"" << (l.zero == 3 ? "always" : "never") << "\"\n";
  t << "\n[training]\n"
    << "local_batch_size = " << l.global_batch / l.dp << "\n"
    << "global_batch_size = " << l.global_batch << "\n";
  if (plan.model && plan.model->tokens_per_sample) t << "seq_len = " << *plan.model->tokens_per_sample << "\n";
  t << "mixed_precision_param = \"" << (plan.training.precision == Precision::kMixed ? "bfloat16" : "float32")
    << "\"\n\n[activation_checkpoint]\n";
  if (l.recompute == RecomputeScope::kNone) t << "mode = \"none\"\n";
  if (l.recompute == RecomputeScope::kFull) {
    t << "mode = \"full\"\n";
    notes.push_back({{"field", "stages[].recompute_scope"},
                     {"reason",
                      "torchtitan's full checkpointing keeps each layer's input, apart's full recomputation "
                      "only the stage's: the same recomputed work, a little more memory per micro-batch"}});
  }
  if (l.recompute == RecomputeScope::kSelective) t << "mode = \"selective\"\nselective_ac_option = \"op\"\n";
  if (l.tp > 1 && !l.sequence_parallel)
    notes.push_back({{"field", "stages[].sequence_parallel"},
                     {"reason", "torchtitan's tensor parallelism always shards the norms along the sequence"}});
  return t.str();
}

std::string pipelining_fragment(const PlanDocument& plan, const LayerCut& cut, const Layout& l) {
  const std::string schedule = "Schedule" + std::string(torch_schedule(plan.training.schedule));
  std::ostringstream p;
  p << "# torch.distributed.pipelining fragment (apart export; names checked against "
    << engine_capabilities(Engine::kTorchPipelining).release << ")\n"
    << predicted_line(plan)
    << "# `model` is the torch module the ONNX file was exported from; `example_microbatch` one micro-batch of "
    << l.microbatch_size << " samples;\n# `loss_fn` its loss. Run on " << l.pp * l.dp << " ranks: " << l.pp
    << " pipeline stages";
  if (l.dp > 1) p << " x " << l.dp << " data-parallel replicas (wrap each stage's module in DDP over its replicas)";
  p << ".\nfrom torch.distributed.pipelining import SplitPoint, pipeline, " << schedule << "\n\n"
    << "N_MICROBATCHES = " << l.microbatches << "\n"
    << "split_spec = {\n";
  for (size_t c = 1; c < cut.layers.size(); ++c)
    p << "    \"" << module_fqn(cut.stack.layers[cut.layers[c].first]) << "\": SplitPoint.BEGINNING,\n";
  p << "}\n"
    << "pipe = pipeline(model, mb_args=(example_microbatch,), split_spec=split_spec)\n"
    << "pp_rank = rank % " << l.pp << "  # the stage this rank runs\n";
  if (l.vpp > 1) {
    p << "stages = [pipe.build_stage(i, device) for i in range(pp_rank, " << l.pp * l.vpp << ", " << l.pp << ")]\n"
      << "schedule = " << schedule << "(stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)\n";
  } else {
    p << "stage = pipe.build_stage(pp_rank, device)\n"
      << "schedule = " << schedule << "(stage, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)\n";
  }
  return p.str();
}

std::string deepspeed_config(const PlanDocument& plan, const Layout& l) {
  ordered c;
  c["train_batch_size"] = l.global_batch;
  c["train_micro_batch_size_per_gpu"] = l.microbatch_size;
  c["gradient_accumulation_steps"] = l.microbatches;
  c["zero_optimization"] = {{"stage", l.zero}};
  if (plan.training.precision == Precision::kMixed) c["bf16"] = {{"enabled", true}};
  return c.dump(2) + "\n";
}

std::string deepspeed_pipeline(const PlanDocument& plan, const LayerCut& cut, const Layout& l) {
  // The layer specs: one per module before the stack, one per layer, one per module after it.
  std::vector<std::string> specs;
  for (const std::string& m : cut.stack.before)
    if (!m.empty()) specs.push_back(module_fqn(m));
  const int first_layer_spec = static_cast<int>(specs.size());
  for (const std::string& layer : cut.stack.layers) specs.push_back(module_fqn(layer));
  for (const std::string& m : cut.stack.after)
    if (!m.empty()) specs.push_back(module_fqn(m));
  std::vector<int> parts{0};
  for (size_t c = 0; c + 1 < cut.layers.size(); ++c) parts.push_back(first_layer_spec + cut.layers[c].second);
  parts.push_back(static_cast<int>(specs.size()));
  // Full recomputation: one checkpoint per stage (apart keeps only the stage's input), every stage's specs in one.
  int interval = 1;
  for (size_t k = 0; k + 1 < parts.size(); ++k) interval = std::max(interval, parts[k + 1] - parts[k]);
  std::ostringstream p;
  p << "# DeepSpeed pipeline partition (apart export; names checked against "
    << engine_capabilities(Engine::kDeepSpeed).release << ")\n"
    << predicted_line(plan) << "# Build `layers` as these specs, in this order (one LayerSpec per module):\n";
  for (size_t i = 0; i < specs.size(); ++i) p << "#   " << i << ": " << specs[i] << "\n";
  p << "from deepspeed.pipe import PipelineModule\n\n"
    << "# Stage k holds layers[APART_PARTS[k]:APART_PARTS[k + 1]], the plan's stage boundaries.\nAPART_PARTS = [";
  for (size_t i = 0; i < parts.size(); ++i) p << (i ? ", " : "") << parts[i];
  p << "]\n\n\nclass PlannedPipelineModule(PipelineModule):\n"
    << "    def _partition_layers(self, method=\"uniform\"):\n"
    << "        self.parts = list(APART_PARTS)\n"
    << "        stage_id = self._topo.get_coord(self.global_rank).pipe\n"
    << "        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])\n\n\n"
    << "# module = PlannedPipelineModule(layers=layers, num_stages=" << l.pp << ", loss_fn=loss_fn, "
    << "partition_method=\"uniform\", activation_checkpoint_interval="
    << (l.recompute == RecomputeScope::kFull ? interval : 0) << ")\n"
    << "# engine, *_ = deepspeed.initialize(model=module, config=\"ds_config.json\", ...)\n";
  return p.str();
}

}  // namespace

std::vector<std::pair<std::string, std::string>> engine_files(const PlanDocument& plan, const LayerCut& cut,
                                                              Engine engine, ordered& notes) {
  const Layout l = layout_of(plan, cut);
  switch (engine) {
    case Engine::kMegatron:
      return {{"megatron_args.sh", megatron_args(plan, cut, l, notes)}};
    case Engine::kTorchtitan:
      return {{"torchtitan.toml", torchtitan_toml(plan, cut, l, notes)}};
    case Engine::kTorchPipelining:
      return {{"pipeline.py", pipelining_fragment(plan, cut, l)}};
    case Engine::kDeepSpeed:
      return {{"ds_config.json", deepspeed_config(plan, l)},
              {"deepspeed_pipeline.py", deepspeed_pipeline(plan, cut, l)}};
  }
  return {};
}

}  // namespace apart
