// Data sources for `apart train` (see data.h): synthetic tasks, .bin token files, .npy arrays.
#include "train/data.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "graph/checked.h"
#include "graph/error.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

// A generator for (seed, step, stream): batches depend on nothing else.
std::mt19937_64 rng_for(uint64_t seed, int64_t step, uint64_t stream) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(step),
                    static_cast<uint32_t>(static_cast<uint64_t>(step) >> 32), static_cast<uint32_t>(stream)};
  return std::mt19937_64(seq);
}

int64_t row_elements(const ModelInput& in) {
  int64_t n = 1;
  for (size_t i = 1; i < in.shape.size(); ++i) n *= in.shape[i];
  return n;
}

bool is_integer(DType t) {
  switch (t) {
    case DType::kInt8: case DType::kInt16: case DType::kInt32: case DType::kInt64:
    case DType::kUInt8: case DType::kUInt16: case DType::kUInt32: case DType::kUInt64: return true;
    default: return false;
  }
}

void store_int(Tensor& t, int64_t i, int64_t v) {
  switch (t.dtype()) {
    case DType::kInt64: t.data<int64_t>()[i] = v; break;
    case DType::kInt32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::kUInt16: t.data<uint16_t>()[i] = static_cast<uint16_t>(v); break;
    case DType::kUInt32: t.data<uint32_t>()[i] = static_cast<uint32_t>(v); break;
    case DType::kInt16: t.data<int16_t>()[i] = static_cast<int16_t>(v); break;
    case DType::kUInt64: t.data<uint64_t>()[i] = static_cast<uint64_t>(v); break;
    case DType::kInt8: t.data<int8_t>()[i] = static_cast<int8_t>(v); break;
    case DType::kUInt8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;
    default: APART_CHECK(false, "store_int on a non-integer tensor");
  }
}

bool name_says_target(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return n.find("target") != std::string::npos || n.find("label") != std::string::npos || n == "y";
}

// Consumers of `v`, looking through ops that only move or retype data.
void terminal_uses(const TaskGraph& g, ValueId v, std::vector<std::pair<TaskId, size_t>>& out, int depth = 0) {
  static const std::set<std::string> kPassThrough = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast",
                                                     "Identity", "Transpose", "Expand", "Slice"};
  if (depth > 8) return;
  for (TaskId t : g.consumers(v)) {
    const Task& task = g.task(t);
    for (size_t i = 0; i < task.inputs.size(); ++i) {
      if (task.inputs[i] != v) continue;
      if (i == 0 && kPassThrough.count(task.op_type) && !task.outputs.empty() && task.outputs[0].valid())
        terminal_uses(g, task.outputs[0], out, depth + 1);
      else
        out.emplace_back(t, i);
    }
  }
}

int64_t dim_of(const TaskGraph& g, ValueId v, size_t axis) {
  if (!v.valid()) return 0;
  const Value& value = g.value(v);
  return value.shape_known && value.shape.size() > axis ? value.shape[axis] : 0;
}

}  // namespace

std::vector<ModelInput> classify_inputs(const TaskGraph& g, const std::set<std::string>& fed_otherwise) {
  std::vector<ModelInput> inputs;
  for (ValueId v : g.graph_inputs()) {
    const Value& value = g.value(v);
    if (value.kind != ValueKind::kInput || fed_otherwise.count(value.name)) continue;
    if (!value.shape_known || value.shape.empty())
      throw InvalidArgument("input '" + value.name + "' needs a static shape with a batch axis to be trained on " +
                            "(bind it with --dim/--shape)");
    ModelInput in{value.name, value.dtype, value.shape, InputRole::kOther, 0};
    if (is_floating(value.dtype)) {
      in.role = name_says_target(value.name) ? InputRole::kTargets : InputRole::kFeatures;
    } else if (is_integer(value.dtype)) {
      std::vector<std::pair<TaskId, size_t>> uses;
      terminal_uses(g, v, uses);
      for (const auto& [t, slot] : uses) {
        const Task& task = g.task(t);
        if (task.op_type == "Gather" && slot == 1 && dim_of(g, task.inputs[0], 0) > 0) {
          in.role = InputRole::kTokens;
          in.range = dim_of(g, task.inputs[0], 0);
        } else if ((task.op_type == "SoftmaxCrossEntropyLoss" || task.op_type == "NegativeLogLikelihoodLoss") &&
                   slot == 1 && dim_of(g, task.inputs[0], 1) > 0) {
          in.role = InputRole::kLabels;
          in.range = dim_of(g, task.inputs[0], 1);
        }
      }
    }
    inputs.push_back(std::move(in));
  }
  return inputs;
}

