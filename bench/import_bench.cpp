// Import + shape inference must stay near-linear in graph size: times chains of 10k, 100k, 1M nodes.
// Each size runs in a forked child so its peak RSS (getrusage) is its own.
#include <onnx/onnx_pb.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "importer/importer.h"

namespace {

// x[batch,64] → (Add w | Relu | Mul w | Tanh)… : a chain of `nodes` tasks with one shared param.
std::string chain_model(int64_t nodes) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* os = m.add_opset_import();
  os->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("chain");
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(64);
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(64);
  w->mutable_raw_data()->assign(64 * 4, '\0');
  static const char* const ops[] = {"Add", "Relu", "Mul", "Tanh"};
  std::string prev = "x";
  for (int64_t i = 0; i < nodes; ++i) {
    auto* n = g->add_node();
    const char* op = ops[i % 4];
    n->set_op_type(op);
    n->set_name("n" + std::to_string(i));
    n->add_input(prev);
    if (op[0] == 'A' || op[0] == 'M') n->add_input("w");
    prev = "v" + std::to_string(i);
    n->add_output(prev);
  }
  auto* out = g->add_output();
  out->set_name(prev);
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return m.SerializeAsString();
}

void measure(int64_t nodes) {
  const std::string bytes = chain_model(nodes);
  struct rusage before {};
  getrusage(RUSAGE_SELF, &before);
  const auto t0 = std::chrono::steady_clock::now();
  apart::ImportOptions o;
  o.dims = {{"batch", 8}};
  auto model = apart::import_model_bytes(bytes, ".", "chain.onnx", o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage after {};
  getrusage(RUSAGE_SELF, &after);
  std::printf("%9lld nodes  %8.2f MB file  import %7.3f s  (%6.2f µs/node)  peak RSS %8.1f MB (before import %7.1f MB)  unknown shapes %zu\n",
              static_cast<long long>(nodes), bytes.size() / 1e6, seconds, 1e6 * seconds / nodes, after.ru_maxrss / 1024.0,
              before.ru_maxrss / 1024.0, model.unknown_shape_values.size());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {10'000, 100'000, 1'000'000};
  if (argc > 1) {
    sizes.clear();
    for (int i = 1; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  }
  for (int64_t n : sizes) {
    const pid_t pid = fork();
    if (pid == 0) {
      measure(n);
      std::_Exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::printf("%lld nodes: child failed\n", static_cast<long long>(n));
  }
}
