// Assembles a zoo model (graph + initializers) and writes it: inline weights, streamed external data, or shapes only.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/wire_format_lite.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/atomic_file.h"
#include "graph/error.h"
#include "models/graph_builder.h"

namespace apart::models {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kOpset = 17;
constexpr int64_t kIrVersion = 8;
constexpr int64_t kAlignment = 4096;  // external-data offsets, so a runtime can mmap each tensor
// Inline weights only while the whole model stays well below protobuf's 2 GiB message limit.
constexpr int64_t kInlineLimit = (int64_t{2} << 30) - (int64_t{256} << 20);
constexpr size_t kChunk = size_t{1} << 20;  // elements generated per step when streaming

// SplitMix64: tiny, fast, and identical on every platform (unlike std::normal_distribution).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Draws one parameter's values chunk by chunk; each parameter has its own stream (seed, name), so values do not
// depend on what else the model holds.
class ParamValues {
 public:
  ParamValues(const ParamSpec& p, uint64_t seed) : p_(p), rng_{seed * 0x9e3779b97f4a7c15ull ^ fnv1a(p.name)} {}

  // Appends the next `n` values, encoded as `t`, to `out`.
  void append(std::string* out, size_t n, FloatType t) {
    for (size_t i = 0; i < n; ++i) append_float_bytes(out, next(), t);
  }

 private:
  float next() {
    switch (p_.init.kind) {
      case Init::kZeros: return 0.0f;
      case Init::kOnes: return 1.0f;
      case Init::kUniform: return static_cast<float>(p_.init.a + (p_.init.b - p_.init.a) * rng_.uniform01());
      case Init::kNormal: {
        if (has_spare_) {
          has_spare_ = false;
          return static_cast<float>(p_.init.a + p_.init.b * spare_);
        }
        // Box-Muller: two normals from two uniforms.
        const double u1 = 1.0 - rng_.uniform01();  // (0, 1]
        const double u2 = rng_.uniform01();
        const double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(2.0 * M_PI * u2);
        has_spare_ = true;
        return static_cast<float>(p_.init.a + p_.init.b * r * std::cos(2.0 * M_PI * u2));
      }
    }
    return 0.0f;
  }