// --- synthetic ---------------------------------------------------------------------------------

namespace {

class SyntheticData : public DataSource {
 public:
  SyntheticData(std::vector<ModelInput> inputs, uint64_t seed) : inputs_(std::move(inputs)), seed_(seed) {
    const ModelInput* tokens = nullptr;
    const ModelInput* labels = nullptr;
    for (const auto& in : inputs_) {
      if (in.role == InputRole::kTokens && !tokens) tokens = &in;
      if (in.role == InputRole::kLabels && !labels) labels = &in;
      if (in.role == InputRole::kOther)
        throw InvalidArgument("--data synthetic cannot fill input '" + in.name + "' (" +
                              std::string(dtype_name(in.dtype)) +
                              ", neither token ids nor class labels); pass --data FILE.npy for it");
      if (in.role == InputRole::kFeatures && in.dtype != DType::kFloat32)
        throw Unsupported("--data synthetic fills float32 inputs only; '" + in.name + "' is " +
                          std::string(dtype_name(in.dtype)));
      if (in.role == InputRole::kTargets && in.dtype != DType::kFloat32)
        throw Unsupported("--data synthetic fills float32 targets only; '" + in.name + "' is " +
                          std::string(dtype_name(in.dtype)));
    }
    sequence_ = tokens && labels && tokens->shape == labels->shape;
    if (sequence_) {
      vocab_ = std::min(tokens->range, labels->range);
      permutation_.resize(static_cast<size_t>(vocab_));
      std::iota(permutation_.begin(), permutation_.end(), int64_t{0});
      auto rng = rng_for(seed_, -1, 1);
      std::shuffle(permutation_.begin(), permutation_.end(), rng);
      tokens_ = tokens->name;
      labels_ = labels->name;
    }
    for (const auto& in : inputs_)
      if (in.role == InputRole::kFeatures && features_.empty()) features_ = in.name;
    // The teacher reads the first float input pooled to at most kPooled values per row.
    if (!features_.empty()) {
      const ModelInput& f = find(features_);
      pooled_ = std::min<int64_t>(row_elements(f), kPooled);
      for (const auto& in : inputs_) {
        const bool uses_teacher = in.role == InputRole::kTargets || (in.role == InputRole::kLabels && !sequence_);
        if (!uses_teacher) continue;
        const int64_t outs = in.role == InputRole::kTargets ? row_elements(in) : in.range;
        auto rng = rng_for(seed_, -2, std::hash<std::string>{}(in.name));
        std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(pooled_)));
        std::vector<float> w(static_cast<size_t>(outs * pooled_));
        for (float& x : w) x = normal(rng);
        teachers_[in.name] = std::move(w);
      }
    }
  }

  std::map<std::string, Tensor> batch(int64_t step) override {
    std::map<std::string, Tensor> out;
    if (sequence_) fill_sequences(step, out);
    if (!features_.empty()) {
      const ModelInput& f = find(features_);
      Tensor x(DType::kFloat32, f.shape);
      auto rng = rng_for(seed_, step, 2);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : x.span<float>()) v = normal(rng);
      out[f.name] = x;
    }
    for (const auto& in : inputs_) {
      if (out.count(in.name)) continue;
      if (in.role == InputRole::kFeatures) {  // further float inputs: independent noise
        Tensor x(DType::kFloat32, in.shape);
        auto rng = rng_for(seed_, step, 3 + std::hash<std::string>{}(in.name));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& v : x.span<float>()) v = normal(rng);
        out[in.name] = x;
      } else if (in.role == InputRole::kTokens) {  // tokens without a matching label sequence
        Tensor x(in.dtype, in.shape);
        auto rng = rng_for(seed_, step, 4 + std::hash<std::string>{}(in.name));
        std::uniform_int_distribution<int64_t> pick(0, in.range - 1);
        for (int64_t i = 0; i < x.elements(); ++i) store_int(x, i, pick(rng));
        out[in.name] = x;
      } else if (in.role == InputRole::kTargets || in.role == InputRole::kLabels) {
        if (features_.empty())
          throw InvalidArgument("--data synthetic: input '" + in.name + "' needs a float feature input or token ids to "
                                "derive it from; pass --data FILE.npy");
        out[in.name] = teach(in, out.at(features_));
      }
    }
    return out;
  }

  std::string describe() const override {
    std::string s = "synthetic (seed " + std::to_string(seed_);
    if (sequence_) s += ", " + tokens_ + "/" + labels_ + ": next = perm(token) over vocab " + std::to_string(vocab_);
    if (!teachers_.empty()) s += ", linear teacher of " + features_;
    return s + ")";
  }

 private:
  static constexpr int64_t kPooled = 256;

  const ModelInput& find(const std::string& name) const {
    for (const auto& in : inputs_)
      if (in.name == name) return in;
    APART_CHECK(false, "no input " + name);
    return inputs_.front();
  }

  void fill_sequences(int64_t step, std::map<std::string, Tensor>& out) const {
    const ModelInput& tin = find(tokens_);
    const ModelInput& lin = find(labels_);
    Tensor x(tin.dtype, tin.shape), y(lin.dtype, lin.shape);
    const int64_t rows = tin.shape[0], seq = row_elements(tin);
    auto rng = rng_for(seed_, step, 0);
    std::uniform_int_distribution<int64_t> pick(0, vocab_ - 1);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t token = pick(rng);
      for (int64_t s = 0; s < seq; ++s) {
        const int64_t next = permutation_[static_cast<size_t>(token)];
        store_int(x, r * seq + s, token);
        store_int(y, r * seq + s, next);
        token = next;
      }
    }
    out[tokens_] = x;
    out[labels_] = y;
  }

  Tensor teach(const ModelInput& in, const Tensor& features) const {
    const std::vector<float>& w = teachers_.at(in.name);
    const int64_t rows = in.shape[0];
    const int64_t feature_row = features.elements() / features.dim(0);
    const int64_t chunk = (feature_row + pooled_ - 1) / pooled_;
    const float norm = 1.0f / std::sqrt(static_cast<float>(chunk));
    Tensor t(in.dtype, in.shape);
    const int64_t outs = in.role == InputRole::kTargets ? row_elements(in) : in.range;
    std::vector<float> pooled(static_cast<size_t>(pooled_)), score(static_cast<size_t>(outs));
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = features.data<float>() + (r % features.dim(0)) * feature_row;
      std::fill(pooled.begin(), pooled.end(), 0.0f);
      for (int64_t i = 0; i < feature_row; ++i) pooled[static_cast<size_t>(std::min(i / chunk, pooled_ - 1))] += x[i];
      for (float& p : pooled) p *= norm;
      for (int64_t o = 0; o < outs; ++o) {
        float s = 0;
        for (int64_t k = 0; k < pooled_; ++k) s += w[static_cast<size_t>(o * pooled_ + k)] * pooled[static_cast<size_t>(k)];
        score[static_cast<size_t>(o)] = s;
      }
      if (in.role == InputRole::kTargets) {
        std::copy(score.begin(), score.end(), t.data<float>() + r * outs);
      } else {
        const int64_t label = std::max_element(score.begin(), score.end()) - score.begin();
        const int64_t per_row = row_elements(in);  // labels [B] or [B, …]: one class per row, repeated
        for (int64_t i = 0; i < per_row; ++i) store_int(t, r * per_row + i, label);
      }
    }
    return t;
  }

  std::vector<ModelInput> inputs_;
  uint64_t seed_;
  bool sequence_ = false;
  int64_t vocab_ = 0;
  std::vector<int64_t> permutation_;
  std::string tokens_, labels_, features_;
  int64_t pooled_ = 0;
  std::map<std::string, std::vector<float>> teachers_;
};

