// ONNX 1.12's shape inference, guarded where it trusts its inputs too far (docs/security.md).
#pragma once

#include <onnx/defs/schema.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace apart {

// The convolution and pooling ops whose ONNX 1.12 inference reads past the end of a vector when ranks disagree:
// without `kernel_shape` it takes the kernel from W's dims 2… and then indexes `dilations`, `strides` and `pads`
// (sized by X's rank) with it (fuzz/import.cpp found a QLinearConv with X rank 3 and W rank 4). `weight` is W's
// input index, −1 for the pools.
struct ConvFamilyOp {
  const char* op;
  int weight;
};
// The entry for `op` (default domain), or nullptr.
const ConvFamilyOp* conv_family_op(const std::string& op);

// The rank ONNX 1.12's inference of `op` (default domain) takes input `input` to have without checking it (Gemm's A
// and B: 2), or −1.
int required_rank(const std::string& op, size_t input);

// Hands ONNX copies of the real schemas whose inference first checks what ONNX 1.12's inference functions take for
// granted, and infers nothing for the node when it does not hold (the node's outputs stay unknown):
// - every input the schema requires has a known type: several functions (Shape-15 among them) dereference the type
//   of their input without a check, which crashed on a graph input declared without a type and on the output of a
//   custom-domain op (no schema, so no type) feeding Shape (found by fuzz/import.cpp);
// - inputs have the ranks required_rank() gives (Gemm-6 with a rank-1 B read past B's dims: fuzz/import.cpp);
// - a conv-family op's W has X's rank, and kernel_shape, strides, dilations, output_padding, output_shape and pads
//   have the lengths X's rank gives them (the importer names such a node: the ranks are checked again after
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
