// Conv, ai.apart.ConvGrad, MaxPool/AveragePool and their ai.apart gradients, GlobalAverage/MaxPool and
// BatchNormalization on the GPU, with the CPU kernels' semantics (cpu/conv.cpp, cpu/grad.cpp). Convolutions run on
// cuDNN (1-D as 2-D with a height of 1, 2-D, 3-D; groups, dilations, any pads: an asymmetric remainder becomes a zero
// border, conv_plan.h), the algorithm measured once per shape by cudnnFind*Ex and cached; fp32 runs FMA math only,
// tf32/mixed let cuDNN use TF32 tensor cores. Pools and batch norm are conv_kernels.cu's (why: conv_kernels.h).
#include <cudnn.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/conv_window.h"
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/conv_plan.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/families.h"

namespace apart::cuda {
namespace {

// The workspace cudnnFind*Ex may measure with; the chosen algorithm's own need is what later calls take.
constexpr int64_t kFindWorkspaceBytes = 256ll << 20;
constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

ConvAlgoCache& algo_cache() {
  static ConvAlgoCache cache;
  return cache;
}

// --- cuDNN descriptors (RAII) ----------------------------------------------------------------------------------
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { APART_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { APART_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { APART_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

cudnnDataType_t cudnn_type(const KernelContext& ctx, DType dtype) {
  if (dtype == DType::kFloat32) return CUDNN_DATA_FLOAT;
  if (dtype == DType::kFloat64) return CUDNN_DATA_DOUBLE;
  ctx.unsupported("dtype " + std::string(dtype_name(dtype)) + " on the GPU (float32 and float64 are supported)");
}

// cuDNN's legacy API takes int dims and tensors of fewer than 2^31 elements.
std::vector<int> int_dims(const KernelContext& ctx, const std::vector<int64_t>& dims, const char* what) {
  int64_t elements = 1;
  std::vector<int> out;
  for (int64_t d : dims) {
    elements *= d;
    out.push_back(static_cast<int>(d));
  }
  if (elements > INT_MAX)
    ctx.unsupported(std::string(what) + " of " + shape_string(dims) + ": cuDNN takes fewer than 2^31 elements");
  return out;
}
void set_tensor(const KernelContext& ctx, TensorDesc& desc, cudnnDataType_t type, const std::vector<int64_t>& dims,
                const char* what) {
  const std::vector<int> d = int_dims(ctx, dims, what);
  std::vector<int> strides(d.size(), 1);
  for (size_t i = d.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * std::max(d[i], 1);
  APART_CUDNN_CHECK(cudnnSetTensorNdDescriptor(desc.d, type, static_cast<int>(d.size()), d.data(), strides.data()));
}

// 1 and 0 in the type cuDNN's alpha/beta take for `type` (double for double data, float otherwise).
struct Blend {
  float f1 = 1, f0 = 0;
  double d1 = 1, d0 = 0;
  cudnnDataType_t type;
  explicit Blend(cudnnDataType_t t) : type(t) {}
  const void* one() const { return type == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d1) : &f1; }
  const void* zero() const { return type == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d0) : &f0; }
};

// --- Convolution geometry --------------------------------------------------------------------------------------

// A convolution as cuDNN sees it: dims N, C, spatial (1-D gets a height of 1), x with its explicit border.
struct ConvGeometry {
  std::vector<int64_t> x, x_bordered, w, y;  // cuDNN dims; y is also cuDNN's (onnx_y: ONNX's)
  std::vector<int64_t> onnx_y;
  ConvPadding padding;  // symmetric: cuDNN's pads; extra_*: the border
  std::vector<int64_t> strides, dilations;
  int64_t group = 1;
};

// Validates x/W/group as the CPU kernels do and lays the convolution out for cuDNN; `win` from conv_window().
ConvGeometry conv_geometry(const KernelContext& ctx, const Tensor& x, const Tensor& w, int64_t group, Window win) {
  const int64_t c = x.dim(1), m = w.dim(0);
  if (w.rank() != x.rank()) ctx.invalid("W's rank differs from X's");
  if (group <= 0 || c % group != 0 || m % group != 0 || w.dim(1) != c / group)
    ctx.invalid("channels do not match group");
  ConvGeometry g;
  g.group = group;
  g.x = x.shape();
  g.w = w.shape();
  g.onnx_y = {x.dim(0), m};
  g.onnx_y.insert(g.onnx_y.end(), win.out.begin(), win.out.end());
  if (x.rank() == 3) {  // 1-D: a height of 1, no padding, stride or dilation along it
    g.x.insert(g.x.begin() + 2, 1);
    g.w.insert(g.w.begin() + 2, 1);
    for (auto* v : {&win.out, &win.stride, &win.dilation}) v->insert(v->begin(), 1);
    for (auto* v : {&win.pad_begin, &win.pad_end}) v->insert(v->begin(), 0);
  }
  g.padding = split_pads(win.pad_begin, win.pad_end);
  g.strides = win.stride;
  g.dilations = win.dilation;
  g.x_bordered = g.x;
  for (size_t i = 0; i < win.out.size(); ++i) g.x_bordered[i + 2] += g.padding.extra_begin[i] + g.padding.extra_end[i];
  g.y = {x.dim(0), m};
  g.y.insert(g.y.end(), win.out.begin(), win.out.end());
  return g;
}

BorderCopy border_of(const ConvGeometry& g, bool to_bordered) {
  BorderCopy b;
  b.outer = g.x[0] * g.x[1];
  const size_t s = g.x.size() - 2;  // 2 or 3
  for (size_t i = 0; i < s; ++i) {
    const size_t d = 3 - s + i;
    b.src[d] = to_bordered ? g.x[i + 2] : g.x_bordered[i + 2];
    b.dst[d] = to_bordered ? g.x_bordered[i + 2] : g.x[i + 2];
    b.offset[d] = to_bordered ? g.padding.extra_begin[i] : -g.padding.extra_begin[i];
  }
  return b;
}
void copy_border(const BorderCopy& b, DType dtype, const void* src, void* dst, cudaStream_t stream) {
  if (dtype == DType::kFloat64) launch_border_copy(b, static_cast<const double*>(src), static_cast<double*>(dst), stream);
  else launch_border_copy(b, static_cast<const float*>(src), static_cast<float*>(dst), stream);
}

// The descriptors of one convolution on one backend.
struct ConvSetup {
  CudaBackend& backend;
  DType dtype;
  cudnnDataType_t type;
  cudnnMathType_t math;
  TensorDesc x, y;  // x: the bordered input
  FilterDesc w;
  ConvDesc conv;
  ConvGeometry g;

  ConvSetup(const KernelContext& ctx, DType dt, ConvGeometry geometry)
      : backend(backend_of(ctx)), dtype(dt), type(cudnn_type(ctx, dt)), g(std::move(geometry)) {
    // fp32: FMA kernels only (the CPU's precision); tf32/mixed: TF32 tensor cores allowed (CUDNN_DEFAULT_MATH).
    math = type == CUDNN_DATA_FLOAT && backend.precision() == Precision::kFp32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
    set_tensor(ctx, x, type, g.x_bordered, "X");
    set_tensor(ctx, y, type, g.y, "Y");
    const std::vector<int> wd = int_dims(ctx, g.w, "W");
    APART_CUDNN_CHECK(cudnnSetFilterNdDescriptor(w.d, type, CUDNN_TENSOR_NCHW, static_cast<int>(wd.size()), wd.data()));
    const std::vector<int> pads = int_dims(ctx, g.padding.symmetric, "pads");
    const std::vector<int> strides = int_dims(ctx, g.strides, "strides");
    const std::vector<int> dilations = int_dims(ctx, g.dilations, "dilations");
    APART_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(conv.d, static_cast<int>(pads.size()), pads.data(),
                                                      strides.data(), dilations.data(), CUDNN_CROSS_CORRELATION,
                                                      type));
    APART_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.d, static_cast<int>(g.group)));
    APART_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.d, math));
    // cuDNN's own output dims must be the ones the ONNX rules gave (they are, for every pad the border leaves).
    std::vector<int> out(g.y.size());
    APART_CUDNN_CHECK(
        cudnnGetConvolutionNdForwardOutputDim(conv.d, x.d, w.d, static_cast<int>(out.size()), out.data()));
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i] != g.y[i])
        ctx.invalid("cuDNN's output dims differ from " + shape_string(g.y) + " (dim " + std::to_string(i) + ": " +
                    std::to_string(out[i]) + ")");
    APART_CUDNN_CHECK(cudnnSetStream(backend.cudnn(), backend.compute_stream()));
  }

  ConvAlgoKey key(ConvDirection direction) const {
    return ConvAlgoKey{direction, backend.device(), static_cast<int>(type), static_cast<int>(math), g.x_bordered, g.w,
                       g.padding.symmetric, g.strides, g.dilations, g.group};
  }
  // The measured candidates → the choice; fp32 keeps FMA math whatever cuDNN reports (as asked).
  template <class Perf>
  ConvAlgoChoice choose(const ConvAlgoKey& key, const Perf* perf, int returned) const {
    std::vector<ConvAlgoCandidate> candidates;
    for (int i = 0; i < returned; ++i)
      candidates.push_back({static_cast<int>(perf[i].algo), perf[i].status == CUDNN_STATUS_SUCCESS, perf[i].time,
                            static_cast<int64_t>(perf[i].memory), perf[i].determinism == CUDNN_DETERMINISTIC,
                            static_cast<int>(perf[i].mathType)});
    auto choice = pick_conv_algo(candidates, kFindWorkspaceBytes);
    if (!choice) throw CudaError("cuDNN found no algorithm for the convolution " + key.describe());
    if (math == CUDNN_FMA_MATH) choice->math = CUDNN_FMA_MATH;
    return *choice;
  }
  void use(const ConvAlgoChoice& choice) { APART_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.d, static_cast<cudnnMathType_t>(choice.math))); }
};