// --- token files -------------------------------------------------------------------------------

class TokenFileData : public DataSource {
 public:
  TokenFileData(fs::path path, DType token_dtype, const std::vector<ModelInput>& inputs, uint64_t seed)
      : path_(std::move(path)), dtype_(token_dtype), seed_(seed) {
    if (dtype_ != DType::kUInt16 && dtype_ != DType::kUInt32)
      throw InvalidArgument("--data-dtype must be uint16 or uint32");
    const ModelInput* tokens = nullptr;
    const ModelInput* labels = nullptr;
    for (const auto& in : inputs) {
      if (in.role == InputRole::kTokens && !tokens) tokens = &in;
      else if (in.role == InputRole::kLabels && !labels) labels = &in;
      else
        throw InvalidArgument("--data " + path_.string() + ": a token file feeds one token input and its labels; "
                              "the model also has input '" + in.name + "' (use --data name=FILE.npy,…)");
    }
    if (!tokens) throw InvalidArgument("--data " + path_.string() + ": the model has no token-id input to feed");
    if (labels && labels->shape != tokens->shape)
      throw InvalidArgument("--data " + path_.string() + ": labels '" + labels->name + "' and tokens '" +
                            tokens->name + "' have different shapes");
    tokens_ = *tokens;
    if (labels) labels_ = *labels;
    vocab_ = labels ? std::min(tokens->range, labels->range) : tokens->range;
    seq_ = row_elements(*tokens_);
    std::error_code ec;
    if (!fs::is_regular_file(path_, ec)) throw InvalidArgument("--data " + path_.string() + ": no such file");
    const int64_t bytes = static_cast<int64_t>(fs::file_size(path_, ec));
    if (ec) throw SystemError("cannot stat " + path_.string() + ": " + ec.message());
    const int64_t width = dtype_size(dtype_);
    if (bytes % width != 0)
      throw InvalidArgument("token file " + path_.string() + " has " + std::to_string(bytes) +
                            " bytes, not a multiple of " + std::to_string(width) + " (" +
                            std::string(dtype_name(dtype_)) + " tokens); wrong --data-dtype?");
    count_ = bytes / width;
    if (count_ < seq_ + 1)
      throw InvalidArgument("token file " + path_.string() + " holds " + std::to_string(count_) +
                            " tokens; a window needs " + std::to_string(seq_ + 1));
    in_.open(path_, std::ios::binary);
    if (!in_) throw SystemError("cannot open " + path_.string() + ": " + std::strerror(errno));
  }

