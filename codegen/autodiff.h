// Reverse-mode differentiation of an ONNX forward graph into an ONNX training graph (forward + backward).
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <utility>
#include <vector>

namespace apart {

struct TrainingGraphOptions {
  std::string loss;                 // scalar output to differentiate; empty: the graph's only scalar float output
  std::vector<std::string> params;  // initializers to differentiate; empty: every floating-point initializer
  std::vector<std::string> input_gradients;  // graph inputs (or stage boundary values) whose gradients to output too
  bool recompute = false;           // recompute forward activations in the backward instead of saving them
};

// A standard ONNX model (domain ai.apart only where documented in docs/autodiff.md) that computes the
// forward pass and the gradients. Inputs: the forward graph's inputs. Initializers: the forward's,
// unchanged (inline data or the same external-data references). Outputs: the loss first, then one
// gradient per param in `gradients` order, then the requested input gradients.
struct TrainingGraph {
  onnx::ModelProto model;
  std::string loss_output;
  std::vector<std::pair<std::string, std::string>> gradients;        // param name → gradient output name
  std::vector<std::pair<std::string, std::string>> input_gradients;  // input name → gradient output name
};

// Throws Unsupported naming the node whose op has no gradient rule, InvalidArgument for a bad loss/param.
TrainingGraph build_training_graph(const onnx::ModelProto& forward, const TrainingGraphOptions& options = {});

}  // namespace apart