// --- Conv ------------------------------------------------------------------------------------------------------

void conv_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& wt = ctx.input(1);
  if (x.rank() < 3 || x.rank() > 5) ctx.unsupported("Conv over " + std::to_string(x.rank() - 2) + " spatial dims (1-D to 3-D are supported)");
  if (wt.dtype() != x.dtype()) ctx.invalid("W's dtype differs from X's");
  const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
  const std::vector<int64_t> kernel(wt.shape().begin() + 2, wt.shape().end());
  if (ctx.has_attr("kernel_shape") && ctx.attr_ints("kernel_shape") != kernel) ctx.invalid("kernel_shape differs from W");
  ConvSetup s(ctx, x.dtype(), conv_geometry(ctx, x, wt, ctx.attr_int("group", 1), conv_window(ctx, in, kernel, false)));
  Tensor& y = ctx.output(0, x.dtype(), s.g.onnx_y);
  if (y.elements() == 0) return;
  if (x.elements() == 0 || wt.elements() == 0) {  // an empty reduction: y is the bias (or 0)
    ctx.backend().fill_zero_bytes(y);
  } else {
    const bool border = s.g.padding.needs_border();
    const int64_t border_bytes = border ? aligned(product(s.g.x_bordered) * dtype_size(x.dtype())) : 0;
    cudnnHandle_t h = s.backend.cudnn();
    const ConvAlgoKey key = s.key(ConvDirection::kForward);
    const ConvAlgoChoice choice = algo_cache().get(key, [&](const ConvAlgoKey& k) {
      auto* scratch = static_cast<std::byte*>(s.backend.scratch(border_bytes + kFindWorkspaceBytes));
      const void* xp = border ? scratch : x.raw();
      int count = 0, returned = 0;
      APART_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(count));
      APART_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, s.x.d, xp, s.w.d, wt.raw(), s.conv.d, s.y.d, y.raw(),
                                                               count, &returned, perf.data(), scratch + border_bytes,
                                                               kFindWorkspaceBytes));
      return s.choose(k, perf.data(), returned);
    });
    auto* scratch = static_cast<std::byte*>(s.backend.scratch(border_bytes + std::max<int64_t>(choice.workspace_bytes, 1)));
    if (border) copy_border(border_of(s.g, true), x.dtype(), x.raw(), scratch, s.backend.compute_stream());
    s.use(choice);
    const Blend blend(s.type);
    APART_CUDNN_CHECK(cudnnConvolutionForward(h, blend.one(), s.x.d, border ? scratch : x.raw(), s.w.d, wt.raw(),
                                              s.conv.d, static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo),
                                              scratch + border_bytes, static_cast<size_t>(choice.workspace_bytes),
                                              blend.zero(), s.y.d, y.raw()));
  }
  if (ctx.has_input(2)) {
    const Tensor& b = ctx.input(2);
    if (b.elements() != s.g.y[1] || b.dtype() != x.dtype()) ctx.invalid("B must have M elements of X's dtype");
    std::vector<int64_t> bias_dims(s.g.y.size(), 1);
    bias_dims[1] = s.g.y[1];
    TensorDesc bd;
    set_tensor(ctx, bd, s.type, bias_dims, "B");
    const Blend blend(s.type);
    APART_CUDNN_CHECK(cudnnAddTensor(s.backend.cudnn(), blend.one(), bd.d, b.raw(), blend.one(), s.y.d, y.raw()));
  }
}