  const ParamSpec& p_;
  SplitMix64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

std::string options_json(const ZooOptions& o) {
  nlohmann::ordered_json j;
  j["name"] = o.name;
  j["family"] = family_name(o.family);
  if (o.family == Family::kResnet) {
    j["depth"] = o.layers;
    j["width"] = o.width;
    j["classes"] = o.classes;
    j["image"] = o.image;
  } else {
    j["layers"] = o.layers;
    j["hidden"] = o.hidden;
    if (o.family != Family::kMlp) {
      j["heads"] = o.heads;
      j["head_dim"] = o.resolved_head_dim();
      j["ffn"] = o.resolved_ffn();
      j["seq"] = o.seq;
      j["vocab"] = o.vocab;
      j["max_positions"] = o.resolved_max_positions();
    }
    if (o.family == Family::kLlama) {
      j["kv_heads"] = o.resolved_kv_heads();
      j["rope_theta"] = o.rope_theta;
    }
  }
  j["loss"] = loss_name(o.loss);
  j["batch"] = o.batch;
  j["dtype"] = float_type_name(o.dtype);
  j["weights"] = weights_name(o.weights);
  j["seed"] = o.seed;
  j["layernorm"] = layernorm_name(o.layernorm);
  return j.dump();
}

struct Built {
  onnx::ModelProto model;
  std::vector<ParamSpec> params;
  int64_t weight_bytes = 0;
};

constexpr const char* kProducer = "apart-zoo";

// The graph with one initializer per parameter, carrying dims and dtype but no data yet.
Built build_graph(const ZooOptions& o) {
  o.validate();
  Built out;
  onnx::ModelProto& m = out.model;
  m.set_ir_version(kIrVersion);
  m.set_producer_name(kProducer);
  m.set_producer_version("1");  // the zoo's output format; not the apart version, so bundled models do not drift
  m.set_model_version(1);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  auto* meta = m.add_metadata_props();
  meta->set_key("apart.zoo.options");
  meta->set_value(options_json(o));

  onnx::GraphProto* g = m.mutable_graph();
  g->set_name(o.name);
  GraphBuilder b(g, o.dtype);
  b.set_batch(o.batch);
  switch (o.family) {
    case Family::kGpt: build_gpt(b, o); break;
    case Family::kBert: build_bert(b, o); break;
    case Family::kT5: build_t5(b, o); break;
    case Family::kResnet: build_resnet(b, o); break;
    case Family::kMlp: build_mlp(b, o); break;
    case Family::kLlama: build_llama(b, o); break;
  }
  out.params = b.params();
  const int32_t elem = onnx_float_type(o.dtype);
  for (const auto& p : out.params) {
    onnx::TensorProto* t = g->add_initializer();
    t->set_name(p.name);
    t->set_data_type(elem);
    for (int64_t d : p.dims) t->add_dims(d);
    out.weight_bytes += p.numel * float_type_size(o.dtype);
  }
  return out;
}

void set_external(onnx::TensorProto* t, const std::string& location, int64_t offset, int64_t length) {
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* e = t->add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  add("length", std::to_string(length));
}

int64_t inline_limit(const ZooOptions& o) {
  return o.inline_limit_bytes > 0 ? std::min(o.inline_limit_bytes, kInlineLimit) : kInlineLimit;
}

int64_t align_up(int64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

// Declares every initializer as external data at 4096-aligned offsets of `location`.
void declare_external(Built& b, const std::string& location, FloatType t) {
  int64_t offset = 0;
  for (int i = 0; i < b.model.graph().initializer_size(); ++i) {
    const int64_t length = b.params[static_cast<size_t>(i)].numel * float_type_size(t);
    offset = align_up(offset);
    set_external(b.model.mutable_graph()->mutable_initializer(i), location, offset, length);
    offset += length;
  }
}

void fill_inline(Built& b, const ZooOptions& o, const ZooProgress& progress) {
  int64_t done = 0;
  for (int i = 0; i < b.model.graph().initializer_size(); ++i) {
    const ParamSpec& p = b.params[static_cast<size_t>(i)];
    std::string raw;
    raw.reserve(static_cast<size_t>(p.numel * float_type_size(o.dtype)));
    ParamValues values(p, o.seed);
    values.append(&raw, static_cast<size_t>(p.numel), o.dtype);
    b.model.mutable_graph()->mutable_initializer(i)->set_raw_data(std::move(raw));
    done += p.numel;
    if (progress) progress("drawing weights", static_cast<double>(done) / static_cast<double>(std::max<int64_t>(1, b.weight_bytes / float_type_size(o.dtype))));
  }
}

void serialize(const onnx::ModelProto& m, AtomicFile& file) {
  google::protobuf::io::OstreamOutputStream zero_copy(&file.stream());
  google::protobuf::io::CodedOutputStream coded(&zero_copy);
  coded.SetSerializationDeterministic(true);  // same options and seed -> same bytes
  if (!m.SerializeToCodedStream(&coded)) throw SystemError("cannot serialize the model to " + file.temp_path().string());
}

// Streams random weights into the external-data file, matching the offsets declare_external chose.
void stream_weights(Built& b, const ZooOptions& o, AtomicFile& file, const ZooProgress& progress) {
  int64_t offset = 0, done = 0;
  const int64_t total = std::max<int64_t>(1, b.weight_bytes);
  std::string buf;
  for (const ParamSpec& param : b.params) {
    const int64_t aligned = align_up(offset);
    if (aligned > offset) file.write(std::string(static_cast<size_t>(aligned - offset), '\0').data(), aligned - offset);
    offset = aligned;
    ParamValues values(param, o.seed);
    for (int64_t left = param.numel; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(kChunk)));
      buf.clear();
      values.append(&buf, n, o.dtype);
      file.write(buf.data(), static_cast<int64_t>(buf.size()));
      offset += static_cast<int64_t>(buf.size());
      done += static_cast<int64_t>(buf.size());
      left -= static_cast<int64_t>(n);
      if (progress) progress("writing weights", static_cast<double>(done) / static_cast<double>(total));
    }
  }
}

}  // namespace

