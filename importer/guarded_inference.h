// ONNX 1.12's shape inference, guarded where it trusts its inputs too far (docs/security.md).
#pragma once

#include <onnx/defs/schema.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace apart {

// What the checks read of one node, from ONNX's inference context or from the task graph after inference.
struct NodeShapes {
  size_t inputs = 0;
  std::function<int(size_t)> rank;                    // input i's rank, −1 when unknown
  std::function<int(const char*)> ints_length;        // an ints attribute's length, −1 when absent
  std::function<std::string(size_t)> name, shape;     // input i's name and shape, for the message
};

// What in a default-domain `op` node ONNX 1.12's inference would read out of bounds, in words ("" when nothing):
// - inputs whose rank the op's inference indexes without checking it (every version): Gemm's A and B must be rank 2
//   (Gemm reads B's dim 1 whatever B's rank: fuzz/import.cpp found a Gemm-6 with a rank-1 B);
// - the convolution and pooling ops: without `kernel_shape` they take the kernel from W's dims 2… and then index
//   `dilations`, `strides` and `pads` (sized by X's rank) with it (fuzz/import.cpp found a QLinearConv with X rank 3
//   and W rank 4), so X needs rank ≥ 2, W X's rank, and kernel_shape, strides, dilations, output_padding,
//   output_shape and pads the lengths X's rank gives them.
// The one home of these rules: GuardedSchemaRegistry skips such a node's inference, the importer names it.
std::string inference_hazard(const std::string& op, const NodeShapes& node);

// Hands ONNX copies of the real schemas whose inference first checks what ONNX 1.12's inference functions take for
// granted, and infers nothing for the node when it does not hold (the node's outputs stay unknown):
// - every input the schema requires has a known type: several functions (Shape-15 among them) dereference the type
//   of their input without a check, which crashed on a graph input declared without a type and on the output of a
//   custom-domain op (no schema, so no type) feeding Shape (found by fuzz/import.cpp);
// - a default-domain node has no inference_hazard() (the importer names such a node: it checks again after
//   inference).
// One registry serves the whole process (guarded_schemas()); its copies are made once per schema, under a lock.
class GuardedSchemaRegistry : public onnx::ISchemaRegistry {
 public:
  const onnx::OpSchema* GetSchema(const std::string& key, const int maxInclusiveVersion,
                                  const std::string& domain) const override;

 private:
  mutable std::mutex mutex_;
  mutable std::map<const onnx::OpSchema*, std::unique_ptr<onnx::OpSchema>> guarded_;  // by the schema they wrap
};

GuardedSchemaRegistry& guarded_schemas();

}  // namespace apart
