// Tensor storage and conversion from/to ONNX TensorProto.
#include "runtime/tensor.h"
#include "runtime/half_precision.h"

#include <onnx/onnx_pb.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "graph/atomic_file.h"
#include "graph/error.h"
#include "graph/text.h"
#include "graph/task_graph.h"
#include "importer/external_data.h"

namespace apart {

namespace fs = std::filesystem;

namespace {

// glibc returns a freed block above its mmap threshold (128 KiB at first) to the kernel, and trims the heap once
// 128 KiB at its top is free, so each micro-batch's fresh activation tensors fault their pages in again: measured
// on gpt-tiny (`apart run`, 1 rank, batch 4), forward 6.0 ms with the defaults vs 4.7 ms with the freed memory
// kept (the profile's fused run, which reuses one arena, 3.4 ms). Keep freed blocks up to 32 MiB (glibc's largest
// mmap threshold on 64-bit) in the heap and up to 256 MiB of free heap mapped, once, before the first tensor.
bool keep_freed_memory_for_reuse() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
  return true;
}

// Blocks above glibc's largest mmap threshold are mapped afresh on every allocation, and each of their pages faults
// in and is cleared by the kernel again: gpt2-small's embedding gradient and the tied head's transposed table
// (154 MB each) spent 22 % of a training step in the kernel's page clearing (perf, 2 threads). Freed blocks that
// large are kept here, by size, up to 2 GiB or an eighth of the machine's memory in all, and handed out again
// (zeroed) for the same size.
class LargeBlockCache {
 public:
  static constexpr size_t kLargeBytes = size_t{32} << 20;
  LargeBlockCache() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const size_t physical = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
    max_cached_ = std::min(size_t{2} << 30, physical / 8);
  }
  std::byte* take(size_t bytes) {
    const std::lock_guard lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    std::byte* p = it->second;
    free_.erase(it);
    cached_ -= bytes;
    return p;
  }
  // false: the cache is full, the caller frees the block.
  bool give(std::byte* p, size_t bytes) {
    const std::lock_guard lock(mutex_);
    if (cached_ + bytes > max_cached_) return false;
    free_.emplace(bytes, p);
    cached_ += bytes;
    return true;
  }
 private:
  std::mutex mutex_;
  std::multimap<size_t, std::byte*> free_;
  size_t cached_ = 0;
  size_t max_cached_ = 0;
};

LargeBlockCache& large_blocks() {
  static auto* cache = new LargeBlockCache;  // never destroyed: tensors of static lifetime may outlive any other
  return *cache;
}

std::atomic<int64_t> live_tensor_bytes{0};
std::atomic<int64_t> peak_tensor_bytes{0};

std::shared_ptr<std::byte> allocate_bytes(int64_t bytes, bool zeroed = true) {
  static const bool kTuned = keep_freed_memory_for_reuse();
  (void)kTuned;
  // One extra element keeps zero-size tensors at a valid address; value-initialised (zeroed) unless told not to.
  const size_t n = static_cast<size_t>(bytes) + 8;
  track_tensor_bytes(bytes);
  if (n < LargeBlockCache::kLargeBytes)
    return std::shared_ptr<std::byte>(zeroed ? new std::byte[n]() : new std::byte[n], [bytes](std::byte* q) {
      track_tensor_bytes(-bytes);
      delete[] q;
    });
  LargeBlockCache& cache = large_blocks();
  std::byte* p = cache.take(n);
  if (p && zeroed)
    std::memset(p, 0, n);
  else if (!p)
    p = zeroed ? new std::byte[n]() : new std::byte[n];
  return std::shared_ptr<std::byte>(p, [n, bytes, &cache](std::byte* q) {
    track_tensor_bytes(-bytes);
    if (!cache.give(q, n)) delete[] q;
  });
}

int64_t count_of(const std::vector<int64_t>& shape) {
  auto n = checked_element_count(shape);
  if (!n) throw InvalidArgument("tensor shape " + shape_string(shape) + " is negative or overflows");
  return *n;
}


void read_external(const onnx::TensorProto& proto, const fs::path& base_dir, std::byte* dst, int64_t bytes) {
  const ExternalData ref = external_data(proto, base_dir);
  const fs::path& path = ref.file;
  const int64_t offset = ref.offset;
  if (ref.length >= 0 && ref.length != bytes)
    throw InvalidModel("tensor " + quote(proto.name()) + ": external_data length " + std::to_string(ref.length) +
                       " differs from its shape's " + std::to_string(bytes) + " bytes");
  if (!external_file_exists(ref, proto.name()))
    throw SystemError("external-data file " + path.string() + " of tensor " + quote(proto.name()) + " does not exist");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError("cannot open external-data file " + path.string() + " of tensor " + quote(proto.name()));
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(dst), bytes);
  if (in.gcount() != bytes)
    throw InvalidModel("external-data file " + path.string() + " is too short for tensor " + quote(proto.name()) +
                       " (needs " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + ")");
}