// --- ai.apart.ConvGrad(dY, X, W) -> (dX, dW) -------------------------------------------------------------------

void conv_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& wt = ctx.input(2);
  if (x.rank() < 3 || x.rank() > 5) ctx.unsupported("ConvGrad over rank " + std::to_string(x.rank()));
  if (wt.dtype() != x.dtype() || dy.dtype() != x.dtype()) ctx.invalid("dY, X and W must share a dtype");
  const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
  const std::vector<int64_t> kernel(wt.shape().begin() + 2, wt.shape().end());
  if (ctx.has_attr("kernel_shape") && ctx.attr_ints("kernel_shape") != kernel) ctx.invalid("kernel_shape differs from W");
  ConvSetup s(ctx, x.dtype(), conv_geometry(ctx, x, wt, ctx.attr_int("group", 1), conv_window(ctx, in, kernel, false)));
  if (dy.shape() != s.g.onnx_y) ctx.invalid("dY is " + shape_string(dy.shape()) + ", the convolution gives " + shape_string(s.g.onnx_y));
  const bool want_dx = ctx.wants_output(0), want_dw = ctx.num_outputs() > 1 && ctx.wants_output(1);
  Tensor* dx = want_dx ? &ctx.output(0, x.dtype(), x.shape()) : nullptr;
  Tensor* dw = want_dw ? &ctx.output(1, wt.dtype(), wt.shape()) : nullptr;
  if (dy.elements() == 0 || x.elements() == 0 || wt.elements() == 0) {
    if (dx) ctx.backend().fill_zero_bytes(*dx);
    if (dw) ctx.backend().fill_zero_bytes(*dw);
    return;
  }
  const bool border = s.g.padding.needs_border();
  const int64_t bordered_bytes = border ? aligned(product(s.g.x_bordered) * dtype_size(x.dtype())) : 0;
  // Scratch: [bordered X (for dW)][bordered dX][workspace].
  const int64_t xb_bytes = want_dw ? bordered_bytes : 0, dxb_bytes = want_dx ? bordered_bytes : 0;
  cudnnHandle_t h = s.backend.cudnn();
  ConvAlgoChoice data_choice, filter_choice;
  if (dx) {
    data_choice = algo_cache().get(s.key(ConvDirection::kBackwardData), [&](const ConvAlgoKey& k) {
      auto* scratch = static_cast<std::byte*>(s.backend.scratch(xb_bytes + dxb_bytes + kFindWorkspaceBytes));
      void* dxp = border ? scratch + xb_bytes : dx->raw();
      int count = 0, returned = 0;
      APART_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(count));
      APART_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, s.w.d, wt.raw(), s.y.d, dy.raw(), s.conv.d, s.x.d,
                                                                    dxp, count, &returned, perf.data(),
                                                                    scratch + xb_bytes + dxb_bytes, kFindWorkspaceBytes));
      return s.choose(k, perf.data(), returned);
    });
  }
  if (dw) {
    filter_choice = algo_cache().get(s.key(ConvDirection::kBackwardFilter), [&](const ConvAlgoKey& k) {
      auto* scratch = static_cast<std::byte*>(s.backend.scratch(xb_bytes + dxb_bytes + kFindWorkspaceBytes));
      const void* xp = border ? scratch : x.raw();
      int count = 0, returned = 0;
      APART_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(count));
      APART_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, s.x.d, xp, s.y.d, dy.raw(), s.conv.d, s.w.d,
                                                                      dw->raw(), count, &returned, perf.data(),
                                                                      scratch + xb_bytes + dxb_bytes,
                                                                      kFindWorkspaceBytes));
      return s.choose(k, perf.data(), returned);
    });
  }
  const int64_t workspace = std::max<int64_t>({data_choice.workspace_bytes, filter_choice.workspace_bytes, 1});
  auto* scratch = static_cast<std::byte*>(s.backend.scratch(xb_bytes + dxb_bytes + workspace));
  std::byte* ws = scratch + xb_bytes + dxb_bytes;
  const Blend blend(s.type);
  if (dx) {
    s.use(data_choice);
    void* dxp = border ? scratch + xb_bytes : dx->raw();
    APART_CUDNN_CHECK(cudnnConvolutionBackwardData(h, blend.one(), s.w.d, wt.raw(), s.y.d, dy.raw(), s.conv.d,
                                                   static_cast<cudnnConvolutionBwdDataAlgo_t>(data_choice.algo), ws,
                                                   static_cast<size_t>(data_choice.workspace_bytes), blend.zero(),
                                                   s.x.d, dxp));
    if (border) copy_border(border_of(s.g, false), x.dtype(), dxp, dx->raw(), s.backend.compute_stream());
  }
  if (dw) {
    if (border) copy_border(border_of(s.g, true), x.dtype(), x.raw(), scratch, s.backend.compute_stream());
    s.use(filter_choice);
    APART_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, blend.one(), s.x.d, border ? scratch : x.raw(), s.y.d,
                                                     dy.raw(), s.conv.d,
                                                     static_cast<cudnnConvolutionBwdFilterAlgo_t>(filter_choice.algo),
                                                     ws, static_cast<size_t>(filter_choice.workspace_bytes),
                                                     blend.zero(), s.w.d, dw->raw()));
  }
}

