// LayerNormalization and RMSNormalization train as one kernel each way (runtime/cpu/norm_grad.cpp): their training
// graphs hold one ai.apart.<op>Grad per norm, the kernel program lists it as one kernel priced as the planner prices
// the norm's backward, and loss and gradients equal those of the same norm written as primitive ops (the decomposed
// graph autodiff differentiates op by op): forward within 1e-5 relative, gradients within 1e-4 of their largest
// entry, float32, odd sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "codegen/autodiff.h"
#include "codegen/kernel_program.h"
#include "importer/importer.h"
#include "profiler/cost_model.h"
#include "runtime/executor.h"
#include "tests/codegen/finite_differences.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using namespace apart::testing;

enum class Norm { kLayer, kRms };

// loss = ReduceSum(norm(x) · R) over x [3, 5, 7] normalised over its last `axes` axes, x, scale, bias params; the
// norm as its ONNX op (`fused`) or as primitives (ReduceMean, Sub, Mul, Add, Sqrt, Div / Reciprocal).
// `batch`: x = x0 · w for a graph input x0 and a param w [7] instead (what the planner prices: a norm of batch data).
onnx::ModelProto norm_model(Norm norm, bool fused, int axes, bool batch = false) {
  std::mt19937 rng(7);
  const std::vector<int64_t> xs{3, 5, 7};
  const std::vector<int64_t> ns(xs.end() - axes, xs.end());
  OnnxBuilder b(norm == Norm::kRms ? 23 : 17);
  if (batch) {
    b.input({"x0", DType::kFloat32, xs});
    b.initializer(random_tensor(DType::kFloat32, {7}, rng, -2, 2), "w");
    b.node("Mul", {"x0", "w"}, {"x"});
  } else {
    b.initializer(random_tensor(DType::kFloat32, xs, rng, -2, 2), "x");
  }
  b.initializer(random_tensor(DType::kFloat32, ns, rng, 0.5, 1.5), "scale");
  b.initializer(random_tensor(DType::kFloat32, ns, rng, -0.5, 0.5), "bias");
  b.initializer(random_tensor(DType::kFloat32, xs, rng), "r");
  b.initializer(random_tensor(DType::kFloat32, {}, rng, 1e-3, 1e-3), "eps");
  std::vector<int64_t> axis_list;
  for (int a = 0; a < axes; ++a) axis_list.push_back(-1 - a);
  std::sort(axis_list.begin(), axis_list.end());
  if (norm == Norm::kRms) b.int_initializer("axes", axis_list);  // opset 18+: an input
  auto mean = [&](const std::string& in, const std::string& out) {
    if (norm == Norm::kRms)
      b.node("ReduceMean", {in, "axes"}, {out});
    else
      OnnxBuilder::set_ints(b.node("ReduceMean", {in}, {out}), "axes", axis_list);
  };
  if (fused) {
    auto& n = b.node(
        norm == Norm::kLayer ? "LayerNormalization" : "RMSNormalization",
        norm == Norm::kLayer ? std::vector<std::string>{"x", "scale", "bias"} : std::vector<std::string>{"x", "scale"},
        {"y"});
    OnnxBuilder::set_int(n, "axis", -axes);
    auto* eps = n.add_attribute();
    eps->set_name("epsilon"), eps->set_type(onnx::AttributeProto::FLOAT), eps->set_f(1e-3f);
  } else if (norm == Norm::kLayer) {
    mean("x", "mu");
    b.node("Sub", {"x", "mu"}, {"c"});
    b.node("Mul", {"c", "c"}, {"c2"});
    mean("c2", "var");
    b.node("Add", {"var", "eps"}, {"ve"});
    b.node("Sqrt", {"ve"}, {"sd"});
    b.node("Div", {"c", "sd"}, {"xhat"});
    b.node("Mul", {"xhat", "scale"}, {"ys"});
    b.node("Add", {"ys", "bias"}, {"y"});
  } else {
    b.node("Mul", {"x", "x"}, {"x2"});
    mean("x2", "ms");
    b.node("Add", {"ms", "eps"}, {"me"});
    b.node("Sqrt", {"me"}, {"rms"});
    b.node("Reciprocal", {"rms"}, {"inv"});
    b.node("Mul", {"x", "inv"}, {"xhat"});
    b.node("Mul", {"xhat", "scale"}, {"y"});
  }
  b.node("Mul", {"y", "r"}, {"yr"});
  OnnxBuilder::set_int(b.node("ReduceSum", {"yr"}, {"loss"}), "keepdims", 0);
  b.output({"loss", DType::kFloat32, {}});
  return b.model();
}

