// CUDA losses: SoftmaxCrossEntropyLoss (log_prob by reduce.cu's LogSoftmax over axis 1) and
// NegativeLogLikelihoodLoss, with cpu/loss.cpp's reduction (none/sum/mean), ignore_index and class weights. Sum and
// mean are one block's fixed tree in double: deterministic. Their gradients are standard ops autodiff emits.
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "graph/error.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/launch.cuh"

namespace apart::cuda {
namespace {

enum class LossReduction : int { kNone, kSum, kMean };

struct NllGeometry {
  int64_t positions = 0, classes = 0, inner = 1;  // positions = N × inner
  bool has_ignore = false;
  int64_t ignore = 0;
  LossReduction reduction = LossReduction::kMean;
};

// The first label out of [0, C) a kernel met (not ignore_index): `found` set once, `label` its value.
struct LabelError {
  int found;
  long long label;
};

// Position p = (b, d): loss −logp[b, t, d] · w[t] (0 where t is ignore_index). `none` writes each; sum and mean
// reduce in one block.
template <class T, class L>
__global__ void nll_kernel(const T* logp, const L* labels, const T* weights, T* loss, NllGeometry g,
                           LabelError* error) {
  __shared__ double shared[32];
  double loss_sum = 0, weight_sum = 0;
  for (int64_t p = first_thread(); p < g.positions; p += thread_stride()) {
    const int64_t b = p / g.inner, d = p % g.inner;
    const int64_t t = static_cast<int64_t>(labels[p]);
    double value = 0;
    if (!(g.has_ignore && t == g.ignore)) {
      if (t < 0 || t >= g.classes) {
        if (atomicExch(&error->found, 1) == 0) error->label = t;
      } else {
        const double w = weights ? static_cast<double>(weights[t]) : 1.0;
        value = -static_cast<double>(logp[(b * g.classes + t) * g.inner + d]) * w;
        loss_sum += value;
        weight_sum += w;
      }
    }
    if (g.reduction == LossReduction::kNone) loss[p] = static_cast<T>(value);
  }
  if (g.reduction == LossReduction::kNone) return;
  loss_sum = block_reduce(loss_sum, SumOp{}, shared);
  weight_sum = block_reduce(weight_sum, SumOp{}, shared);
  if (threadIdx.x == 0)
    loss[0] = static_cast<T>(g.reduction == LossReduction::kSum ? loss_sum
                             : weight_sum == 0                  ? static_cast<double>(NAN)
                                                                : loss_sum / weight_sum);
}

// Writes output 0 from log-probabilities `logp` laid out as `scores` [N, C, d…]; labels [N, d…]. `error`: device
// memory for the label check.
template <class T>
void nll(KernelContext& ctx, const T* logp, const Tensor& scores, LabelError* error) {
  const Tensor& labels = ctx.input(1);
  const Tensor* weights = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  NllGeometry g;
  g.classes = scores.dim(1);
  g.inner = product(scores.shape(), 2);
  g.positions = scores.dim(0) * g.inner;
  if (labels.elements() != g.positions) ctx.invalid("labels do not match the scores' N and D dims");
  if (weights && weights->elements() != g.classes) ctx.invalid("weights must have C elements");
  g.has_ignore = ctx.has_attr("ignore_index");
  g.ignore = ctx.attr_int("ignore_index", 0);
  const std::string reduction = ctx.attr_string("reduction", "mean");
  if (reduction == "none") g.reduction = LossReduction::kNone;
  else if (reduction == "sum") g.reduction = LossReduction::kSum;
  else if (reduction == "mean") g.reduction = LossReduction::kMean;
  else ctx.invalid("unknown reduction '" + reduction + "'");
  Tensor& loss = g.reduction == LossReduction::kNone ? ctx.output(0, scores.dtype(), labels.shape())
                                                       : ctx.output(0, scores.dtype(), {});
  const cudaStream_t stream = backend_of(ctx).compute_stream();
  APART_CUDA_CHECK(cudaMemsetAsync(error, 0, sizeof(LabelError), stream));
  dispatch(ctx, labels.dtype(), [&](auto tag) {
    using L = decltype(tag);
    if constexpr (!std::is_integral_v<L>) {
      ctx.invalid("labels must be integers, not " + std::string(dtype_name(labels.dtype())));
    } else {
      // none: a thread per position; sum and mean: one block (a fixed tree), looping over the positions.
      const unsigned blocks = g.reduction == LossReduction::kNone ? blocks_for(g.positions) : 1u;
      const unsigned threads = g.reduction == LossReduction::kNone ? kThreads : 1024u;
      launch(ctx, blocks, threads, 0, nll_kernel<T, L>, logp, device_data<L>(ctx, labels),
             weights ? device_data<T>(ctx, *weights) : static_cast<const T*>(nullptr), device_data<T>(ctx, loss), g,
             error);
    }
  }, true);
  // Labels are data: one out of range is the caller's input, reported as InvalidArgument (it would read stray
  // memory otherwise). The check waits for the kernel: one small copy per loss.
  LabelError host_error{};
  APART_CUDA_CHECK(cudaMemcpyAsync(&host_error, error, sizeof(LabelError), cudaMemcpyDeviceToHost, stream));
  APART_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host_error.found)
    throw InvalidArgument("node '" + ctx.task().name + "' (" + ctx.task().op_type + "): label " +
                          std::to_string(host_error.label) + " is out of range for " + std::to_string(g.classes) +
                          " classes");
}

void softmax_cross_entropy_k(KernelContext& ctx) {
  const Tensor& scores = ctx.input(0);
  if (scores.rank() < 2) ctx.invalid("scores must have rank >= 2");
  dispatch_float(ctx, scores.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // log_prob goes to output 1 when asked, else to scratch, with the label check's flag after it (one scratch
    // block: a second scratch() call would hand out the same memory).
    const bool want_log_prob = ctx.num_outputs() > 1 && ctx.wants_output(1);
    const int64_t logp_bytes = want_log_prob ? 0 : (scores.bytes() + 255) / 256 * 256;
    const int64_t scratch_bytes = logp_bytes + static_cast<int64_t>(sizeof(LabelError));
    auto* block = static_cast<std::byte*>(backend_of(ctx).scratch(scratch_bytes));
    auto* error = reinterpret_cast<LabelError*>(block + logp_bytes);
    T* logp = want_log_prob ? device_data<T>(ctx, ctx.output(1, scores.dtype(), scores.shape()))
                            : reinterpret_cast<T*>(block);
    launch_softmax<T>(ctx, device_data<T>(ctx, scores), logp, scores.dim(0), scores.dim(1),
                      product(scores.shape(), 2), true);
    nll<T>(ctx, logp, scores, error);
  });
}

void nll_loss_k(KernelContext& ctx) {
  const Tensor& input = ctx.input(0);
  if (input.rank() < 2) ctx.invalid("input must have rank >= 2");
  dispatch_float(ctx, input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    nll<T>(ctx, device_data<T>(ctx, input), input,
           static_cast<LabelError*>(backend_of(ctx).scratch(sizeof(LabelError))));
  });
}

}  // namespace

void register_loss_kernels() {
  register_cuda_kernel("SoftmaxCrossEntropyLoss", softmax_cross_entropy_k);
  register_cuda_kernel("NegativeLogLikelihoodLoss", nll_loss_k);
}

}  // namespace apart::cuda
