// Gradient rules of MatMul (batched, broadcast, 1-D promotion) and Gemm: more matrix products.
#include <numeric>

#include "codegen/gradients/gradient.h"

namespace apart::autodiff {
namespace {

std::vector<int64_t> swap_last_two(size_t rank) {
  std::vector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return perm;
}

void matmul_rule(GradNode& n) {
  auto& e = n.e;
  std::vector<int64_t> a = n.in(0).shape, b = n.in(1).shape;
  if (a.empty() || b.empty()) n.unsupported("MatMul of a scalar");
  // numpy promotion: a 1-D a is [1, k], a 1-D b is [k, 1]; y then gets those dims back.
  const std::vector<int64_t> a_orig = a, b_orig = b;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> y(rank);
  for (size_t i = 0; i + 2 < rank; ++i) {
    const int64_t da = i + a.size() < rank ? 1 : a[i + a.size() - rank];
    const int64_t db = i + b.size() < rank ? 1 : b[i + b.size() - rank];
    y[i] = da == 1 ? db : da;
  }
  y[rank - 2] = a[a.size() - 2];
  y[rank - 1] = b[b.size() - 1];
  std::string gy = n.gy();
  if (n.out(0).shape != y) gy = e.reshape(gy, y);

  const std::string xa = a == a_orig ? n.x(0) : e.reshape(n.x(0), a);
  const std::string xb = b == b_orig ? n.x(1) : e.reshape(n.x(1), b);
  if (n.wants(0)) {  // dA = dY · Bᵀ, summed over broadcast batch dims
    std::vector<int64_t> ga_shape = y;
    ga_shape[rank - 1] = a.back();
    std::string ga = e.op("MatMul", {gy, e.transpose(xb, swap_last_two(b.size()))});
    ga = e.unbroadcast(ga, ga_shape, a);
    n.give(0, a == a_orig ? ga : e.reshape(ga, a_orig));
  }
  if (n.wants(1)) {  // dB = Aᵀ · dY
    std::string gb;
    if (b.size() == 2 && rank > 2) {
      // A weight shared over the batch: one GEMM over stacked rows instead of a batched product + sum.
      int64_t rows = 1;
      for (size_t i = 0; i + 1 < rank; ++i) rows *= y[i];
      std::vector<int64_t> a_full(y.begin(), y.end() - 1);
      a_full.push_back(a.back());
      const std::string a_wide = a == a_full ? xa : e.expand(xa, a_full);  // a broadcast a
      const std::string a2 = e.reshape(a_wide, {rows, a.back()});
      gb = e.op("MatMul", {e.transpose(a2, {1, 0}), e.reshape(gy, {rows, y.back()})});
    } else {
      std::vector<int64_t> gb_shape = y;
      gb_shape[rank - 2] = b[b.size() - 2];
      gb = e.op("MatMul", {e.transpose(xa, swap_last_two(a.size())), gy});
      gb = e.unbroadcast(gb, gb_shape, b);
    }
    n.give(1, b == b_orig ? gb : e.reshape(gb, b_orig));
  }
}

void gemm_rule(GradNode& n) {
  auto& e = n.e;
  const bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  const float alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
  auto gemm = [&](const std::string& p, const std::string& q, bool tp, bool tq) {
    std::string out = e.op("Gemm", {p, q});
    set_attr(e.last(), "transA", static_cast<int64_t>(tp));
    set_attr(e.last(), "transB", static_cast<int64_t>(tq));
    if (alpha != 1.0f) set_attr(e.last(), "alpha", alpha);
    return out;
  };
  const std::string& g = n.gy();
  // Y = α·op(A)·op(B) + β·C.
  if (n.wants(0)) n.give(0, ta ? gemm(n.x(1), g, tb, true) : gemm(g, n.x(1), false, !tb));
  if (n.wants(1)) n.give(1, tb ? gemm(g, n.x(0), true, ta) : gemm(n.x(0), g, !ta, false));
  if (n.has_input(2) && n.wants(2)) {
    std::string gc = beta == 1.0f ? g : e.mul(g, e.scalar(beta, n.out(0).dtype));
    n.give(2, e.unbroadcast(gc, n.out(0).shape, n.in(2).shape));
  }
}

}  // namespace

void register_linalg_rules() {
  rules()["MatMul"] = matmul_rule;
  rules()["Gemm"] = gemm_rule;
}

}  // namespace apart::autodiff