// --- Pools -----------------------------------------------------------------------------------------------------

// The PoolShape of x (rank 3..5) and a window; `out` the output's spatial dims.
PoolShape pool_shape(const Tensor& x, const Window& w, const std::vector<int64_t>& out) {
  PoolShape s;
  s.planes = x.dim(0) * x.dim(1);
  const size_t rank = static_cast<size_t>(x.rank()) - 2;
  for (size_t i = 0; i < rank; ++i) {
    const size_t d = 3 - rank + i;
    s.in[d] = x.dim(static_cast<int64_t>(i) + 2);
    s.out[d] = out[i];
    s.kernel[d] = w.kernel[i];
    s.stride[d] = w.stride[i];
    s.dilation[d] = w.dilation[i];
    s.pad_begin[d] = w.pad_begin[i];
    s.pad_end[d] = w.pad_end[i];
  }
  return s;
}

void pool_k(KernelContext& ctx, bool is_max) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 3) ctx.invalid("input must have spatial dims");
  if (x.rank() > 5) ctx.unsupported("pools over " + std::to_string(x.rank() - 2) + " spatial dims on the GPU (1-D to 3-D)");
  if (is_max && ctx.num_outputs() > 1 && ctx.wants_output(1)) ctx.unsupported("MaxPool's Indices output");
  const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
  const bool ceil_mode = ctx.attr_int("ceil_mode", 0) != 0;
  const bool include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  const Window w = conv_window(ctx, in, ctx.attr_ints("kernel_shape"), ceil_mode);
  std::vector<int64_t> out_shape{x.dim(0), x.dim(1)};
  out_shape.insert(out_shape.end(), w.out.begin(), w.out.end());
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    launch_pool_forward<T>(pool_shape(x, w, w.out), is_max, include_pad, x.data<T>(), y.data<T>(),
                           backend_of(ctx).compute_stream());
  });
}
void max_pool_k(KernelContext& c) {
  if (c.attr_int("storage_order", 0) != 0) c.unsupported("storage_order=1");
  pool_k(c, true);
}
void average_pool_k(KernelContext& c) { pool_k(c, false); }

