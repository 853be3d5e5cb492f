// The importer's one batch-dim rule (ImportOptions::batch, kBatchDimNames) that every command binds --batch with.
#include <gtest/gtest.h>

#include "graph/error.h"
#include "importer/importer.h"
#include "tests/support/onnx_builder.h"

namespace apart {
namespace {

using testing::Dim;
using testing::OnnxBuilder;

// y = x · w with the given leading dim of x, and a second dim `seq` that is not the batch.
ImportedModel import_with(std::initializer_list<Dim> x_dims, const ImportOptions& options) {
  OnnxBuilder b;
  b.input("x", x_dims).output("y");
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"y"});
  return import_model_bytes(b.bytes(), "", "m.onnx", options);
}

ImportOptions batch(int64_t n, bool is_explicit = false) {
  ImportOptions o;
  o.batch = n;
  o.batch_explicit = is_explicit;
  return o;
}

TEST(TheBatchRule, BindsADimNamedBatch) {
  const ImportedModel m = import_with({"batch", 3}, batch(4));
  EXPECT_EQ(m.batch, 4);
  EXPECT_EQ(m.batch_dim, "batch");
  EXPECT_TRUE(m.batch_from_flag);
  EXPECT_EQ(m.bindings.at(0).source, "--batch 4");
}

TEST(TheBatchRule, PrefersANamedBatchDimOverTheLeadingOne) {
  ImportOptions o = batch(2);
  o.dims["seq"] = 5;
  const ImportedModel m = import_with({"seq", "N", 3}, o);
  EXPECT_EQ(m.batch_dim, "N");
  EXPECT_EQ(m.batch, 2);
}

TEST(TheBatchRule, FallsBackToTheFirstInputsLeadingDimNamedOrNot) {
  EXPECT_EQ(import_with({"b", 3}, batch(3)).batch, 3);
  const ImportedModel unnamed = import_with({Dim(-1), 3}, batch(6));
  EXPECT_EQ(unnamed.batch, 6);
  EXPECT_EQ(unnamed.batch_dim, "x[0]");
}

TEST(TheBatchRule, StillBindsTheBatchWhenAnotherDimIsGiven) {
  ImportOptions o = batch(1);
  o.dims["seq"] = 7;
  const ImportedModel m = import_with({"batch", "seq", 3}, o);
  EXPECT_EQ(m.batch, 1);
}

TEST(TheBatchRule, LetsDimAndShapeOverrideADefaultBatch) {
  ImportOptions o = batch(1);
  o.dims["batch"] = 8;
  EXPECT_EQ(import_with({"batch", 3}, o).batch, 8);
  EXPECT_FALSE(import_with({"batch", 3}, o).batch_from_flag);
  ImportOptions s = batch(1);
  s.input_shapes.push_back({"x", {5, 3}});
  EXPECT_EQ(import_with({"batch", 3}, s).batch, 5);
}

TEST(TheBatchRule, RefusesAnExplicitBatchThatContradictsDimShapeOrTheModel) {
  ImportOptions o = batch(4, /*is_explicit=*/true);
  o.dims["batch"] = 8;
  try {
    import_with({"batch", 3}, o);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--batch 4 and --dim batch=8 disagree"), std::string::npos) << e.what();
  }
  ImportOptions s = batch(4, true);
  s.input_shapes.push_back({"x", {5, 3}});
  EXPECT_THROW(import_with({"batch", 3}, s), InvalidArgument);
  EXPECT_THROW(import_with({2, 3}, batch(4, true)), InvalidArgument);
  EXPECT_EQ(import_with({2, 3}, batch(4)).batch, 2);  // a default gives way to the model's static batch
}

}  // namespace
}  // namespace apart
