// ONNX opsets 18–23 on ONNX 1.12's schemas: which schema a default-domain node is checked and shape-inferred with.
//
// Debian's ONNX library (1.12) defines the default domain up to opset 17. A model at opset N ≤ 23 is imported with
// the schemas below and is never rewritten: the task graph, the stage files (stage_K.onnx copies the model's own
// nodes and opset_import) and the training graphs keep each node in the form its opset gives it, so a model at
// opset N is written back at opset N, valid there, and the runtime kernels and gradient rules read that form
// (ReduceMean's axes as input 1 from 18, Split's num_outputs, Pad's axes input; runtime/op_args.cpp,
// codegen/gradients/). What is adapted is the lookup, for `op` at opset N > 17 (opset_schema):
//
//   1. op not revised in 18…N: ONNX 1.12's own schema at 17 (its definition at N is the same, by ONNX's versioning).
//   2. op revised in 18…N, and each revision only widened its types or added attributes whose defaults keep the old
//      meaning (Cast-19's saturate, Reshape/Shape/Squeeze/…-19/21/23, all of opset 22): a copy of 1.12's schema with
//      since_version = the revision and the new attributes declared; its shape inference is 1.12's. Where a new
//      attribute changes shapes when set (AveragePool-19's dilations, LpPool-18's ceil_mode), the node is refused
//      as Unsupported unless it holds the old meaning (adapted_node_problem).
//   3. op revised with a new input or shape rule (Reduce*-18/20: axes as input 1; Split-18: num_outputs; Pad-18:
//      axes input; Resize-18/19: axes, keep_aspect_ratio_policy, antialias): a schema of that revision with its own
//      inference, built on 1.12's (the Reduce* revisions infer as ReduceSum-13, which already took axes as input).
//   4. ops 1.12 lacks (Gelu-20, Mish-18, Bitwise*-18, GroupNormalization-18/21, RMSNormalization-23,
//      RotaryEmbedding-23, Attention-23): a schema apart defines, with its own shape rule.
//   5. ops revised or added in 18…23 that apart does not adapt (DFT-20, GridSample-20, Col2Im-18, CenterCropPad-18,
//      DeformConv-19, AffineGrid-20, the string and image ops): no schema, and a refusal naming the op and opset,
//      which the importer raises as Unsupported.
//
// Models above opset 23 are refused (newest_revision names the op that changed after 23 when there is one): the
// training graphs apart emits must stay valid at the model's opset, which is known only up to 23.
#pragma once

#include <onnx/defs/schema.h>

#include <cstdint>
#include <string>

namespace apart {

// The newest default-domain opset ONNX 1.12 defines, and the newest apart imports.
inline constexpr int64_t kLibraryOpset = 17;
inline constexpr int64_t kMaxOpset = 23;

struct OpsetSchema {
  const onnx::OpSchema* schema = nullptr;  // nullptr: no such op at that opset, or `refusal`
  std::string refusal;                     // ONNX defines the op there but apart does not adapt it: why, in words
};

// The schema a node `op` of `domain` at `opset` is verified and inferred with (the rules above); for other domains
// and opsets ≤ 17, ONNX 1.12's registry. Thread-safe; the schemas live as long as the process.
OpsetSchema opset_schema(const std::string& op, int opset, const std::string& domain);

// "Cast-25": the newest revision of default-domain `op` after kMaxOpset, at or before `opset`; "" when none (also for
// revisions past the newest opset apart lists, which it cannot tell).
std::string newer_revision(const std::string& op, int64_t opset);
// The newest default-domain opset whose revisions apart lists (newer_revision knows nothing past it).
int64_t newest_listed_opset();

// What the schema cannot say about a default-domain node at `opset` > 17 and apart refuses: a new attribute set to
// a value that changes shapes the adapted schema infers as before (AveragePool-19's dilations, LpPool-18's
// ceil_mode). "" when the node reads as its schema says.
std::string adapted_node_problem(const onnx::NodeProto& node, int64_t opset);

}  // namespace apart
