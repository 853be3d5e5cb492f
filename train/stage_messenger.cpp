// One stage's boundary messages: pack, send, receive, unpack (see stage_messenger.h).
#include "train/stage_messenger.h"

#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"

namespace apart {

namespace {

// The batch axis of a stage file's boundary value: the dim declared as the batch symbol or a multiple of it.
int batch_axis_of(const onnx::ValueInfoProto& info, const std::string& symbol) {
  if (symbol.empty() || !info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) return -1;
  const auto& dims = info.type().tensor_type().shape().dim();
  for (int a = 0; a < dims.size(); ++a) {
    const std::string& p = dims[a].dim_param();
    if (p == symbol ||
        (p.size() > symbol.size() && p.compare(p.size() - symbol.size() - 1, std::string::npos, "*" + symbol) == 0))
      return a;
  }
  return -1;
}

// Bytes [offset, offset + bytes) of a float32 message (both multiples of 4), over the same memory.
Tensor float_range(const Tensor& message, size_t offset, size_t bytes) {
  return message.flat_range(static_cast<int64_t>(offset / 4), static_cast<int64_t>((offset + bytes) / 4));
}

}  // namespace

int64_t BoundaryValue::bytes() const { return checked_element_count(shape).value_or(0) * dtype_size(dtype); }

int64_t BoundaryValue::slice_bytes(const SampleRange& samples) const {
  if (batch_axis < 0) return bytes();
  return bytes() / shape[static_cast<size_t>(batch_axis)] * (samples.end - samples.begin) * rows_per_sample;
}

std::vector<ByteRun> BoundaryValue::slice_runs(int64_t first, const SampleRange& samples) const {
  if (batch_axis < 0) return {{0, bytes()}};
  int64_t outer = 1;                      // product of the dims before the batch axis
  int64_t row_bytes = dtype_size(dtype);  // bytes of one row along the batch axis
  for (size_t a = 0; a < shape.size(); ++a) {
    if (static_cast<int>(a) < batch_axis) outer *= shape[a];
    if (static_cast<int>(a) > batch_axis) row_bytes *= shape[a];
  }
  return row_runs(outer, shape[static_cast<size_t>(batch_axis)], (samples.begin - first) * rows_per_sample,
                  (samples.end - samples.begin) * rows_per_sample, row_bytes);
}

StageMessenger::StageMessenger(const RunSetup& setup, const PlanStageRecord& stage, SampleRange samples,
                               Backend& backend, const MessageRoute& route,
                               std::vector<std::pair<std::string, std::string>> gradient_inputs)
    : setup_(setup),
      stage_(stage),
      samples_(samples),
      backend_(backend),
      route_(route),
      transport_(*route.comm, route.on_device ? backend : cpu_backend(),
                 route.on_device ? Posting::kGroupedWithNextReceive : Posting::kAtOnce),
      gradient_inputs_(std::move(gradient_inputs)) {}

void StageMessenger::add_boundaries(const onnx::ModelProto& stage, const TaskGraph& graph,
                                    const std::string& batch_symbol, const std::filesystem::path& stage_file) {
  const int64_t samples = samples_.end - samples_.begin;
  auto add = [&](const onnx::ValueInfoProto& info) {
    const auto id = graph.find_value(info.name());
    if (!id) return;
    const Value& value = graph.value(*id);
    BoundaryValue b;
    b.name = info.name();
    b.dtype = value.dtype;
    b.shape = value.shape;
    b.batch_axis = batch_axis_of(info, batch_symbol);
    if (b.batch_axis >= 0) {
      const int64_t dim = b.shape[static_cast<size_t>(b.batch_axis)];
      if (dim % samples != 0)
        throw InvalidModel(stage_file.string() + ": boundary value " + quote(b.name) + " has " + std::to_string(dim) +
                           " rows along its batch axis for " + std::to_string(samples) + " samples");
      b.rows_per_sample = dim / samples;
    }
    boundary_[b.name] = b;
  };
  for (const auto& info : stage.graph().input()) add(info);
  for (const auto& info : stage.graph().output()) add(info);
}

std::vector<std::string> StageMessenger::edge_values(int from, int to, bool gradient) const {
  const TaskGraph& graph = setup_.model->graph;
  std::vector<std::string> names;
  for (const PlanInput& in : setup_.plan.stages[static_cast<size_t>(to)].inputs) {
    if (in.from_stage != from) continue;
    const auto id = graph.find_value(in.value);
    APART_CHECK(id.has_value(), "plan value " + in.value + " is not in the model");
    if (gradient && !is_floating(graph.value(*id).dtype)) continue;
    names.push_back(in.value);
  }
  return names;
}

const BoundaryValue& StageMessenger::boundary(const std::string& name) const {
  auto it = boundary_.find(name);
  APART_CHECK(it != boundary_.end(), "stage " + std::to_string(stage_.id) + " has no boundary value " + name);
  return it->second;
}

StageMessenger::MessagePart StageMessenger::message_part(const Action& a, size_t bytes) const {
  const int peer = (a.kind == ActionKind::kSend) != a.gradient ? a.to_stage : a.from_stage;
  const int degree = std::max(1, setup_.full_plan.stages[static_cast<size_t>(stage_.id)].tp);
  if (degree == 1 || setup_.full_plan.stages[static_cast<size_t>(peer)].tp != degree) return {1, 0, bytes, bytes};
  // Whole float32 shards, so that the receivers' all-gather moves them.
  const size_t t = static_cast<size_t>(degree), part = (bytes + 4 * t - 1) / (4 * t) * 4;
  return {degree, part * static_cast<size_t>(setup_.role.tp_rank), part, part * t};
}

Tensor StageMessenger::in_message_memory(const Tensor& t) const {
  if (!route_.on_device) return backend_.to_host(t);  // MPI sends host bytes
  return t.on_host() ? backend_.to_device(t) : t;     // a host-memory backend: itself
}

size_t StageMessenger::send(const Action& a, const std::map<std::string, Tensor>& values) {
  const std::vector<std::string> names = edge_values(a.from_stage, a.to_stage, a.gradient);
  int64_t bytes = 0;
  for (const std::string& name : names) bytes += boundary(name).slice_bytes(a.samples);
  const MessagePart part = message_part(a, static_cast<size_t>(bytes));
  // Zeros: a gradient no param or output depends on stays zero, and so does the padding of TP parts.
  Tensor message = transport_.buffer(static_cast<int64_t>(part.padded));
  int64_t at = 0;
  for (const std::string& name : names) {
    const BoundaryValue& v = boundary(name);
    const auto it = values.find(name);
    APART_CHECK(a.gradient || it != values.end(), "stage " + std::to_string(stage_.id) + " did not compute " + name);
    if (it == values.end()) {  // the stage's params and outputs do not depend on this input: its gradient is zero
      at += v.slice_bytes(a.samples);
      continue;
    }
    at = transport_.pack(in_message_memory(it->second), v.slice_runs(samples_.begin, a.samples), message, at);
  }
  transport_.send(part.parts == 1 ? std::move(message) : float_range(message, part.offset, part.bytes), a.peer,
                  action_tag(a, setup_.plan));
  return part.bytes;
}

size_t StageMessenger::recv(const Action& a, std::map<std::string, Tensor>& into) {
  const std::vector<std::string> names = edge_values(a.from_stage, a.to_stage, a.gradient);
  int64_t bytes = 0;
  for (const std::string& name : names) bytes += boundary(name).slice_bytes(a.samples);
  const MessagePart part = message_part(a, static_cast<size_t>(bytes));
  Tensor message = transport_.buffer(static_cast<int64_t>(part.padded));
  if (part.parts == 1) {
    transport_.recv(message, a.peer, action_tag(a, setup_.plan));
  } else {  // every TP rank receives its part: the whole message on each (message_part)
    Tensor mine = float_range(message, part.offset, part.bytes);
    transport_.recv(mine, a.peer, action_tag(a, setup_.plan));
    route_.tp_group->allgather(message.span<float>())->wait();
  }
  int64_t at = 0;
  for (const std::string& name : names) {
    const BoundaryValue& v = boundary(name);
    std::string key = name;  // a gradient: the sum of what each reader (stage or replica) sends back, by its input
    if (a.gradient) {
      key.clear();
      for (const auto& [output, input] : gradient_inputs_)
        if (output == name) key = input;
    }
    if (key.empty()) {
      at += v.slice_bytes(a.samples);
      continue;
    }
    Tensor& t = into[key];
    if (!t.defined()) t = transport_.memory().empty(v.dtype, v.shape);
    at = transport_.unpack(message, at, v.slice_runs(samples_.begin, a.samples), t, a.gradient);
  }
  return part.bytes;
}

}  // namespace apart
