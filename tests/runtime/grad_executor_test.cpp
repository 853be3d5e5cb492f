// The executor over an in-memory ModelProto (what `apart train` runs training graphs with).
#include <gtest/gtest.h>

#include "graph/error.h"
#include "runtime/executor.h"
#include "tests/runtime/compare.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::Io;
using testing::OnnxBuilder;

TEST(AnInMemoryExecutor, RunsAModelProtoWithInlineInitializers) {
  OnnxBuilder b;
  Tensor w(DType::kFloat32, {2, 3});
  for (int64_t i = 0; i < 6; ++i) w.data<float>()[i] = static_cast<float>(i + 1);
  b.input({"x", DType::kFloat32, {1, 2}}).output({"y", DType::kFloat32, {1, 3}}).initializer(w, "w");
  b.node("MatMul", {"x", "w"}, {"y"});
  Executor exec(b.model(), std::filesystem::temp_directory_path());
  Tensor x(DType::kFloat32, {1, 2});
  x.data<float>()[0] = 1;
  x.data<float>()[1] = 2;
  auto out = exec.run({{"x", x}});
  ASSERT_EQ(out.size(), 1u);
  Tensor want(DType::kFloat32, {1, 3});
  want.data<float>()[0] = 9, want.data<float>()[1] = 12, want.data<float>()[2] = 15;
  EXPECT_EQ(testing::compare_tensors(out[0].second, want), "");
  ASSERT_NE(exec.param("w"), nullptr);
  EXPECT_EQ(exec.model().graph.num_tasks(), 1u);
}

TEST(AnInMemoryExecutor, BindsDimsThroughImportOptions) {
  OnnxBuilder b;
  auto* in = b.model().mutable_graph()->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(static_cast<int32_t>(DType::kFloat32));
  in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_param("batch");
  b.output({"y", DType::kFloat32, {}});
  b.node("Relu", {"x"}, {"y"});
  ImportOptions import;
  import.dims["batch"] = 4;
  Executor exec(b.model(), {}, {}, import);
  Tensor x(DType::kFloat32, {4});
  x.data<float>()[0] = -1, x.data<float>()[1] = 2, x.data<float>()[2] = -3, x.data<float>()[3] = 4;
  auto out = exec.run({{"x", x}});
  EXPECT_EQ(out[0].second.data<float>()[1], 2.f);
  EXPECT_EQ(out[0].second.data<float>()[2], 0.f);
}

TEST(AnInMemoryExecutor, RefusesAnOpWithoutAKernel) {
  OnnxBuilder b;
  b.input({"x", DType::kFloat32, {2}}).output({"y", DType::kFloat32, {2}});
  auto& n = b.node("NoSuchGrad", {"x"}, {"y"});
  n.set_domain("ai.apart");
  auto* op = b.model().add_opset_import();
  op->set_domain("ai.apart");
  op->set_version(1);
  EXPECT_THROW(Executor(b.model(), {}), Unsupported);
}

}  // namespace
}  // namespace apart
