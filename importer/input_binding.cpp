// Binding the model's dynamic input dims (importer/input_binding.h).
#include "importer/input_binding.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "graph/checked.h"
#include "graph/error.h"
#include "graph/text.h"
#include "importer/onnx_reading.h"

namespace apart {

namespace {

class InputBinder {
 public:
  InputBinder(const ImportOptions& options, ImportedModel& result) : options_(options), result_(result) {}

  void run(onnx::GraphProto& g) {
    std::set<std::string> used_dims;
    std::set<std::string> used_shapes;
    check_dim_flags_name_model_dims(g);
    const BatchRule rule = find_batch_dim(g);
    dims_ = options_.dims;
    apply_batch_flag(g, rule);
    for (auto& in : *g.mutable_input()) {
      if (in.name().empty()) throw InvalidModel("a graph input has an empty name");
      const DeclaredType declared = declared_type(in);
      if (auto existing = graph().find_value(in.name())) {
        // An initializer with the same name: ONNX IR < 4 lists every initializer as an input (a default value).
        Value& v = graph().value(*existing);
        if (v.kind != ValueKind::kParam) throw InvalidModel("two graph inputs are named " + quote(in.name()));
        const bool same_type = !declared.is_tensor || declared.dtype == v.dtype || declared.dtype == DType::kUndefined;
        bool same_shape = !declared.has_shape || declared.dims.size() == v.shape.size();
        for (size_t i = 0; same_shape && declared.has_shape && i < declared.dims.size(); ++i)
          if (declared.dims[i] >= 0 && declared.dims[i] != v.shape[i]) same_shape = false;
        if (!same_type || !same_shape)
          throw InvalidModel("initializer " + quote(in.name()) + " (" + std::string(dtype_name(v.dtype)) + " [" +
                             shape_string(v.shape) +
                             "]) shadows the graph input of the same name, declared with a different " +
                             (same_type ? "shape" : "type") + "; rename one of them or make them agree");
        continue;
      }
      if (in.type().value_case() == onnx::TypeProto::VALUE_NOT_SET)
        throw InvalidModel("graph input " + quote(in.name()) +
                           " declares no type (ONNX requires every graph input to " + "have one); re-export the model");
      Value v;
      v.name = in.name();
      v.kind = ValueKind::kInput;
      if (!declared.is_tensor) {
        result_.warnings.push_back("graph input " + quote(in.name()) +
                                   " is not a tensor (sequence/map/optional); its size is unknown");
        graph().mark_graph_input(graph().add_value(std::move(v)));
        continue;
      }
      v.dtype = declared.dtype;
      auto* shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
      const auto explicit_shape = std::find_if(options_.input_shapes.begin(), options_.input_shapes.end(),
                                               [&](const auto& s) { return s.first == in.name(); });
      if (explicit_shape != options_.input_shapes.end()) {
        used_shapes.insert(in.name());
        const auto& dims = explicit_shape->second;
        const std::string flag = "--shape " + in.name() + ":" + shape_string(dims);
        if (declared.has_shape && static_cast<size_t>(shape->dim_size()) != dims.size())
          throw InvalidArgument(flag + " has rank " + std::to_string(dims.size()) + " but input " + quote(in.name()) +
                                " has rank " + std::to_string(shape->dim_size()));
        if (!declared.has_shape)
          for (size_t i = 0; i < dims.size(); ++i) shape->add_dim();
        for (int i = 0; i < shape->dim_size(); ++i) {
          auto* dim = shape->mutable_dim(i);
          if (dim->has_dim_value() && dim->dim_value() != dims[i])
            throw InvalidArgument(flag + " sets dim " + std::to_string(i) + " of " + quote(in.name()) + " to " +
                                  std::to_string(dims[i]) + ", but the model fixes it at " +
                                  std::to_string(dim->dim_value()));
          if (dim->has_dim_param()) {
            bind(dim->dim_param(), dims[i], flag);
          } else if (!dim->has_dim_value()) {
            result_.bindings.push_back({in.name() + "[" + std::to_string(i) + "]", dims[i], flag});
          }
          dim->set_dim_value(dims[i]);
        }
      } else if (declared.has_shape) {
        for (int i = 0; i < shape->dim_size(); ++i) {
          auto* dim = shape->mutable_dim(i);
          if (dim->has_dim_value()) {
            if (dim->dim_value() < 0)
              throw InvalidModel("graph input " + quote(in.name()) + " has a negative dim " +
                                 std::to_string(dim->dim_value()));
            continue;
          }
          if (dim->has_dim_param()) {
            // "<k>*<name>" (as stage_K.onnx writes a dim that is k times the batch) follows from --dim name=…,
            // unless the flags bind it by its full name.
            const auto scaled = dims_.count(dim->dim_param()) ? std::nullopt : parse_scaled_dim(dim->dim_param());
            const std::string& name = scaled ? scaled->second : dim->dim_param();
            auto bound = dims_.find(name);
            if (bound == dims_.end())
              throw InvalidArgument("dynamic dim " + quote(dim->dim_param()) + " of input " + quote(in.name()) +
                                    " (axis " + std::to_string(i) + ") is not bound: pass " + dim_flags_needed(*shape) +
                                    ", or the input's whole shape, --shape " + printable(in.name()) + ":" +
                                    example_shape(*shape));
            used_dims.insert(name);
            const std::string source = name == batch_flag_dim_ ? "--batch " + std::to_string(bound->second)
                                                               : "--dim " + name + "=" + std::to_string(bound->second);
            bind(name, bound->second, source);
            const int64_t value = scaled ? checked_scaled_dim(scaled->first, bound->second, source) : bound->second;
            if (scaled) bind(dim->dim_param(), value, source);
            dim->set_dim_value(value);
          } else if (i == 0 && unnamed_batch_) {
            const std::string source = "--batch " + std::to_string(options_.batch);
            result_.bindings.push_back({in.name() + "[0]", options_.batch, source});
            dim->set_dim_value(options_.batch);
          } else {
            throw InvalidArgument("input " + quote(in.name()) + " has an unnamed dynamic dim at axis " +
                                  std::to_string(i) + ": pass its whole shape, --shape " + printable(in.name()) + ":" +
                                  example_shape(*shape));
          }
        }
      } else {
        throw InvalidArgument("input " + quote(in.name()) + " declares no shape: pass its full shape with --shape " +
                              in.name() + ":D0xD1x…");
      }
      v.shape.clear();
      for (const auto& dim : shape->dim()) v.shape.push_back(dim.dim_value());
      set_value_size(v);
      graph().mark_graph_input(graph().add_value(std::move(v)));
    }
    for (const auto& [name, dims] : options_.input_shapes) {
      if (used_shapes.count(name)) continue;
      std::string names;
      for (const auto& in : g.input())
        if (!graph().find_value(in.name()) || graph().value(*graph().find_value(in.name())).kind == ValueKind::kInput)
          names += (names.empty() ? "" : ", ") + in.name();
      throw InvalidArgument("--shape names " + quote(name) +
                            ", which is not an input of the model; its inputs are: " + names);
    }
    if (!rule.input.empty()) {
      const Value& first = graph().value(*graph().find_value(rule.input));
      if (!rule.symbol.empty())
        result_.batch = bound_.count(rule.symbol) ? bound_.at(rule.symbol) : 0;
      else if (first.shape_known && !first.shape.empty())
        result_.batch = first.shape[0];
      result_.batch_dim = !rule.symbol.empty() ? rule.symbol : rule.fixed < 0 ? rule.input + "[0]" : "";
      result_.batch_from_flag = !batch_flag_dim_.empty() || unnamed_batch_;
    }
    // Bind the same dim_params in graph outputs and value_info so declarations agree with inference.
    auto substitute = [&](onnx::ValueInfoProto& vi) {
      if (!vi.has_type() || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
      for (auto& dim : *vi.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
        if (!dim.has_dim_param()) continue;
        auto it = bound_.find(dim.dim_param());
        if (it != bound_.end()) {
          dim.set_dim_value(it->second);
        } else if (const auto scaled = parse_scaled_dim(dim.dim_param())) {
          auto base = bound_.find(scaled->second);
          if (base != bound_.end() && (base->second == 0 || scaled->first <= INT64_MAX / base->second))
            dim.set_dim_value(scaled->first * base->second);
        }
      }
    };
    for (auto& o : *g.mutable_output()) substitute(o);
    for (auto& vi : *g.mutable_value_info()) substitute(vi);
  }

 private:
  TaskGraph& graph() { return result_.graph; }

  // The batch dim by the kBatchDimNames rule (importer.h), among the graph inputs that are not initializers.
  struct BatchRule {
    std::string input;   // "" = no input with a leading dim
    std::string symbol;  // its dim_param; "" when unnamed or static
    int64_t fixed = -1;  // the model's own size, -1 when dynamic
  };
  BatchRule find_batch_dim(const onnx::GraphProto& g) {
    std::vector<const onnx::ValueInfoProto*> inputs;
    for (const auto& in : g.input())
      if (!graph().find_value(in.name()) && in.type().has_tensor_type() && in.type().tensor_type().has_shape())
        inputs.push_back(&in);
    for (const char* name : kBatchDimNames)
      for (const auto* in : inputs)
        for (const auto& d : in->type().tensor_type().shape().dim())
          if (d.has_dim_param() && d.dim_param() == name) return {in->name(), name, -1};
    for (const auto* in : inputs) {
      const auto& shape = in->type().tensor_type().shape();
      if (shape.dim_size() == 0) continue;
      const auto& d0 = shape.dim(0);
      if (d0.has_dim_param() && !d0.dim_param().empty()) return {in->name(), d0.dim_param(), -1};
      return {in->name(), "", d0.has_dim_value() ? d0.dim_value() : -1};
    }
    return {};
  }

  // ImportOptions::batch: puts the batch dim into dims_ unless --dim/--shape bind it (an explicit --batch
  // must then agree with them) or the model fixes it.
  void apply_batch_flag(const onnx::GraphProto& g, const BatchRule& rule) {
    const int64_t batch = options_.batch;
    if (batch <= 0 || rule.input.empty()) return;
    const std::string flag = "--batch " + std::to_string(batch);
    auto disagree = [&](const std::string& other) {
      if (options_.batch_explicit)
        throw InvalidArgument(flag + " and " + other + " disagree on the batch size; give one of them");
    };
    if (rule.fixed >= 0) {
      if (rule.fixed != batch && options_.batch_explicit)
        throw InvalidArgument("input " + quote(rule.input) + " has a static batch of " + std::to_string(rule.fixed) +
                              "; run with --batch " + std::to_string(rule.fixed) +
                              " (or export the model with a dynamic batch)");
      return;
    }
    if (!rule.symbol.empty()) {
      if (auto d = options_.dims.find(rule.symbol); d != options_.dims.end()) {
        if (d->second != batch) disagree("--dim " + rule.symbol + "=" + std::to_string(d->second));
        return;
      }
      // A --shape of an input that carries the symbol binds it.
      for (const auto& in : g.input())
        for (const auto& [name, dims] : options_.input_shapes) {
          if (name != in.name() || !in.type().has_tensor_type()) continue;
          const auto& shape = in.type().tensor_type().shape();
          for (int i = 0; i < shape.dim_size() && static_cast<size_t>(i) < dims.size(); ++i)
            if (shape.dim(i).dim_param() == rule.symbol) {
              if (dims[i] != batch) disagree("--shape " + name + ":" + shape_string(dims));
              return;
            }
        }
      dims_[rule.symbol] = batch;
      batch_flag_dim_ = rule.symbol;
      return;
    }
    for (const auto& [name, dims] : options_.input_shapes)
      if (name == rule.input) {
        if (!dims.empty() && dims[0] != batch) disagree("--shape " + name + ":" + shape_string(dims));
        return;
      }
    unnamed_batch_ = true;  // add_graph_inputs binds the unnamed leading dims
  }

  // "<k>*<name>" with k a positive integer → {k, name}; anything else → nullopt.
  static std::optional<std::pair<int64_t, std::string>> parse_scaled_dim(const std::string& param) {
    const size_t star = param.find('*');
    if (star == std::string::npos || star == 0 || star + 1 == param.size()) return std::nullopt;
    int64_t k = 0;
    for (size_t i = 0; i < star; ++i) {
      if (param[i] < '0' || param[i] > '9' || k > (INT64_MAX - 9) / 10) return std::nullopt;
      k = k * 10 + (param[i] - '0');
    }
    const std::string name = param.substr(star + 1);
    if (k < 1 || name.find('*') != std::string::npos) return std::nullopt;
    return std::pair{k, name};
  }

  static int64_t checked_scaled_dim(int64_t k, int64_t value, const std::string& source) {
    if (value > 0 && k > INT64_MAX / value)
      throw InvalidArgument(source + ": " + std::to_string(k) + "×" + std::to_string(value) + " overflows 64 bits");
    return k * value;
  }

  // The --dim name that binds `param`: itself, or for "<k>*<name>" the base name unless the flags name it in full.
  std::string dim_flag_name(const std::string& param) const {
    if (options_.dims.count(param)) return param;
    const auto scaled = parse_scaled_dim(param);
    return scaled ? scaled->second : param;
  }

  // The value the --dim flags give `param`, if any.
  std::optional<int64_t> dim_flag_value(const std::string& param) const {
    auto it = options_.dims.find(dim_flag_name(param));
    if (it == options_.dims.end()) return std::nullopt;
    const auto scaled = options_.dims.count(param) ? std::nullopt : parse_scaled_dim(param);
    if (!scaled) return it->second;
    if (it->second > 0 && scaled->first > INT64_MAX / it->second) return std::nullopt;
    return scaled->first * it->second;
  }

  // Every dim of the model's inputs a --dim flag may name; a --dim naming anything else is refused
  // before any other check, so the message is about that flag, not about a dim left unbound.
  void check_dim_flags_name_model_dims(const onnx::GraphProto& g) const {
    std::set<std::string> names;
    for (const auto& in : g.input()) {
      if (!in.has_type() || !in.type().has_tensor_type() || !in.type().tensor_type().has_shape()) continue;
      for (const auto& dim : in.type().tensor_type().shape().dim()) {
        if (!dim.has_dim_param()) continue;
        names.insert(dim.dim_param());
        if (const auto scaled = parse_scaled_dim(dim.dim_param())) names.insert(scaled->second);
      }
    }
    for (const auto& [name, value] : options_.dims) {
      if (names.count(name)) continue;
      std::string list;
      for (const auto& p : names) list += (list.empty() ? "" : ", ") + printable(p);
      throw InvalidArgument(
          "--dim " + printable(name) + "=" + std::to_string(value) + ": the model has no dim " + quote(name) +
          (list.empty() ? std::string(" (its inputs have no named dynamic dims; use --shape NAME:D0xD1x…)")
                        : "; its dims are: " + list));
    }
  }

  // "--dim batch=<size> --dim feat=<size>": the flags that bind every named dim of `shape` still unbound.
  std::string dim_flags_needed(const onnx::TensorShapeProto& shape) const {
    std::vector<std::string> flags;
    for (const auto& d : shape.dim()) {
      if (!d.has_dim_param() || d.has_dim_value() || dim_flag_value(d.dim_param())) continue;
      const std::string flag = "--dim " + printable(dim_flag_name(d.dim_param())) + "=<size>";
      if (std::find(flags.begin(), flags.end(), flag) == flags.end()) flags.push_back(flag);
    }
    std::string out;
    for (const auto& f : flags) out += (out.empty() ? "" : " ") + f;
    return out;
  }

  // "4x<feat>x<axis2>" for --shape: fixed and flag-bound dims as numbers, the rest as placeholders.
  std::string example_shape(const onnx::TensorShapeProto& shape) const {
    std::string s;
    for (int i = 0; i < shape.dim_size(); ++i) {
      if (i) s += 'x';
      const auto& d = shape.dim(i);
      if (d.has_dim_value())
        s += std::to_string(d.dim_value());
      else if (!d.has_dim_param())
        s += "<axis" + std::to_string(i) + ">";
      else if (const auto v = dim_flag_value(d.dim_param()))
        s += std::to_string(*v);
      else
        s += "<" + printable(d.dim_param()) + ">";
    }
    return s;
  }

  void bind(const std::string& dim, int64_t value, const std::string& source) {
    if (value < 0) throw InvalidArgument(source + ": dims must be non-negative");
    auto [it, inserted] = bound_.emplace(dim, value);
    if (!inserted && it->second != value)
      throw InvalidArgument("dim " + quote(dim) + " is bound to both " + std::to_string(it->second) + " and " +
                            std::to_string(value) + " (" + source + ")");
    if (inserted) result_.bindings.push_back({dim, value, source});
  }

  const ImportOptions& options_;
  ImportedModel& result_;
  std::map<std::string, int64_t> dims_;  // --dim, plus the batch dim when --batch binds it
  std::string batch_flag_dim_;           // the dim_param --batch bound, if any
  bool unnamed_batch_ = false;           // --batch binds the inputs' unnamed leading dims
  std::map<std::string, int64_t> bound_;
};

}  // namespace

void bind_graph_inputs(onnx::GraphProto& g, const ImportOptions& options, ImportedModel& result) {
  InputBinder(options, result).run(g);
}

std::pair<std::string, std::vector<int64_t>> parse_shape_flag(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InvalidArgument("--shape " + quote(text) + ": expected NAME:D0xD1x… (e.g. input:8x3x224x224)");
  std::string name = text.substr(0, colon);
  std::string dims_text = text.substr(colon + 1);
  std::vector<int64_t> dims;
  if (dims_text == "scalar" || dims_text.empty()) return {name, dims};
  std::stringstream ss(dims_text);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || errno == ERANGE || v < 0)
      throw InvalidArgument("--shape " + quote(text) + ": dim " + quote(part) + " is not a non-negative integer");
    checked_integer(static_cast<int64_t>(v), 0, limits::kMaxDim, "--shape " + quote(text) + ": dim " + quote(part));
    dims.push_back(v);
  }
  if (!dims_text.empty() && dims_text.back() == 'x') throw InvalidArgument("--shape " + quote(text) + ": trailing 'x'");
  return {name, dims};
}

std::pair<std::string, int64_t> parse_dim_flag(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw InvalidArgument("--dim " + quote(text) + ": expected NAME=VALUE (e.g. batch=8)");
  const std::string value = text.substr(eq + 1);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || v < 0)
    throw InvalidArgument("--dim " + quote(text) + ": " + quote(value) + " is not a positive integer");
  // A dim bound to 0 makes every tensor that carries it empty: nothing to plan or train.
  checked_integer(static_cast<int64_t>(v), 1, limits::kMaxDim, "--dim " + quote(text) + ": the value");
  return {text.substr(0, eq), v};
}

}  // namespace apart