// MaxPoolGrad / AveragePoolGrad(dY, X) -> dX: explicit pads, 1-D/2-D as the CPU kernels; dY's dims are the windows.
template <bool kMax>
void pool_grad_k(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  if (x.rank() != 3 && x.rank() != 4) ctx.unsupported("pool gradients over rank " + std::to_string(x.rank()));
  if (dy.rank() != x.rank() || dy.dim(0) != x.dim(0) || dy.dim(1) != x.dim(1) || dy.dtype() != x.dtype())
    ctx.invalid("dY " + shape_string(dy.shape()) + " does not match X " + shape_string(x.shape()));
  const size_t rank = static_cast<size_t>(x.rank()) - 2;
  const auto kernel = ctx.attr_ints("kernel_shape");
  if (kernel.size() != rank) ctx.invalid("kernel_shape does not match the spatial rank");
  Window w;
  w.kernel = kernel;
  w.stride = ctx.attr_ints("strides", std::vector<int64_t>(rank, 1));
  w.dilation = ctx.attr_ints("dilations", std::vector<int64_t>(rank, 1));
  const auto pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * rank, 0));
  if (w.stride.size() != rank || w.dilation.size() != rank || pads.size() != 2 * rank)
    ctx.invalid("strides/dilations/pads do not match the spatial rank");
  for (size_t i = 0; i < rank; ++i)
    if (w.stride[i] <= 0 || w.dilation[i] <= 0) ctx.invalid("strides and dilations must be positive");
  // The CPU gradient counts the included pads with the begin pads on both sides (docs/autodiff.md).
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<int64_t>(rank));
  w.pad_end = w.pad_begin;
  const std::vector<int64_t> out(dy.shape().begin() + 2, dy.shape().end());
  const PoolShape s = pool_shape(x, w, out);
  const bool include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& dx = ctx.output(0, x.dtype(), x.shape());
    CudaBackend& b = backend_of(ctx);
    if constexpr (kMax) {
      if (s.in_size() > INT32_MAX) ctx.unsupported("MaxPoolGrad over planes of 2^31 elements or more");
      auto* argmax = static_cast<int32_t*>(b.scratch(std::max<int64_t>(1, s.planes * s.out_size()) * 4));
      launch_max_pool_grad<T>(s, dy.data<T>(), x.data<T>(), argmax, dx.data<T>(), b.compute_stream());
    } else {
      launch_average_pool_grad<T>(s, include_pad, dy.data<T>(), dx.data<T>(), b.compute_stream());
    }
  });
}