  std::map<std::string, Tensor> batch(int64_t step) override {
    const int64_t rows = tokens_->shape[0];
    Tensor x(tokens_->dtype, tokens_->shape);
    Tensor y = labels_ ? Tensor(labels_->dtype, labels_->shape) : Tensor();
    auto rng = rng_for(seed_, step, 0);
    std::uniform_int_distribution<int64_t> pick(0, count_ - seq_ - 1);
    const int64_t width = dtype_size(dtype_);
    std::vector<unsigned char> buf(static_cast<size_t>((seq_ + 1) * width));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t start = pick(rng);
      in_.clear();
      in_.seekg(start * width);
      in_.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
      if (!in_) throw SystemError("read failed on " + path_.string() + " at token " + std::to_string(start));
      for (int64_t s = 0; s <= seq_; ++s) {
        const unsigned char* p = buf.data() + s * width;
        const int64_t token = width == 2 ? int64_t{p[0]} | int64_t{p[1]} << 8
                                         : int64_t{p[0]} | int64_t{p[1]} << 8 | int64_t{p[2]} << 16 | int64_t{p[3]} << 24;
        if (token >= vocab_)
          throw InvalidArgument("token file " + path_.string() + ": token " + std::to_string(token) + " at index " +
                                std::to_string(start + s) + " is outside the model's vocabulary (" +
                                std::to_string(vocab_) + ")");
        if (s < seq_) store_int(x, r * seq_ + s, token);
        if (s > 0 && labels_) store_int(y, r * seq_ + s - 1, token);
      }
    }
    std::map<std::string, Tensor> out{{tokens_->name, x}};
    if (labels_) out[labels_->name] = y;
    return out;
  }

  std::string describe() const override {
    return path_.string() + " (" + std::string(dtype_name(dtype_)) + ", " + std::to_string(count_) +
           " tokens, random windows of " + std::to_string(seq_ + 1) + ")";
  }

 private:
  fs::path path_;
  DType dtype_;
  uint64_t seed_;
  std::optional<ModelInput> tokens_, labels_;
  int64_t vocab_ = 0, seq_ = 0, count_ = 0;
  std::ifstream in_;
};

// --- .npy --------------------------------------------------------------------------------------

