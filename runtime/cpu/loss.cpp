// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (reduction, ignore_index, class weights).
#include <cmath>
#include <limits>

#include "runtime/cpu/families.h"
#include "runtime/cpu/threads.h"
#include "runtime/kernel.h"

namespace apart::cpu {
namespace {

// `logp` is [N, C, D…] log-probabilities; labels [N, D…]. Writes the loss output (0).
template <class T>
void nll(KernelContext& ctx, const T* logp, const Tensor& scores, const Tensor& labels, const Tensor* weights) {
  const int64_t n = scores.dim(0), c = scores.dim(1), inner = product(scores.shape(), 2);
  if (labels.elements() != n * inner) ctx.invalid("labels do not match the scores' N and D dims");
  const std::vector<int64_t> target = labels.to_int64s();
  const bool has_ignore = ctx.has_attr("ignore_index");
  const int64_t ignore = ctx.attr_int("ignore_index", 0);
  const std::string reduction = ctx.attr_string("reduction", "mean");
  const T* w = weights ? weights->data<T>() : nullptr;
  if (weights && weights->elements() != c) ctx.invalid("weights must have C elements");
  std::vector<double> loss(target.size());
  double loss_sum = 0, weight_sum = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t d = 0; d < inner; ++d) {
      const size_t at = static_cast<size_t>(b * inner + d);
      const int64_t t = target[at];
      if (has_ignore && t == ignore) continue;
      if (t < 0 || t >= c) ctx.invalid("label " + std::to_string(t) + " is out of range for " + std::to_string(c) + " classes");
      const double wt = w ? static_cast<double>(w[t]) : 1.0;
      loss[at] = -static_cast<double>(logp[(b * c + t) * inner + d]) * wt;
      loss_sum += loss[at];
      weight_sum += wt;
    }
  if (reduction == "none") {
    std::vector<int64_t> shape = labels.shape();
    Tensor& y = ctx.output(0, scores.dtype(), shape);
    for (size_t i = 0; i < loss.size(); ++i) y.data<T>()[i] = static_cast<T>(loss[i]);
  } else if (reduction == "sum") {
    ctx.output(0, scores.dtype(), {}).template data<T>()[0] = static_cast<T>(loss_sum);
  } else if (reduction == "mean") {
    ctx.output(0, scores.dtype(), {}).template data<T>()[0] =
        static_cast<T>(weight_sum == 0 ? std::numeric_limits<double>::quiet_NaN() : loss_sum / weight_sum);
  } else {
    ctx.invalid("unknown reduction '" + reduction + "'");
  }
}

void softmax_cross_entropy_k(KernelContext& ctx) {
  const Tensor& scores = ctx.input(0);
  if (scores.rank() < 2) ctx.invalid("scores must have rank >= 2");
  dispatch_float(ctx, scores.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = scores.dim(0), c = scores.dim(1), inner = product(scores.shape(), 2);
    // log_prob goes to output 1 when asked, else to scratch.
    const bool want_log_prob = ctx.num_outputs() > 1 && ctx.wants_output(1);
    Tensor scratch;
    Tensor* logp = nullptr;
    if (want_log_prob) {
      logp = &ctx.output(1, scores.dtype(), scores.shape());
    } else {
      scratch = Tensor(scores.dtype(), scores.shape());
      logp = &scratch;
    }
    const T* px = scores.data<T>();
    T* pl = logp->data<T>();
    parallel_for(n * inner, c * 4, [&](int64_t s, int64_t e) {
      for (int64_t line = s; line < e; ++line) {
        const int64_t base = (line / inner) * c * inner + line % inner;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < c; ++j) mx = std::max(mx, px[base + j * inner]);
        double sum = 0;
        for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(px[base + j * inner] - mx));
        const T lse = static_cast<T>(std::log(sum));
        for (int64_t j = 0; j < c; ++j) pl[base + j * inner] = px[base + j * inner] - mx - lse;
      }
    });
    nll<T>(ctx, pl, scores, ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr);
  });
}

void nll_loss_k(KernelContext& ctx) {
  const Tensor& input = ctx.input(0);
  if (input.rank() < 2) ctx.invalid("input must have rank >= 2");
  dispatch_float(ctx, input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    nll<T>(ctx, input.data<T>(), input, ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr);
  });
}

}  // namespace

void register_loss_kernels() {
  register_kernel("SoftmaxCrossEntropyLoss", softmax_cross_entropy_k);
  register_kernel("NegativeLogLikelihoodLoss", nll_loss_k);
}

}  // namespace apart::cpu
