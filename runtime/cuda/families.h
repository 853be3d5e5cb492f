// The CUDA kernel families, one file each (.cu); cuda_backend.cpp registers them on first lookup. An op without a
// CUDA kernel runs on the CPU kernel over host copies (the executor's fallback), so a family may grow op by op.
#pragma once

namespace apart::cuda {
void register_gemm_kernels();         // gemm.cu: MatMul (batched, broadcast), Gemm through cuBLASLt (bias epilogue)
void register_elementwise_kernels();  // elementwise.cu: unary, binary (broadcasting), Where, Cast, Pow, Erf, Dropout
void register_reduce_kernels();       // reduce.cu: ReduceSum/Mean/Max, Softmax, LogSoftmax, LayerNormalization
void register_shape_kernels();        // shape.cu: Reshape, Transpose, Concat, Split, Slice, Gather, Expand, ScatterND
void register_loss_kernels();         // loss.cu: SoftmaxCrossEntropyLoss (+ log_prob)
void register_conv_kernels();         // conv.cpp: Conv, ai.apart.ConvGrad, pools, BatchNormalization through cuDNN
}  // namespace apart::cuda
