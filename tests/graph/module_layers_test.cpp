// graph/module_layers.h: layers read from module paths, as torch.onnx.export names nodes.
#include "graph/module_layers.h"

#include <gtest/gtest.h>

namespace apart {
namespace {

TEST(ALayerOfAPath, IsThePathUpToItsFirstIndexedModule) {
  EXPECT_EQ(layer_of_path("/h.3/attn/qkv/MatMul"), "h.3");
  EXPECT_EQ(layer_of_path("/model/layers.12/mlp/fc1/MatMul"), "model/layers.12");
  EXPECT_EQ(layer_of_path("/layers/2/MatMul"), "layers/2");
  EXPECT_EQ(layer_of_path("/wte/Gather"), "wte");
  EXPECT_EQ(layer_of_path("/Constant"), "");
  EXPECT_EQ(layer_of_path("MatMul_7"), "");
  EXPECT_EQ(module_fqn("model/layers.12"), "model.layers.12");
  EXPECT_EQ(module_fqn("layers/2"), "layers.2");
}

TEST(ALayerStack, PlacesEveryTaskBeforeInOrAfterTheLayers) {
  const std::vector<std::string> paths = {
      "/model/embed_tokens/Gather",  "/model/layers.0/attn/MatMul", "/Constant_3",     "/model/layers.0/mlp/MatMul",
      "/model/layers.1/attn/MatMul", "/model/layers.1/mlp/MatMul",  "/model/norm/Mul", "/lm_head/MatMul",
      "/SoftmaxCrossEntropyLoss"};
  const LayerStack stack = layer_stack(paths);
  EXPECT_EQ(stack.container, "model/layers");
  EXPECT_EQ(stack.layers, (std::vector<std::string>{"model/layers.0", "model/layers.1"}));
  // The unscoped Constant between two tasks of layer 0 belongs to layer 0; the loss after the last layer to "after".
  EXPECT_EQ(stack.position, (std::vector<int>{kBeforeLayers, 0, 0, 0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(stack.before, (std::vector<std::string>{"model/embed_tokens"}));
  EXPECT_EQ(stack.after, (std::vector<std::string>{"model/norm", "lm_head", ""}));
}

TEST(ALayerStack, OrdersLayersByTheirIndexNotByName) {
  std::vector<std::string> paths;
  for (int i = 0; i < 12; ++i) paths.push_back("/blocks." + std::to_string(i) + "/ln1/Add");
  const LayerStack stack = layer_stack(paths);
  ASSERT_EQ(stack.layers.size(), 12u);
  EXPECT_EQ(stack.layers[2], "blocks.2");  // not "blocks.10", which sorts before it as text
  EXPECT_EQ(stack.layers[11], "blocks.11");
  for (int i = 0; i < 12; ++i) EXPECT_EQ(stack.position[i], i);
}

TEST(ALayerStack, IsEmptyForAModelWithoutModuleNames) {
  const LayerStack stack = layer_stack({"MatMul_0", "Add_1", "Relu_2", "/fc/MatMul"});
  EXPECT_TRUE(stack.empty());
  EXPECT_EQ(stack.position, (std::vector<int>(4, kBeforeLayers)));
}

}  // namespace
}  // namespace apart