template <class Dst, class Field>
void copy_field(const Field& field, std::byte* dst, int64_t n, const std::string& name) {
  if (field.size() != n)
    throw InvalidModel("tensor " + quote(name) + " has " + std::to_string(field.size()) + " typed values for " +
                       std::to_string(n) + " elements");
  Dst* out = reinterpret_cast<Dst*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Dst>(field.Get(static_cast<int>(i)));
}

}  // namespace

Tensor::Tensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)), elements_(count_of(shape_)) {
  if (dtype_size(dtype_) == 0) throw Unsupported("tensors of dtype " + std::string(dtype_name(dtype_)) + " are not supported");
  data_ = allocate_bytes(bytes());
}

Tensor Tensor::uninitialized(DType dtype, std::vector<int64_t> shape) {
  if (dtype_size(dtype) == 0)
    throw Unsupported("tensors of dtype " + std::string(dtype_name(dtype)) + " are not supported");
  std::vector<int64_t> dims = std::move(shape);
  const int64_t elements = count_of(dims);
  return over(dtype, std::move(dims), allocate_bytes(elements * dtype_size(dtype), false));
}

void track_tensor_bytes(int64_t delta) {
  const int64_t now = live_tensor_bytes.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = peak_tensor_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_tensor_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

TensorMemory tensor_memory() {
  return {live_tensor_bytes.load(std::memory_order_relaxed), peak_tensor_bytes.load(std::memory_order_relaxed)};
}

void reset_tensor_memory_peak() {
  peak_tensor_bytes.store(live_tensor_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

Tensor Tensor::over(DType dtype, std::vector<int64_t> shape, std::shared_ptr<std::byte> data, bool host) {
  Tensor t;
  t.host_ = host;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.elements_ = count_of(t.shape_);
  t.data_ = std::move(data);
  return t;
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  Tensor t = over(dtype_, std::move(shape), data_, host_);
  APART_CHECK(t.elements_ == elements_, "view " + shape_string(t.shape_) + " of " + shape_string(shape_));
  return t;
}

Tensor Tensor::flat_range(int64_t begin, int64_t end) const {
  APART_CHECK(0 <= begin && begin <= end && end <= elements_,
              "flat_range [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + shape_string(shape_));
  const std::shared_ptr<std::byte> at(data_, data_.get() + begin * dtype_size(dtype_));  // shares the owner
  return over(dtype_, {end - begin}, at, host_);
}

Tensor Tensor::clone() const {
  APART_CHECK(host_, "clone of a device tensor: copy it with Backend::to_host");
  Tensor t(dtype_, shape_);
  if (bytes() > 0) std::memcpy(t.raw(), raw(), static_cast<size_t>(bytes()));
  return t;
}

std::vector<int64_t> Tensor::to_int64s() const {
  APART_CHECK(host_, "to_int64s of a device tensor: copy it with Backend::to_host");
  std::vector<int64_t> out(static_cast<size_t>(elements_));
  auto widen = [&](auto sample) {
    using T = decltype(sample);
    const T* p = data<T>();
    for (int64_t i = 0; i < elements_; ++i) out[static_cast<size_t>(i)] = static_cast<int64_t>(p[i]);
  };
  switch (dtype_) {
    case DType::kInt64: widen(int64_t{}); break;
    case DType::kInt32: widen(int32_t{}); break;
    case DType::kInt16: widen(int16_t{}); break;
    case DType::kInt8: widen(int8_t{}); break;
    case DType::kUInt8: widen(uint8_t{}); break;
    case DType::kUInt16: widen(uint16_t{}); break;
    case DType::kUInt32: widen(uint32_t{}); break;
    case DType::kUInt64: widen(uint64_t{}); break;
    case DType::kBool: widen(uint8_t{}); break;
    default: throw InvalidModel("expected an integer tensor, got " + std::string(dtype_name(dtype_)));
  }
  return out;
}

double Tensor::scalar_as_double(int64_t i) const {
  APART_CHECK(host_, "scalar_as_double of a device tensor: copy it with Backend::to_host");
  APART_CHECK(i < elements_, "scalar index out of range");
  switch (dtype_) {
    case DType::kFloat32: return data<float>()[i];
    case DType::kFloat64: return data<double>()[i];
    case DType::kInt64: return static_cast<double>(data<int64_t>()[i]);
    case DType::kInt32: return data<int32_t>()[i];
    case DType::kBool:
    case DType::kUInt8: return data<uint8_t>()[i];
    case DType::kInt8: return data<int8_t>()[i];
    case DType::kInt16: return data<int16_t>()[i];
    case DType::kUInt16: return data<uint16_t>()[i];
    case DType::kUInt32: return data<uint32_t>()[i];
    case DType::kUInt64: return static_cast<double>(data<uint64_t>()[i]);
    case DType::kFloat16:
    case DType::kBFloat16: return half_bits_to_float(dtype_, data<uint16_t>()[i]);
    default: throw Unsupported("cannot read a " + std::string(dtype_name(dtype_)) + " scalar");
  }
}

Tensor tensor_from_proto(const onnx::TensorProto& proto, const fs::path& base_dir) {
  auto dtype = dtype_from_onnx(proto.data_type());
  if (!dtype || dtype_size(*dtype) == 0 || *dtype == DType::kComplex64 || *dtype == DType::kComplex128)
    throw Unsupported("tensor " + quote(proto.name()) + " has data type " + std::to_string(proto.data_type()) +
                      ", which the runtime does not support");
  if (proto.has_segment()) throw Unsupported("tensor " + quote(proto.name()) + " is segmented");
  std::vector<int64_t> shape(proto.dims().begin(), proto.dims().end());
  const auto count = checked_element_count(shape);
  int64_t byte_count = 0;
  if (!count || __builtin_mul_overflow(*count, dtype_size(*dtype), &byte_count))
    throw InvalidModel("tensor " + quote(proto.name()) + " has an invalid shape " + shape_string(shape));
  // Sizes are checked against the data present before anything is allocated.
  const bool external = proto.data_location() == onnx::TensorProto::EXTERNAL;
  if (!external && proto.has_raw_data() && static_cast<int64_t>(proto.raw_data().size()) != byte_count)
    throw InvalidModel("tensor " + quote(proto.name()) + " has " + std::to_string(proto.raw_data().size()) +
                       " raw bytes; its shape " + shape_string(shape) + " needs " + std::to_string(byte_count));
  if (!external && !proto.has_raw_data() && byte_count > 0) {
    const int64_t fields = proto.float_data_size() + proto.double_data_size() + proto.int64_data_size() +
                           proto.int32_data_size() + proto.uint64_data_size();
    if (fields != *count)
      throw InvalidModel("tensor " + quote(proto.name()) + " has " + std::to_string(fields) + " typed values for " +
                         std::to_string(*count) + " elements");
  }
  if (external && byte_count > (int64_t{1} << 40))
    throw InvalidModel("tensor " + quote(proto.name()) + " claims " + std::to_string(byte_count) + " bytes");
  Tensor t(*dtype, shape);
  const int64_t n = t.elements(), bytes = t.bytes();
  std::byte* dst = t.raw();
  if (external) {
    read_external(proto, base_dir, dst, bytes);
    return t;
  }
  if (proto.has_raw_data()) {
    if (bytes > 0) std::memcpy(dst, proto.raw_data().data(), static_cast<size_t>(bytes));
    return t;
  }
  const std::string& name = proto.name();
  switch (*dtype) {
    case DType::kFloat32: copy_field<float>(proto.float_data(), dst, n, name); break;
    case DType::kFloat64: copy_field<double>(proto.double_data(), dst, n, name); break;
    case DType::kInt64: copy_field<int64_t>(proto.int64_data(), dst, n, name); break;
    case DType::kInt32: copy_field<int32_t>(proto.int32_data(), dst, n, name); break;
    case DType::kInt16: copy_field<int16_t>(proto.int32_data(), dst, n, name); break;
    case DType::kInt8: copy_field<int8_t>(proto.int32_data(), dst, n, name); break;
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16: copy_field<uint16_t>(proto.int32_data(), dst, n, name); break;
    case DType::kUInt8:
    case DType::kBool: copy_field<uint8_t>(proto.int32_data(), dst, n, name); break;
    case DType::kUInt32: copy_field<uint32_t>(proto.uint64_data(), dst, n, name); break;
    case DType::kUInt64: copy_field<uint64_t>(proto.uint64_data(), dst, n, name); break;
    default: throw Unsupported("tensor " + quote(name) + ": dtype " + std::string(dtype_name(*dtype)) + " not readable");
  }
  if (*dtype == DType::kBool)
    for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = t.data<uint8_t>()[i] != 0;
  return t;
}

Tensor read_tensor_file(const fs::path& path, std::string* name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError("cannot open tensor file " + path.string());
  onnx::TensorProto proto;
  if (!proto.ParseFromIstream(&in)) throw InvalidModel(path.string() + " is not a serialized onnx.TensorProto");
  if (name) *name = proto.name();
  return tensor_from_proto(proto, path.parent_path());
}

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto& proto) {
  proto.Clear();
  proto.set_name(name);
  proto.set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) proto.add_dims(d);
  proto.set_raw_data(reinterpret_cast<const char*>(t.raw()), static_cast<size_t>(t.bytes()));
}

void write_tensor_file(const Tensor& t, const std::string& name, const fs::path& path) {
  onnx::TensorProto proto;
  tensor_to_proto(t, name, proto);
  AtomicFile file(path);
  if (!proto.SerializeToOstream(&file.stream()))
    throw SystemError("cannot write tensor file " + file.temp_path().string());
  file.commit();
}

}  // namespace apart
