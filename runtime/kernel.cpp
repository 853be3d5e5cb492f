// Kernel registry, context accessors and helpers shared by the CPU kernels.
#include "runtime/kernel.h"

#include "runtime/backend.h"
#include "runtime/blas_info.h"
#include "runtime/cpu/families.h"
#include "graph/threads.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

namespace apart {

const std::map<std::string, KernelFn, std::less<>>& KernelRegistry::kernels() const {
  std::call_once(registered_, register_all_);  // adds through add(), before any lookup reads the map
  return kernels_;
}

KernelFn KernelRegistry::find(std::string_view op_type) const {
  const auto& k = kernels();
  auto it = k.find(op_type);
  return it == k.end() ? nullptr : it->second;
}

bool KernelRegistry::writes_every_element(std::string_view op_type) const {
  kernels();  // registered first
  return writes_every_.find(op_type) != writes_every_.end();
}

std::vector<std::string> KernelRegistry::ops() const {
  std::vector<std::string> ops;
  for (const auto& [name, fn] : kernels()) ops.push_back(name);
  return ops;
}

namespace {
void register_cpu_kernels() {
  cpu::register_elementwise_kernels();
  cpu::register_matmul_kernels();
  cpu::register_reduce_kernels();
  cpu::register_shape_kernels();
  cpu::register_resize_kernels();
  cpu::register_conv_kernels();
  cpu::register_loss_kernels();
  cpu::register_grad_kernels();
  cpu::register_transformer_kernels();
  cpu::register_attention_kernels();
  cpu::register_norm_grad_kernels();
  cpu::register_tensor_parallel_kernels();
}

KernelRegistry& cpu_kernels() {
  static KernelRegistry registry(register_cpu_kernels);
  return registry;
}
}  // namespace

void register_kernel(std::string_view op_type, KernelFn fn, OutputWrites writes) {
  cpu_kernels().add(op_type, fn, writes);
}

bool cpu_kernel_writes_every_element(std::string_view op_type) { return cpu_kernels().writes_every_element(op_type); }

KernelFn find_kernel(std::string_view op_type) { return cpu_kernels().find(op_type); }

std::vector<std::string> supported_ops() {
  std::vector<std::string> ops;
  for (std::string& name : cpu_kernels().ops())
    if (name.find('.') == std::string::npos) ops.push_back(std::move(name));  // default domain only
  return ops;
}

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i)) invalid("input " + std::to_string(i) + " is missing");
  return *inputs_[i];
}

Tensor& KernelContext::output(size_t i, DType dtype, std::vector<int64_t> shape) {
  APART_CHECK(i < outputs_.size(), task_.name + ": output index " + std::to_string(i));
  outputs_[i] = allocate_(i, dtype, shape);
  return outputs_[i];
}

Backend& KernelContext::backend() const { return backend_ ? *backend_ : cpu_backend(); }

const Tensor& KernelContext::host_input(size_t i) const {
  if (!has_input(i)) invalid("input " + std::to_string(i) + " is missing");
  return host_input_ ? host_input_(i) : *inputs_[i];
}

const Tensor* KernelContext::tensor_attr(std::string_view name) const {
  for (const auto& [n, t] : tensor_attributes_)
    if (n == name) return &t;
  return nullptr;
}

void KernelContext::unsupported(const std::string& what) const {
  throw Unsupported("node '" + task_.name + "' (" + task_.op_type + "): the CPU runtime does not support " + what);
}
void KernelContext::invalid(const std::string& what) const {
  throw InvalidModel("node '" + task_.name + "' (" + task_.op_type + "): " + what);
}

std::vector<int64_t> broadcast_shapes(const KernelContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      ctx.invalid("shapes " + shape_string(a) + " and " + shape_string(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out) {
  std::vector<int64_t> s(out.size(), 0);
  const auto own = contiguous_strides(shape);
  const size_t off = out.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) s[off + i] = shape[i] == 1 ? 0 : own[i];
  return s;
}

int64_t normalize_axis(const KernelContext& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1))
    ctx.invalid("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

int64_t product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < std::min(end, shape.size()); ++i) p *= shape[i];
  return p;
}

void copy_bytes(const Tensor& in, Tensor& out) {
  APART_CHECK(in.bytes() == out.bytes(), "copy_bytes size mismatch");
  if (in.bytes() > 0 && in.raw() != out.raw()) std::memcpy(out.raw(), in.raw(), static_cast<size_t>(in.bytes()));
}

}  // namespace apart