// Reads `'key': value` from the header dict text; returns the raw value text.
std::string dict_value(const std::string& dict, const std::string& key, const std::string& where) {
  for (const char q : {'\'', '"'}) {
    const std::string k = std::string(1, q) + key + std::string(1, q);
    const size_t at = dict.find(k);
    if (at == std::string::npos) continue;
    size_t colon = dict.find(':', at + k.size());
    if (colon == std::string::npos) break;
    size_t start = colon + 1;
    while (start < dict.size() && std::isspace(static_cast<unsigned char>(dict[start]))) ++start;
    if (start >= dict.size()) break;
    size_t end = start;
    if (dict[start] == '(') {
      end = dict.find(')', start);
      if (end == std::string::npos) break;
      return dict.substr(start, end - start + 1);
    }
    if (dict[start] == '\'' || dict[start] == '"') {
      end = dict.find(dict[start], start + 1);
      if (end == std::string::npos) break;
      return dict.substr(start + 1, end - start - 1);
    }
    while (end < dict.size() && dict[end] != ',' && dict[end] != '}') ++end;
    std::string v = dict.substr(start, end - start);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
    return v;
  }
  throw InvalidArgument(where + ": the .npy header has no '" + key + "' entry");
}

class NpyData : public DataSource {
 public:
  struct Array {
    std::optional<ModelInput> input;
    fs::path path;
    NpyHeader header;
    int64_t rows = 0, row_bytes = 0;
    std::ifstream in;
  };

  NpyData(const std::vector<std::pair<std::string, fs::path>>& files, const std::vector<ModelInput>& inputs) {
    std::set<std::string> given;
    for (const auto& file : files) {
      const std::string& name = file.first;
      const fs::path& path = file.second;
      auto it = std::find_if(inputs.begin(), inputs.end(), [&](const ModelInput& in) { return in.name == name; });
      if (it == inputs.end()) throw InvalidArgument("--data " + name + "=" + path.string() + ": the model has no input '" + name + "'");
      if (!given.insert(name).second) throw InvalidArgument("--data names input '" + name + "' twice");
      auto a = std::make_unique<Array>();
      a->input = *it;
      a->path = path;
      a->header = read_npy_header(path);
      check_fits(*a);
      a->in.open(path, std::ios::binary);
      if (!a->in) throw SystemError("cannot open " + path.string() + ": " + std::strerror(errno));
      arrays_.push_back(std::move(a));
    }
    for (const auto& in : inputs)
      if (!given.count(in.name)) throw InvalidArgument("--data gives no .npy for model input '" + in.name + "' (add " + in.name + "=FILE.npy)");
    for (const auto& a : arrays_)
      if (a->rows != arrays_.front()->rows)
        throw InvalidArgument("--data: " + a->path.string() + " has " + std::to_string(a->rows) + " rows but " +
                              arrays_.front()->path.string() + " has " + std::to_string(arrays_.front()->rows));
  }

  std::map<std::string, Tensor> batch(int64_t step) override {
    std::map<std::string, Tensor> out;
    for (auto& a : arrays_) {
      const ModelInput& in = *a->input;
      Tensor t(in.dtype, in.shape);
      const int64_t batch_rows = in.shape[0], per_row = row_elements(in);
      const int64_t width = dtype_size(a->header.dtype);
      std::vector<unsigned char> buf(static_cast<size_t>(a->row_bytes));
      for (int64_t r = 0; r < batch_rows; ++r) {
        const int64_t row = (step * batch_rows + r) % a->rows;
        a->in.clear();
        a->in.seekg(a->header.data_offset + row * a->row_bytes);
        a->in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
        if (!a->in) throw SystemError("read failed on " + a->path.string() + " at row " + std::to_string(row));
        if (in.dtype == a->header.dtype) {
          std::memcpy(t.raw() + r * a->row_bytes, buf.data(), buf.size());
          continue;
        }
        for (int64_t i = 0; i < per_row; ++i) {  // integer widening (checked in check_fits)
          const unsigned char* p = buf.data() + i * width;
          int64_t v = 0;
          if (a->header.dtype == DType::kUInt16) v = p[0] | p[1] << 8;
          else if (a->header.dtype == DType::kInt32) { int32_t x; std::memcpy(&x, p, 4); v = x; }
          else { std::memcpy(&v, p, 8); }
          store_int(t, r * per_row + i, v);
        }
      }
      out[in.name] = std::move(t);
    }
    return out;
  }

  std::string describe() const override {
    std::string s;
    for (const auto& a : arrays_) s += (s.empty() ? "" : ", ") + a->input->name + "=" + a->path.string();
    return s + " (" + std::to_string(arrays_.front()->rows) + " rows)";
  }

