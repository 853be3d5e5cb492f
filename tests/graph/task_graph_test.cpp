// Tests of the TaskGraph IR: ids, topological numbering, CSR adjacency, classification, errors.
#include "graph/task_graph.h"

#include <gtest/gtest.h>

#include "graph/error.h"

namespace apart {
namespace {

ValueId add(TaskGraph& g, const std::string& name, ValueKind kind, std::vector<int64_t> shape = {2, 3}) {
  Value v;
  v.name = name;
  v.kind = kind;
  v.dtype = DType::kFloat32;
  v.shape = std::move(shape);
  v.shape_known = true;
  v.elements = *checked_element_count(v.shape);
  v.bytes = v.elements * 4;
  return g.add_value(std::move(v));
}

TaskId task(TaskGraph& g, const std::string& name, const std::string& op, std::vector<ValueId> in, std::vector<ValueId> out) {
  Task t;
  t.name = name;
  t.op_type = op;
  t.inputs = std::move(in);
  t.outputs = std::move(out);
  t.onnx_node_index = static_cast<int32_t>(g.num_tasks());
  return g.add_task(std::move(t));
}

// x → A → a → B → b ; w (param) → C → c (constant) ; B also reads c.
struct Diamond {
  TaskGraph g;
  Diamond() {
    ValueId x = add(g, "x", ValueKind::kInput);
    ValueId w = add(g, "w", ValueKind::kParam);
    ValueId a = add(g, "a", ValueKind::kActivation);
    ValueId b = add(g, "b", ValueKind::kOutput);
    ValueId c = add(g, "c", ValueKind::kActivation);
    g.mark_graph_input(x);
    g.mark_graph_output(b);
    task(g, "B", "Add", {a, c}, {b});  // deliberately listed before its producers
    task(g, "A", "Relu", {x}, {a});
    task(g, "C", "Neg", {w}, {c});
  }
};

TEST(ATaskGraph, NumbersTasksInATopologicalOrder) {
  Diamond d;
  d.g.finalize();
  ASSERT_EQ(d.g.num_tasks(), 3u);
  for (size_t i = 0; i < d.g.num_tasks(); ++i)
    for (TaskId p : d.g.predecessors(TaskId(static_cast<uint32_t>(i)))) EXPECT_LT(p.value(), i);
  EXPECT_EQ(d.g.task(TaskId(2)).name, "B");
}

TEST(ATaskGraph, KeepsOnnxNodeOrderWhenItIsAlreadyTopological) {
  TaskGraph g;
  ValueId x = add(g, "x", ValueKind::kInput);
  ValueId a = add(g, "a", ValueKind::kActivation);
  ValueId b = add(g, "b", ValueKind::kActivation);
  task(g, "first", "Relu", {x}, {a});
  task(g, "second", "Relu", {x}, {b});
  g.finalize();
  EXPECT_EQ(g.task(TaskId(0)).name, "first");
  EXPECT_EQ(g.task(TaskId(1)).name, "second");
}

TEST(ATaskGraph, BuildsConsumerAndNeighbourListsAsCsr) {
  Diamond d;
  d.g.finalize();
  const TaskId b = *d.g.find_task("B");
  EXPECT_EQ(d.g.predecessors(b).size(), 2u);
  EXPECT_EQ(d.g.successors(*d.g.find_task("A")).size(), 1u);
  EXPECT_EQ(d.g.consumers(*d.g.find_value("x")).size(), 1u);
  EXPECT_EQ(d.g.consumers(*d.g.find_value("b")).size(), 0u);
  EXPECT_EQ(d.g.value(*d.g.find_value("a")).producer, *d.g.find_task("A"));
  EXPECT_FALSE(d.g.value(*d.g.find_value("x")).producer.valid());
}

TEST(ATaskGraph, ClassifiesTasksReadingOnlyParamsAsConstant) {
  Diamond d;
  d.g.finalize();
  d.g.classify_constants();
  EXPECT_TRUE(d.g.task(*d.g.find_task("C")).constant);
  EXPECT_FALSE(d.g.task(*d.g.find_task("A")).constant);
  EXPECT_FALSE(d.g.task(*d.g.find_task("B")).constant);
  EXPECT_EQ(d.g.value(*d.g.find_value("c")).kind, ValueKind::kConstant);
  EXPECT_EQ(d.g.num_constant_tasks(), 1u);
  EXPECT_EQ(d.g.num_batch_tasks(), 2u);
}

TEST(ATaskGraph, ClassifiesTasksWhoseOutputsAreFoldedAsConstant) {
  TaskGraph g;
  ValueId x = add(g, "x", ValueKind::kInput);
  ValueId s = add(g, "s", ValueKind::kActivation, {2});
  task(g, "shape", "Shape", {x}, {s});
  g.finalize();
  g.value(s).known_ints = std::vector<int64_t>{2, 3};
  g.classify_constants();
  EXPECT_TRUE(g.task(TaskId(0)).constant);
}

TEST(ATaskGraph, NeverClassifiesRandomGeneratorsAsConstant) {
  TaskGraph g;
  ValueId r = add(g, "r", ValueKind::kActivation);
  task(g, "rng", "RandomNormal", {}, {r});
  g.finalize();
  g.classify_constants();
  EXPECT_FALSE(g.task(TaskId(0)).constant);
}

TEST(ATaskGraph, RejectsACycleNamingANodeOnIt) {
  TaskGraph g;
  ValueId a = add(g, "a", ValueKind::kActivation);
  ValueId b = add(g, "b", ValueKind::kActivation);
  task(g, "P", "Relu", {b}, {a});
  task(g, "Q", "Relu", {a}, {b});
  try {
    g.finalize();
    FAIL() << "a cycle was accepted";
  } catch (const InvalidModel& e) {
    EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'P"), std::string::npos);
  }
}

TEST(ATaskGraph, RejectsTwoProducersOfOneValue) {
  TaskGraph g;
  ValueId x = add(g, "x", ValueKind::kInput);
  ValueId a = add(g, "a", ValueKind::kActivation);
  task(g, "P", "Relu", {x}, {a});
  task(g, "Q", "Neg", {x}, {a});
  EXPECT_THROW(g.finalize(), InvalidModel);
}

TEST(ATaskGraph, RejectsAnInputThatNothingProduces) {
  TaskGraph g;
  ValueId ghost = add(g, "ghost", ValueKind::kActivation);
  ValueId a = add(g, "a", ValueKind::kActivation);
  task(g, "P", "Relu", {ghost}, {a});
  EXPECT_THROW(g.finalize(), InvalidModel);
}

TEST(ATaskGraph, GivesRepeatedNodeNamesNumberedSuffixes) {
  TaskGraph g;
  ValueId x = add(g, "x", ValueKind::kInput);
  ValueId a = add(g, "a", ValueKind::kActivation);
  ValueId b = add(g, "b", ValueKind::kActivation);
  ValueId c = add(g, "c", ValueKind::kActivation);
  task(g, "relu", "Relu", {x}, {a});
  task(g, "relu", "Relu", {a}, {b});
  task(g, "relu", "Relu", {b}, {c});
  g.finalize();
  EXPECT_TRUE(g.find_task("relu").has_value());
  EXPECT_TRUE(g.find_task("relu#2").has_value());
  EXPECT_TRUE(g.find_task("relu#3").has_value());
}

TEST(ACheckedElementCount, DetectsOverflowAndNegativeDims) {
  const std::vector<int64_t> huge{int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_FALSE(checked_element_count(huge).has_value());
  const std::vector<int64_t> negative{2, -1};
  EXPECT_FALSE(checked_element_count(negative).has_value());
  const std::vector<int64_t> fine{8, 3, 224, 224};
  EXPECT_EQ(checked_element_count(fine).value(), 8 * 3 * 224 * 224);
  EXPECT_EQ(checked_element_count(std::vector<int64_t>{}).value(), 1);
}

TEST(AStrongId, IsInvalidByDefaultAndComparesByValue) {
  TaskId t;
  EXPECT_FALSE(t.valid());
  EXPECT_LT(TaskId(1), TaskId(2));
  EXPECT_EQ(ValueId(3), ValueId(3));
}

TEST(ErrorKinds, MapToDistinctDocumentedExitCodes) {
  EXPECT_EQ(exit_code(ErrorKind::kInvalidArgument), 2);
  EXPECT_EQ(exit_code(ErrorKind::kInvalidModel), 3);
  EXPECT_EQ(exit_code(ErrorKind::kUnsupported), 4);
  EXPECT_EQ(exit_code(ErrorKind::kInfeasible), 5);
  EXPECT_EQ(exit_code(ErrorKind::kSystemError), 6);
  EXPECT_EQ(exit_code(ErrorKind::kInternal), 70);
}

}  // namespace
}  // namespace apart
