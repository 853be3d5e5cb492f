// Tensor comparison for runtime tests: rtol/atol for floats, exact for integers and bool.
#pragma once

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>

#include "graph/task_graph.h"
#include "runtime/tensor.h"

namespace apart::testing {

// "" when `got` matches `want`; otherwise what differs.
inline std::string compare_tensors(const Tensor& got, const Tensor& want, double rtol = 1e-3, double atol = 1e-4) {
  if (got.dtype() != want.dtype())
    return "dtype " + std::string(dtype_name(got.dtype())) + " != " + std::string(dtype_name(want.dtype()));
  if (got.shape() != want.shape()) return "shape " + shape_string(got.shape()) + " != " + shape_string(want.shape());
  for (int64_t i = 0; i < got.elements(); ++i) {
    std::ostringstream why;
    if (is_floating(got.dtype()) && (got.dtype() == DType::kFloat32 || got.dtype() == DType::kFloat64)) {
      const double a = got.scalar_as_double(i), e = want.scalar_as_double(i);
      if (std::isnan(a) && std::isnan(e)) continue;
      if (a == e) continue;  // equal infinities
      if (std::fabs(a - e) <= atol + rtol * std::fabs(e)) continue;
      why << "element " << i << ": " << a << " != " << e;
      return why.str();
    }
    const int64_t es = dtype_size(got.dtype());
    if (std::memcmp(got.raw() + i * es, want.raw() + i * es, static_cast<size_t>(es)) != 0) {
      why << "element " << i << ": " << got.scalar_as_double(i) << " != " << want.scalar_as_double(i);
      return why.str();
    }
  }
  return "";
}

}  // namespace apart::testing
