// The CPU kernel families, one file each; kernel.cpp registers them on first lookup.
#pragma once

namespace apart::cpu {
void register_elementwise_kernels();  // elementwise.cpp: unary (Gelu too), binary (broadcasting), Where, Clip, Cast, logic
void register_matmul_kernels();       // matmul.cpp: MatMul, Gemm over cblas
void register_reduce_kernels();       // reduce.cpp: Reduce*, ArgMax/ArgMin, Softmax, LogSoftmax, LayerNormalization
void register_shape_kernels();        // shape.cpp: Reshape, Transpose, Concat, Split, Slice, Pad, Gather, Expand, …
void register_resize_kernels();       // resize.cpp: Resize, Upsample, ai.apart.ResizeGrad
void register_conv_kernels();         // conv.cpp: Conv, pools, BatchNormalization
void register_loss_kernels();         // loss.cpp: SoftmaxCrossEntropyLoss
void register_grad_kernels();        // grad.cpp: ScatterND, ai.apart.ConvGrad/MaxPoolGrad/AveragePoolGrad
void register_transformer_kernels();      // transformer.cpp: RMSNormalization, RotaryEmbedding, RotaryEmbeddingGrad
void register_attention_kernels();        // attention.cpp: Attention (and ai.apart.Attention), ai.apart.AttentionGrad
void register_norm_grad_kernels();        // norm_grad.cpp: ai.apart.LayerNormalizationGrad, RMSNormalizationGrad
void register_tensor_parallel_kernels();  // tensor_parallel.cpp: ai.apart.Tp* collectives over the TP group
}  // namespace apart::cpu