 private:
  static void check_fits(Array& a) {
    const ModelInput& in = *a.input;
    const std::string where = a.path.string();
    const auto& shape = a.header.shape;
    if (shape.empty() || shape[0] < 1)
      throw InvalidArgument(where + ": array shape " + shape_string(shape) + " has no rows; input '" + in.name +
                            "' needs rows of " + shape_string(std::vector<int64_t>(in.shape.begin() + 1, in.shape.end())));
    if (!std::equal(shape.begin() + 1, shape.end(), in.shape.begin() + 1, in.shape.end()))
      throw InvalidArgument(where + ": rows of shape " + shape_string(std::vector<int64_t>(shape.begin() + 1, shape.end())) +
                            " do not fit input '" + in.name + "' (" + shape_string(in.shape) + ", batch first)");
    const DType from = a.header.dtype, to = in.dtype;
    const bool ok = from == to || (to == DType::kInt64 && (from == DType::kInt32 || from == DType::kUInt16)) ||
                    (to == DType::kInt32 && from == DType::kUInt16);
    if (!ok)
      throw InvalidArgument(where + ": dtype " + a.header.descr + " does not fit input '" + in.name + "' (" +
                            std::string(dtype_name(to)) + ")");
    a.rows = shape[0];
    a.row_bytes = dtype_size(from);
    for (size_t i = 1; i < shape.size(); ++i) {
      const auto bytes = checked_mul(a.row_bytes, shape[i]);
      if (!bytes) throw InvalidArgument(where + ": a row of shape " + shape_string(shape) + " is past 2^63 bytes");
      a.row_bytes = *bytes;
    }
    std::error_code ec;
    const int64_t size = static_cast<int64_t>(fs::file_size(a.path, ec));
    // The shape's element count fits an int64 (read_npy_header); its bytes and end may not.
    const auto data_bytes = checked_mul(a.rows, a.row_bytes);
    const auto end = data_bytes ? checked_add(a.header.data_offset, *data_bytes) : std::nullopt;
    if (!end) throw InvalidArgument(where + ": shape " + shape_string(shape) + " is past 2^63 bytes");
    if (ec || *end > size)
      throw InvalidArgument(where + " is truncated: the header promises " + std::to_string(a.rows * a.row_bytes) +
                            " bytes of data, the file has " + std::to_string(size - a.header.data_offset));
  }

  std::vector<std::unique_ptr<Array>> arrays_;
};

}  // namespace

