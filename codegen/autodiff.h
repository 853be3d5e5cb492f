// Reverse-mode differentiation of an ONNX forward graph into an ONNX training graph (forward + backward).
#pragma once

#include <onnx/onnx_pb.h>

#include "importer/importer.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace apart {

struct TrainingGraphOptions {
  std::string loss;                 // scalar output to differentiate; empty: the graph's only scalar float output
  std::vector<std::string> params;  // initializers to differentiate; empty: every floating-point initializer but
                                    // those only read as Resize's roi/scales or Upsample's scales
  std::vector<std::string> input_gradients;  // graph inputs (or stage boundary values) whose gradients to output too
  // Pipeline stages that do not hold the loss: these forward outputs stay outputs and their gradients
  // come in as graph inputs named in TrainingGraph::output_gradient_inputs. With `loss` empty and this
  // set, the graph has no loss output.
  std::vector<std::string> output_gradients;
  // Dims to bind when the forward has symbolic dims (--dim batch=8, --shape …). The training graph is
  // valid for these static shapes only: reshape targets and reduction axes are computed from them.
  ImportOptions import;
  // Not empty: the loss's gradient seed is a graph input of this name (the loss's dtype and shape), which the
  // trainer feeds with the loss scale (train/loss_scale.h), instead of the constant 1.
  std::string loss_seed_input;
  // BatchNormalization runs in training mode (batch statistics; running stats of initializer-backed
  // mean/var come out as TrainingGraph::state_updates). false: inference-mode BN, gradients through it.
  bool batch_norm_training = true;
  // Rewrite MatMul·scale·mask·Softmax·MatMul attentions into one Attention node first (codegen/attention_fusion.h),
  // so that neither direction holds a seq × seq tensor. false: the graph is differentiated node for node as given.
  bool fuse_attention = true;
};

// A standard ONNX model (domain ai.apart only where documented in docs/autodiff.md) that computes the
// forward pass and the gradients. Inputs: the forward graph's inputs. Initializers: the forward's,
// unchanged (inline data or the same external-data references). Outputs: the loss first, then one
// gradient per param in `gradients` order, then the requested input gradients. (Additions: with
// output_gradients, those forward outputs follow the loss and their gradients are extra inputs;
// state_updates come last.) Inputs get the static shapes the forward was imported with.
struct TrainingGraph {
  onnx::ModelProto model;
  std::string loss_output;
  std::vector<std::pair<std::string, std::string>> gradients;        // param name → gradient output name
  std::vector<std::pair<std::string, std::string>> input_gradients;  // input name → gradient output name
  // Options::output_gradients: forward output name → graph input that carries its gradient.
  std::vector<std::pair<std::string, std::string>> output_gradient_inputs;
  // Outputs after the input gradients: BatchNormalization running statistics (initializer name → the
  // output holding its new value), for the trainer to copy back after a step.
  std::vector<std::pair<std::string, std::string>> state_updates;
  std::string loss_seed_input;  // Options::loss_seed_input when the graph has a loss, else ""
  // Nodes [0, forward_nodes) of `model` are the forward as differentiated: the given one's, fewer where attention was
  // fused (Options::fuse_attention); the rest is the backward.
  int forward_nodes = 0;
};

// Whether a default-domain op has a gradient rule; forward_only_ops() lists the ops the runtime runs that need
// none, because no gradient flows through them (integer, boolean or shape results, constants, argmax-like ops).
bool has_gradient_rule(std::string_view op_type);
const std::vector<std::string>& forward_only_ops();

// A graph output as the loss rule sees it.
struct LossCandidate {
  std::string name;
  bool scalar_float = false;  // a floating-point value of one element with a known shape
};
// The loss rule of every trainer (build_training_graph, apart train, apart run): `requested` when given, else the
// only scalar float output. InvalidArgument when there are several or none, starting with `model` ("the model",
// or its path) and saying how to name one with --loss.
std::string choose_loss(const std::vector<LossCandidate>& outputs, const std::string& requested,
                        const std::string& model = "the model");

// Throws Unsupported naming the node whose op has no gradient rule, InvalidArgument for a bad loss/param.
// Any default-domain opset 7–23 the importer takes: a forward below kMinTrainingOpset is first converted to it
// (at_training_opset).
TrainingGraph build_training_graph(const onnx::ModelProto& forward, const TrainingGraphOptions& options = {});

// The lowest default-domain opset the gradient rules emit for (ReduceSum's axes, Squeeze/Unsqueeze/Split as inputs).
inline constexpr int64_t kMinTrainingOpset = 13;
// A forward below kMinTrainingOpset converted to it by ONNX's version converter (its adapters may add nodes:
// Dropout's ratio becomes a Constant input); nullopt for one at kMinTrainingOpset or later (used as it is).
// Throws Unsupported naming the opset when the converter refuses the model.
std::optional<onnx::ModelProto> at_training_opset(const onnx::ModelProto& forward);

}  // namespace apart
