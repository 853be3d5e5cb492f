// Tensor: a dtype, a static shape and contiguous row-major bytes, shared so views cost nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/dtype.h"

namespace onnx {
class TensorProto;
}

namespace apart {

class Tensor {
 public:
  Tensor() = default;
  // Fresh zero-filled heap storage.
  Tensor(DType dtype, std::vector<int64_t> shape);
  // Fresh heap storage that is not zero-filled: for a kernel that writes every element (OutputWrites::kEvery).
  static Tensor uninitialized(DType dtype, std::vector<int64_t> shape);
  // A tensor over storage someone else owns (an arena slice); `owner` keeps it alive. `host` false: the bytes are a
  // device's memory (runtime/backend.h), which only that backend's kernels and copies may touch.
  static Tensor over(DType dtype, std::vector<int64_t> shape, std::shared_ptr<std::byte> data, bool host = true);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t axis) const { return shape_[static_cast<size_t>(axis < 0 ? axis + rank() : axis)]; }
  int64_t elements() const { return elements_; }
  int64_t bytes() const { return elements_ * dtype_size(dtype_); }
  bool defined() const { return dtype_ != DType::kUndefined; }
  // Whether the bytes are host memory (false: a device's; clone, to_int64s and scalar_as_double need host).
  bool on_host() const { return host_; }

  std::byte* raw() { return data_.get(); }
  const std::byte* raw() const { return data_.get(); }
  template <class T> T* data() { return reinterpret_cast<T*>(data_.get()); }
  template <class T> const T* data() const { return reinterpret_cast<const T*>(data_.get()); }
  template <class T> std::span<T> span() { return {data<T>(), static_cast<size_t>(elements_)}; }
  template <class T> std::span<const T> span() const { return {data<T>(), static_cast<size_t>(elements_)}; }

  // Same bytes, another shape with as many elements (no copy).
  Tensor view(std::vector<int64_t> shape) const;
  // Elements [begin, end) in row-major order as a 1-D tensor over the same bytes (no copy; host or device alike).
  Tensor flat_range(int64_t begin, int64_t end) const;
  // A deep copy with its own (host) storage; Internal for a device tensor (Backend::to_host copies those).
  Tensor clone() const;
  // Integer contents widened to int64 (int8…int64, uint8…uint64, bool); throws for other dtypes.
  std::vector<int64_t> to_int64s() const;
  // A scalar read as double (any numeric dtype, float16 and bfloat16 too).
  double scalar_as_double(int64_t index = 0) const;

 private:
  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> shape_;
  int64_t elements_ = 0;
  std::shared_ptr<std::byte> data_;
  bool host_ = true;
};

// Bytes of tensor storage this process holds (host tensors and the CPU backend's blocks; not a GPU's): now, and the
// most at any moment since the last reset. `apart run` reports a rank's peak from it (one process per rank under
// mpirun; in-process ranks share one count). Allocators call track_tensor_bytes(+n) and (−n) when freeing.
struct TensorMemory {
  int64_t live = 0;
  int64_t peak = 0;
};
TensorMemory tensor_memory();
void reset_tensor_memory_peak();  // peak := live
void track_tensor_bytes(int64_t delta);

// Reads a TensorProto: raw_data, typed fields, or external data resolved under `base_dir` (locations
// that leave it are refused). Throws InvalidModel for inconsistent tensors, Unsupported for
// string/complex dtypes, SystemError for I/O.
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::filesystem::path& base_dir = {});
// Reads a serialized TensorProto file (the ONNX test-data input_N.pb / output_N.pb).
Tensor read_tensor_file(const std::filesystem::path& path, std::string* name = nullptr);
// Writes `t` as raw_data.
void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto& proto);
void write_tensor_file(const Tensor& t, const std::string& name, const std::filesystem::path& path);

}  // namespace apart