TrainingGraph training(const onnx::ModelProto& m, Norm norm, bool batch = false) {
  TrainingGraphOptions options;
  options.params = {batch ? "w" : "x", "scale"};
  if (norm == Norm::kLayer) options.params.push_back("bias");
  return build_training_graph(m, options);
}

std::map<std::string, Tensor> run(const TrainingGraph& tg) {
  Executor exec(tg.model, {});
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : exec.run({})) out[name] = t;
  return out;
}

int count_nodes(const onnx::ModelProto& m, const std::string& op) {
  return static_cast<int>(std::count_if(m.graph().node().begin(), m.graph().node().end(),
                                        [&](const onnx::NodeProto& n) { return n.op_type() == op; }));
}

void expect_as_decomposed(Norm norm, int axes) {
  SCOPED_TRACE(std::string(norm == Norm::kLayer ? "LayerNorm" : "RMSNorm") + " over " + std::to_string(axes) + " axes");
  const TrainingGraph fused = training(norm_model(norm, true, axes), norm);
  const TrainingGraph plain = training(norm_model(norm, false, axes), norm);
  const std::string grad_op = norm == Norm::kLayer ? "LayerNormalizationGrad" : "RMSNormalizationGrad";
  EXPECT_EQ(count_nodes(fused.model, grad_op), 1);
  EXPECT_EQ(count_nodes(fused.model, "ReduceSum"), 1);  // the loss's: the norm's backward reduces inside its kernel
  auto a = run(fused), b = run(plain);
  const double la = get(a.at(fused.loss_output), 0), lb = get(b.at(plain.loss_output), 0);
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(lb));
  ASSERT_EQ(fused.gradients, plain.gradients);
  expect_same_gradients(plain.gradients, a, b, 1e-4);
}

TEST(AFusedLayerNorm, TrainsAsItsDecomposedGraphOverOneAndTwoAxes) {
  expect_as_decomposed(Norm::kLayer, 1);
  expect_as_decomposed(Norm::kLayer, 2);
}

TEST(AFusedRmsNorm, TrainsAsItsDecomposedGraphOverOneAndTwoAxes) {
  expect_as_decomposed(Norm::kRms, 1);
  expect_as_decomposed(Norm::kRms, 2);
}

// The training graph's program lists each norm's backward as one kernel, with the FLOPs and bytes the planner's
// backward rule gives the norm on the forward graph (float32; LayerNorm's saved statistics included).
TEST(AFusedNorm, IsOneKernelEachWayInTheProgramPricedAsThePlannerPricesIt) {
  for (Norm norm : {Norm::kLayer, Norm::kRms}) {
    const onnx::ModelProto forward = norm_model(norm, true, 1, true);
    const TrainingGraph tg = training(forward, norm, true);
    ImportOptions as_given;
    as_given.constants_as_params = false;
    const ImportedModel step = import_model_bytes(tg.model.SerializeAsString(), {}, "step", as_given);
    const KernelProgram p = lower_to_kernels(step.graph, {});
    const std::string grad_op =
        norm == Norm::kLayer ? "ai.apart.LayerNormalizationGrad" : "ai.apart.RMSNormalizationGrad";
    int kernels = 0;
    double flops = 0, bytes = 0;
    for (const ProgramKernel& k : p.kernels)
      if (k.name == grad_op) ++kernels, flops += k.flops, bytes += k.bytes_read + k.bytes_written;
    EXPECT_EQ(kernels, 1);
    const ImportedModel fw = import_model_bytes(forward.SerializeAsString(), {}, "forward", {});
    const CostTable table = estimate_costs(fw.graph, device_preset("cpu"));
    int norms = 0;
    for (uint32_t i = 0; i < fw.graph.num_tasks(); ++i) {
      const std::string& op = fw.graph.task(TaskId(i)).op_type;
      if (op != "LayerNormalization" && op != "RMSNormalization") continue;
      ++norms;
      EXPECT_DOUBLE_EQ(table.tasks[i].backward_flops, flops) << op;
      EXPECT_DOUBLE_EQ(table.tasks[i].backward_bytes, bytes) << op;
      EXPECT_EQ(table.tasks[i].launches, 2) << op;  // one kernel forward, one backward
    }
    EXPECT_EQ(norms, 1);
  }
}

}  // namespace
}  // namespace apart
