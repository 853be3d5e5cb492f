// Tests that look inside .onnx files read them with the importer's own loader (importer/model_proto.h), so a file
// that does not load fails the test with the loader's typed message instead of yielding an empty model.
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>

#include "importer/model_proto.h"

namespace apart::testing {

inline onnx::ModelProto read_proto(const std::filesystem::path& path) {
  onnx::ModelProto m;
  EXPECT_NO_THROW(m = load_model_proto(path)) << path;
  return m;
}

}  // namespace apart::testing
