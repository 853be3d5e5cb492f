// ResNet-50/101/152 (torchvision Bottleneck layout) with a channel multiplier, in training form (BatchNormalization
// kept, not folded into Conv as an eval-mode export would).
#include <cmath>
#include <string>
#include <vector>

#include "models/graph_builder.h"

namespace apart::models {
namespace {

std::string conv(GraphBuilder& b, const std::string& module, const std::string& x, int64_t cin, int64_t cout,
                 int64_t k, int64_t stride, int64_t pad) {
  auto s = b.scope(module);
  // torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu").
  const double std_dev = std::sqrt(2.0 / static_cast<double>(cout * k * k));
  const std::string w = b.param("weight", {cout, cin, k, k}, Init::normal(std_dev));
  return b.node("Conv", {x, w},
                {attr_ints("dilations", {1, 1}), attr_int("group", 1), attr_ints("kernel_shape", {k, k}),
                 attr_ints("pads", {pad, pad, pad, pad}), attr_ints("strides", {stride, stride})});
}

std::string batch_norm(GraphBuilder& b, const std::string& module, const std::string& x, int64_t c) {
  auto s = b.scope(module);
  const std::string scale = b.param("weight", {c}, Init::ones());
  const std::string bias = b.param("bias", {c}, Init::zeros());
  // running_mean / running_var are buffers, not parameters: Constant nodes, so initializers stay = parameters.
  const std::string mean = b.float_tensor({c}, std::vector<float>(static_cast<size_t>(c), 0.0f));
  const std::string var = b.float_tensor({c}, std::vector<float>(static_cast<size_t>(c), 1.0f));
  return b.node("BatchNormalization", {x, scale, bias, mean, var},
                {attr_float("epsilon", 1e-5f), attr_float("momentum", 0.9f)});
}

std::string relu(GraphBuilder& b, const std::string& module, const std::string& x) {
  auto s = b.scope(module);
  return b.node("Relu", {x});
}

}  // namespace

std::vector<int64_t> resnet_blocks(int64_t depth);  // presets.cpp

void build_resnet(GraphBuilder& b, const ZooOptions& o) {
  const int64_t w = o.width;
  b.input("input", b.float_elem(), {-1, 3, o.image, o.image});
  std::string x = conv(b, "conv1", "input", 3, 64 * w, 7, 2, 3);
  x = relu(b, "relu", batch_norm(b, "bn1", x, 64 * w));
  {
    auto s = b.scope("maxpool");
    x = b.node("MaxPool", {x}, {attr_int("ceil_mode", 0), attr_ints("kernel_shape", {3, 3}),
                                attr_ints("pads", {1, 1, 1, 1}), attr_ints("strides", {2, 2})});
  }
  const std::vector<int64_t> blocks = resnet_blocks(o.layers);
  int64_t inplanes = 64 * w;
  for (size_t stage = 0; stage < blocks.size(); ++stage) {
    const int64_t planes = (64 << stage) * w;
    for (int64_t i = 0; i < blocks[stage]; ++i) {
      auto block = b.scope("layer" + std::to_string(stage + 1) + "." + std::to_string(i));
      const int64_t stride = (i == 0 && stage > 0) ? 2 : 1;
      std::string h = relu(b, "relu", batch_norm(b, "bn1", conv(b, "conv1", x, inplanes, planes, 1, 1, 0), planes));
      h = relu(b, "relu_1", batch_norm(b, "bn2", conv(b, "conv2", h, planes, planes, 3, stride, 1), planes));
      h = batch_norm(b, "bn3", conv(b, "conv3", h, planes, 4 * planes, 1, 1, 0), 4 * planes);
      std::string identity = x;
      if (i == 0) {
        auto ds = b.scope("downsample");
        identity = batch_norm(b, "1", conv(b, "0", x, inplanes, 4 * planes, 1, stride, 0), 4 * planes);
      }
      x = relu(b, "relu_2", b.node("Add", {h, identity}));
      inplanes = 4 * planes;
    }
  }
  {
    auto s = b.scope("avgpool");
    x = b.node("GlobalAveragePool", {x});
  }
  x = b.node("Flatten", {x}, {attr_int("axis", 1)});
  {
    // nn.Linear as Gemm(transB=1) with the torch [out, in] weight; default uniform(+-1/sqrt(fan_in)) init.
    auto s = b.scope("fc");
    const Init bound = Init::uniform(1.0 / std::sqrt(static_cast<double>(inplanes)));
    const std::string weight = b.param("weight", {o.classes, inplanes}, bound);
    const std::string bias = b.param("bias", {o.classes}, bound);
    x = b.node("Gemm", {x, weight, bias}, {attr_float("alpha", 1.0f), attr_float("beta", 1.0f), attr_int("transB", 1)});
  }
  finish_with_loss(b, o, x, "output", {-1, o.classes}, o.classes);
}

}  // namespace apart::models
