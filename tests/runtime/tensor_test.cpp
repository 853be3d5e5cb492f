// Tensors: TensorProto round trips (raw and typed fields), external data, views.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>

#include "graph/error.h"
#include "runtime/tensor.h"

namespace apart {
namespace {

namespace fs = std::filesystem;

TEST(ATensor, RoundTripsThroughATensorProto) {
  Tensor t(DType::kFloat32, {2, 3});
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = 0.5f * i;
  onnx::TensorProto proto;
  tensor_to_proto(t, "x", proto);
  Tensor back = tensor_from_proto(proto);
  EXPECT_EQ(back.shape(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back.data<float>()[i], 0.5f * i);
}

TEST(ATensor, ReadsTypedFields) {
  onnx::TensorProto proto;
  proto.set_data_type(onnx::TensorProto::INT64);
  proto.add_dims(3);
  for (int64_t v : {4, -5, 6}) proto.add_int64_data(v);
  EXPECT_EQ(tensor_from_proto(proto).to_int64s(), (std::vector<int64_t>{4, -5, 6}));
  proto.add_int64_data(7);
  EXPECT_THROW(tensor_from_proto(proto), InvalidModel);
}

TEST(ATensor, ReadsExternalDataInsideTheModelFolderAndRefusesEscapes) {
  const fs::path dir = fs::temp_directory_path() / "apart_tensor_ext";
  fs::create_directories(dir);
  const float values[2] = {1.5f, -2.f};
  {
    std::ofstream out(dir / "w.bin", std::ios::binary);
    out.write("pad!", 4);
    out.write(reinterpret_cast<const char*>(values), sizeof values);
  }
  onnx::TensorProto proto;
  proto.set_name("w");
  proto.set_data_type(onnx::TensorProto::FLOAT);
  proto.add_dims(2);
  proto.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* k, const char* v) {
    auto* e = proto.add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", "w.bin");
  add("offset", "4");
  Tensor t = tensor_from_proto(proto, dir);
  EXPECT_EQ(t.data<float>()[1], -2.f);
  proto.mutable_external_data(0)->set_value("../w.bin");
  EXPECT_THROW(tensor_from_proto(proto, dir), InvalidModel);
  proto.mutable_external_data(0)->set_value("/etc/passwd");
  EXPECT_THROW(tensor_from_proto(proto, dir), InvalidModel);
  fs::remove_all(dir);
}

// Above glibc's largest mmap threshold (32 MiB) a freed block is kept and handed out again for the same size, so a
// micro-batch's 154 MB embedding gradient does not fault its pages in afresh; it comes back zeroed like a new one.
TEST(ATensor, OfMoreThan32MiBReusesAFreedBlockOfItsSizeAndStillStartsZeroed) {
  const std::vector<int64_t> shape{9 << 20};  // 36 MiB of floats
  const std::byte* first = nullptr;
  {
    Tensor t(DType::kFloat32, shape);
    first = t.raw();
    for (int64_t i = 0; i < t.elements(); i += 4096) t.data<float>()[i] = 1.0f;
    t.data<float>()[t.elements() - 1] = 2.0f;
  }
  const Tensor again(DType::kFloat32, shape);
  EXPECT_EQ(again.raw(), first);
  for (int64_t i = 0; i < again.elements(); i += 4096) ASSERT_EQ(again.data<float>()[i], 0.0f) << i;
  EXPECT_EQ(again.data<float>()[again.elements() - 1], 0.0f);
  const Tensor other(DType::kFloat32, {(9 << 20) + 1024});  // another size: a block of its own
  EXPECT_NE(other.raw(), first);
}

TEST(ATensor, ViewsShareStorage) {
  Tensor t(DType::kInt32, {2, 2});
  Tensor v = t.view({4});
  v.data<int32_t>()[3] = 9;
  EXPECT_EQ(t.data<int32_t>()[3], 9);
  EXPECT_EQ(t.clone().data<int32_t>()[3], 9);
}

TEST(ATensor, FlatRangeIsAOneDimensionalViewOfItsElementsThatOutlivesTheTensor) {
  Tensor range;
  {
    Tensor t(DType::kFloat32, {3, 4});
    for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
    range = t.flat_range(5, 9);
    range.data<float>()[0] = -1;
    EXPECT_EQ(t.data<float>()[5], -1);
    EXPECT_EQ(t.flat_range(12, 12).elements(), 0);
    EXPECT_THROW(t.flat_range(8, 13), Error);
    EXPECT_THROW(t.flat_range(4, 3), Error);
  }
  EXPECT_EQ(range.shape(), (std::vector<int64_t>{4}));
  EXPECT_EQ(range.data<float>()[3], 8.0f);  // the storage lives on with the view
}

TEST(ATensor, RefusesStringDtypes) {
  onnx::TensorProto proto;
  proto.set_data_type(onnx::TensorProto::STRING);
  proto.add_string_data("a");
  proto.add_dims(1);
  EXPECT_THROW(tensor_from_proto(proto), Unsupported);
}

}  // namespace
}  // namespace apart
