// Element types, numbered as ONNX's TensorProto.DataType so conversion is a cast.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace apart {

enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
};

// Bytes per element; 0 for kUndefined and kString (no fixed size).
int64_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// From an ONNX TensorProto.DataType number; nullopt when apart does not know it.
std::optional<DType> dtype_from_onnx(int32_t onnx_type);
bool is_floating(DType t);

}  // namespace apart