NpyHeader read_npy_header(const fs::path& path) {
  const std::string where = path.string();
  // stat before open: opening a FIFO would block for ever.
  std::error_code ec;
  if (const fs::file_status status = fs::status(path, ec); fs::exists(status) && !fs::is_regular_file(status))
    throw InvalidArgument(where + " is not a regular file (a FIFO, device or directory); give a .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(where + ": cannot open .npy file: " + std::strerror(errno));
  unsigned char pre[12] = {};
  in.read(reinterpret_cast<char*>(pre), 10);
  if (in.gcount() < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw InvalidArgument(where + " is not a .npy file (bad magic)");
  const int major = pre[6];
  int64_t header_len = 0, prefix = 10;
  if (major == 1) {
    header_len = pre[8] | pre[9] << 8;
  } else if (major == 2 || major == 3) {
    in.read(reinterpret_cast<char*>(pre + 10), 2);
    if (in.gcount() < 2) throw InvalidArgument(where + " is truncated (header length)");
    header_len = int64_t{pre[8]} | int64_t{pre[9]} << 8 | int64_t{pre[10]} << 16 | int64_t{pre[11]} << 24;
    prefix = 12;
  } else {
    throw InvalidArgument(where + ": .npy format version " + std::to_string(major) + " is not supported (1, 2, 3)");
  }
  if (header_len <= 0 || header_len > (int64_t{1} << 20)) throw InvalidArgument(where + ": implausible .npy header length");
  std::string dict(static_cast<size_t>(header_len), '\0');
  in.read(dict.data(), header_len);
  if (in.gcount() < header_len) throw InvalidArgument(where + " is truncated (header)");
  NpyHeader h;
  h.data_offset = prefix + header_len;
  h.descr = dict_value(dict, "descr", where);
  const std::string fortran = dict_value(dict, "fortran_order", where);
  if (fortran != "False") throw InvalidArgument(where + ": fortran_order arrays are not supported (save C order)");
  if (h.descr == "<f4") h.dtype = DType::kFloat32;
  else if (h.descr == "<i8") h.dtype = DType::kInt64;
  else if (h.descr == "<i4") h.dtype = DType::kInt32;
  else if (h.descr == "<u2") h.dtype = DType::kUInt16;
  else throw InvalidArgument(where + ": dtype '" + h.descr + "' is not supported (use <f4, <i8, <i4 or <u2)");
  const std::string shape = dict_value(dict, "shape", where);
  if (shape.size() < 2 || shape.front() != '(') throw InvalidArgument(where + ": malformed shape " + shape);
  std::string body = shape.substr(1, shape.size() - 2);
  size_t pos = 0;
  while (pos < body.size()) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    item.erase(std::remove_if(item.begin(), item.end(), [](unsigned char c) { return std::isspace(c) || c == 'L'; }), item.end());
    if (!item.empty()) {
      if (!std::all_of(item.begin(), item.end(), [](unsigned char c) { return std::isdigit(c); }) || item.size() > 15)
        throw InvalidArgument(where + ": malformed shape " + shape);
      h.shape.push_back(std::stoll(item));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (!checked_element_count(h.shape)) throw InvalidArgument(where + ": shape " + shape + " overflows");
  return h;
}

void write_npy(const fs::path& path, const Tensor& t) {
  std::string descr;
  switch (t.dtype()) {
    case DType::kFloat32: descr = "<f4"; break;
    case DType::kInt64: descr = "<i8"; break;
    case DType::kInt32: descr = "<i4"; break;
    case DType::kUInt16: descr = "<u2"; break;
    default: throw InvalidArgument("write_npy: dtype " + std::string(dtype_name(t.dtype())) + " not supported");
  }
  std::string shape = "(";
  for (int64_t d : t.shape()) shape += std::to_string(d) + ", ";
  if (t.rank() > 1) shape.resize(shape.size() - 2);
  else if (t.rank() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw SystemError("cannot write " + path.string());
  const uint16_t len = static_cast<uint16_t>(dict.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  out.write(reinterpret_cast<const char*>(t.raw()), t.bytes());
  if (!out) throw SystemError("write failed on " + path.string());
}

std::unique_ptr<DataSource> make_synthetic_data(const std::vector<ModelInput>& inputs, uint64_t seed) {
  return std::make_unique<SyntheticData>(inputs, seed);
}
std::unique_ptr<DataSource> make_token_file_data(const fs::path& path, DType token_dtype,
                                                 const std::vector<ModelInput>& inputs, uint64_t seed) {
  return std::make_unique<TokenFileData>(path, token_dtype, inputs, seed);
}
std::unique_ptr<DataSource> make_npy_data(const std::vector<std::pair<std::string, fs::path>>& files,
                                          const std::vector<ModelInput>& inputs) {
  return std::make_unique<NpyData>(files, inputs);
}

std::vector<std::pair<std::string, fs::path>> data_files(const std::string& spec) {
  if (spec.empty() || spec == "synthetic") return {};
  if (spec.find('=') == std::string::npos) {
    if (fs::path(spec).extension() == ".npy")
      throw InvalidArgument("--data " + spec + ": name the input it feeds, e.g. --data input=" + spec + ",target=y.npy");
    return {{"", spec}};
  }
  std::vector<std::pair<std::string, fs::path>> files;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = spec.find(',', pos);
    const std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw InvalidArgument("--data: '" + item + "' is not NAME=FILE.npy");
    files.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return files;
}

std::unique_ptr<DataSource> make_data_source(const DataOptions& options, const std::vector<ModelInput>& inputs) {
  const std::string& spec = options.spec;
  if (spec.empty() || spec == "synthetic") return make_synthetic_data(inputs, options.seed);
  auto files = data_files(spec);
  if (files.size() == 1 && files.front().first.empty())
    return make_token_file_data(files.front().second, options.token_dtype, inputs, options.seed);
  return make_npy_data(files, inputs);
}

int64_t tokens_per_sample(const std::map<std::string, Tensor>& batch) {
  int64_t tokens = 0;
  for (const auto& [name, t] : batch) {
    if (t.shape().size() < 2 || is_floating(t.dtype()) || t.dtype() == DType::kBool) continue;
    int64_t per_sample = 1;
    for (size_t d = 1; d < t.shape().size(); ++d) per_sample *= t.shape()[d];
    tokens = std::max(tokens, per_sample);
  }
  return tokens;
}

}  // namespace apart
