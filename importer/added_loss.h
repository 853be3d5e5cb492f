// The loss a logits-only export lacks (`--loss cross_entropy --labels NAME`), appended to the model as torch exports
// F.cross_entropy, so that partition, train, run and check all read the same graph from the same file.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "importer/importer.h"  // AddedLoss

namespace apart {

// The graph output the pass adds: a scalar of the logits' float type.
inline constexpr const char* kAddedLossOutput = "loss";

// Appends `loss` to the model's logits and returns the name of the loss output (kAddedLossOutput); does nothing and
// returns "" when !loss.enabled(). The logits: the graph output named "logits", else the only float graph output of
// rank ≥ 2; their declared last dim is the class count V. Adds the int64 graph input `loss.labels` (the logits' dims
// without the class dim, dim_params kept, so the batch binds both) and, under "/loss/", the nodes torch writes for
// F.cross_entropy(logits.view(-1, V), labels.view(-1)): Reshape both (rank > 2 only), SoftmaxCrossEntropyLoss
// (reduction mean, ignore_index -100); the shifted form first slices logits[..., :-1, :] and labels[..., 1:] on the
// sequence axis (rank ≥ 3). The loss replaces the logits among the graph outputs (the logits stay a value).
// Deterministic, so every reader of one file adds the same nodes and agrees on node indices.
// Throws InvalidArgument (naming --loss or --labels) when the model already outputs a scalar float, no output or
// several could be the logits, the class dim is not static, or NAME or "loss" is already a value of the model.
std::string append_loss(onnx::ModelProto& model, const AddedLoss& loss);

}  // namespace apart