void global_pool_k(KernelContext& ctx, bool is_max) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) ctx.invalid("input must have rank >= 2");
  std::vector<int64_t> shape(static_cast<size_t>(x.rank()), 1);
  shape[0] = x.dim(0);
  shape[1] = x.dim(1);
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Tensor& y = ctx.output(0, x.dtype(), shape);
    launch_global_pool<T>(x.dim(0) * x.dim(1), product(x.shape(), 2), is_max, x.data<T>(), y.data<T>(),
                          backend_of(ctx).compute_stream());
  });
}
void global_average_pool_k(KernelContext& c) { global_pool_k(c, false); }
void global_max_pool_k(KernelContext& c) { global_pool_k(c, true); }

// --- BatchNormalization ----------------------------------------------------------------------------------------

void batch_norm_k(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const BatchNormArgs args = batch_norm_args(ctx);
  const bool training = args.training;
  const double eps = args.epsilon, momentum = args.momentum;
  dispatch_float(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    BatchNormShape s;
    s.n = x.rank() > 0 ? x.dim(0) : 1;
    s.channels = x.rank() > 1 ? x.dim(1) : 1;
    s.inner = product(x.shape(), 2);
    for (size_t i = 1; i < 5; ++i)
      if (ctx.input(i).elements() != s.channels || ctx.input(i).dtype() != x.dtype())
        ctx.invalid("scale/B/mean/var must have C elements of X's dtype");
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    T* running[2] = {nullptr, nullptr};
    if (training)
      for (size_t k = 1; k <= 2; ++k)
        if (ctx.num_outputs() > k && ctx.wants_output(k)) running[k - 1] = ctx.output(k, x.dtype(), {s.channels}).template data<T>();
    CudaBackend& b = backend_of(ctx);
    s.blocks_per_channel = batch_norm_blocks_per_channel(s.channels, s.n * s.inner, b.properties().multiProcessorCount);
    void* scratch = b.scratch(std::max<int64_t>(1, batch_norm_scratch_bytes(s)));
    launch_batch_norm<T>(s, training, eps, momentum, x.data<T>(), ctx.input(1).template data<T>(),
                         ctx.input(2).template data<T>(), ctx.input(3).template data<T>(),
                         ctx.input(4).template data<T>(), y.data<T>(), running[0], running[1], scratch,
                         b.compute_stream());
  });
}

}  // namespace

void register_conv_kernels() {
  register_cuda_kernel("Conv", conv_k);
  register_cuda_kernel("ai.apart.ConvGrad", conv_grad_k);
  register_cuda_kernel("MaxPool", max_pool_k);
  register_cuda_kernel("AveragePool", average_pool_k);
  register_cuda_kernel("ai.apart.MaxPoolGrad", pool_grad_k<true>);
  register_cuda_kernel("ai.apart.AveragePoolGrad", pool_grad_k<false>);
  register_cuda_kernel("GlobalAveragePool", global_average_pool_k);
  register_cuda_kernel("GlobalMaxPool", global_max_pool_k);
  register_cuda_kernel("BatchNormalization", batch_norm_k);
}

}  // namespace apart::cuda