onnx::ModelProto build_zoo_model(const ZooOptions& options, std::string_view weights_location) {
  Built b = build_graph(options);
  if (options.weights == WeightsMode::kNone) {
    declare_external(b, std::string(weights_location), options.dtype);
  } else {
    if (b.weight_bytes > inline_limit(options))
      throw InvalidArgument("--weights random: " + std::to_string(b.weight_bytes) +
                            " bytes of weights do not fit inline in one ONNX message; write the model to a file");
    fill_inline(b, options, {});
  }
  return std::move(b.model);
}

bool written_by_zoo(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(1024, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  google::protobuf::io::CodedInputStream s(reinterpret_cast<const uint8_t*>(head.data()), static_cast<int>(head.size()));
  while (const uint32_t tag = s.ReadTag()) {
    const uint32_t field = tag >> 3;
    if (field == onnx::ModelProto::kProducerNameFieldNumber) {
      uint32_t length = 0;
      std::string producer;
      return (tag & 7) == 2 && s.ReadVarint32(&length) && s.ReadString(&producer, static_cast<int>(length)) &&
             producer == kProducer;
    }
    if (field >= onnx::ModelProto::kGraphFieldNumber) return false;  // producer_name comes before the graph
    if (!google::protobuf::internal::WireFormatLite::SkipField(&s, tag)) return false;
  }
  return false;
}

ZooResult write_zoo_model(const ZooOptions& options, const std::string& path, const ZooProgress& progress) {
  const fs::path out(path);
  if (out.filename().empty()) throw InvalidArgument("-o: '" + path + "' names a directory, not a file");
  std::error_code ec;
  if (fs::is_directory(out, ec)) throw InvalidArgument("-o: '" + path + "' is a directory");
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) throw SystemError("-o: directory '" + dir.string() + "' does not exist");

  Built b = build_graph(options);
  ZooResult r;
  r.params = 0;
  for (const auto& p : b.params) r.params += p.numel;
  r.nodes = b.model.graph().node_size();
  r.initializers = b.model.graph().initializer_size();
  r.weight_bytes = b.weight_bytes;

  const std::string location = out.stem().string() + ".weights";
  const bool external = options.weights == WeightsMode::kNone || b.weight_bytes > inline_limit(options);
  AtomicFile model_file(out);
  if (!external) {
    fill_inline(b, options, progress);
    serialize(b.model, model_file);
    model_file.commit();
  } else {
    declare_external(b, location, options.dtype);
    r.weights_location = location;
    if (options.weights == WeightsMode::kRandom) {
      // Fail before writing hundreds of GB into a disk that cannot hold them.
      const auto space = fs::space(dir, ec);
      if (!ec && static_cast<int64_t>(space.available) < b.weight_bytes + (int64_t{64} << 20))
        throw Infeasible("--weights random: " + std::to_string(b.weight_bytes) + " bytes of weights do not fit in " +
                         dir.string() + " (" + std::to_string(space.available) +
                         " bytes free); use --weights none for planning");
      AtomicFile weights_file(dir / location);
      stream_weights(b, options, weights_file, progress);
      serialize(b.model, model_file);
      weights_file.commit();
      model_file.commit();
      r.weights_written = true;
    } else {
      serialize(b.model, model_file);
      model_file.commit();
    }
  }
  r.model_bytes = static_cast<int64_t>(fs::file_size(out, ec));
  return r;
}

}  // namespace apart::models
