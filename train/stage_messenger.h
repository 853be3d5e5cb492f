// apart run's stage-boundary messages of one stage (internal to train/pipeline.cpp): the values crossing its
// boundaries as this rank holds them, and one send and one receive of a schedule action's message, over the host
// (MPI, threads) or over a communicator that moves the backend's memory (NCCL), through one MessageTransport.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "graph/task_graph.h"
#include "train/message_transport.h"
#include "train/run_setup.h"
#include "schedule/schedule.h"

namespace apart {

// A value crossing a stage boundary as this rank holds it: its shape for this rank's samples of a micro-batch, and
// the axis along which samples lie (-1: the value does not scale with the batch, e.g. a mask computed from constants).
struct BoundaryValue {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  int batch_axis = -1;
  int64_t rows_per_sample = 0;  // along batch_axis

  int64_t bytes() const;
  // Bytes of `samples` of it (the whole value when it does not scale with the batch).
  int64_t slice_bytes(const SampleRange& samples) const;
  // Where `samples` lie in a tensor holding the samples from `first`: byte runs.
  std::vector<ByteRun> slice_runs(int64_t first, const SampleRange& samples) const;
};

// Where a stage's messages go: over the host world, or over the device world in the backend's memory.
struct MessageRoute {
  Communicator* comm = nullptr;      // the world, or RunOptions::device_world
  bool on_device = false;            // messages in the stage backend's memory, sends grouped with the next receive
  Communicator* tp_group = nullptr;  // the stage's TP group over `comm` (nullptr without TP): a TP message's gather
};

class StageMessenger {
 public:
  // `stage`: its record in the view this rank runs (setup.plan); `samples`: this replica's samples of a micro-batch;
  // `gradient_inputs`: the backward's input for each output's gradient (StageGraphs::output_gradient_inputs).
  StageMessenger(const RunSetup& setup, const PlanStageRecord& stage, SampleRange samples, Backend& backend,
                 const MessageRoute& route, std::vector<std::pair<std::string, std::string>> gradient_inputs);

  // The stage's boundary values: the stage file's graph inputs and outputs at this rank's samples, with shapes and
  // dtypes from `graph` (the forward's) and batch axes from the stage file's dims named `batch_symbol`.
  // InvalidModel naming `stage_file` when a batch axis does not divide into the samples.
  void add_boundaries(const onnx::ModelProto& stage, const TaskGraph& graph, const std::string& batch_symbol,
                      const std::filesystem::path& stage_file);

  // Sends action `a`'s message from `values` (the frame's outputs, or for a gradient its input gradients: one absent
  // is zero); the bytes sent.
  size_t send(const Action& a, const std::map<std::string, Tensor>& values);
  // Receives action `a`'s message into `into` (the frame's inputs, or for a gradient its output gradients by the
  // backward's input name, summed over the readers that send one); the bytes received.
  size_t recv(const Action& a, std::map<std::string, Tensor>& into);
  // Waits for every send (the step's end).
  void finish() { transport_.finish(); }

 private:
  // This TP rank's part of a message of `bytes` for `a`. When this stage and the stage at the other end are cut over
  // TP groups of one degree t, TP rank r sends and receives part r of the message padded to a multiple of 4·t bytes,
  // and the receivers all-gather the whole message over their group, as the planner costs a TP stage's boundary
  // (partition/stage_cost.h boundary_share); otherwise the part is the whole message.
  struct MessagePart {
    int parts = 1;
    size_t offset = 0, bytes = 0;  // this rank's part of the message
    size_t padded = 0;             // the whole message's length: parts · bytes
  };
  MessagePart message_part(const Action& a, size_t bytes) const;
  // The values of a message on the edge from → to (the receiving stage's inputs from `from`, in plan order);
  // gradient messages carry the float ones.
  std::vector<std::string> edge_values(int from, int to, bool gradient) const;
  const BoundaryValue& boundary(const std::string& name) const;
  // `t` in the transport's memory: the host's, or the backend's.
  Tensor in_message_memory(const Tensor& t) const;

  const RunSetup& setup_;
  const PlanStageRecord& stage_;
  SampleRange samples_;
  Backend& backend_;
  MessageRoute route_;
  MessageTransport transport_;
  std::vector<std::pair<std::string, std::string>> gradient_inputs_;
  std::map<std::string, BoundaryValue> boundary_;
};

}  // namespace apart
