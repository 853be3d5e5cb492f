// layer_of_path and layer_stack: layers read from module paths (docs/export.md).
#include "graph/module_layers.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace apart {
namespace {

// Digits after a '.' or '_' ("h.3", "layers.12", "block_2"), or digits alone ("3"): an element of a module list.
bool is_indexed(std::string_view component) {
  size_t i = component.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(component[i - 1]))) --i;
  if (i == component.size()) return false;
  return i == 0 || component[i - 1] == '.' || component[i - 1] == '_';
}

// The index at the end of an indexed layer name ("blocks.12" → 12) and its container ("blocks"; "model/layers").
std::pair<std::string, long> split_index(const std::string& layer) {
  size_t i = layer.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(layer[i - 1]))) --i;
  const long index = std::stol(layer.substr(i, 18));
  std::string container = layer.substr(0, i);
  if (!container.empty() && (container.back() == '.' || container.back() == '_')) container.pop_back();
  return {container, index};
}

// The module of a task outside the stack, at the stack's level: under the stack's parent ("model/layers" →
// "model"), the parent and the next component ("/model/norm/Mul" → "model/norm"); elsewhere the first component
// ("/lm_head/MatMul" → "lm_head"); "" for a path with no scope ("/Reshape").
std::string sibling_module(std::string_view path, const std::string& parent) {
  std::string scope(path.substr(0, path.rfind('/') == std::string_view::npos ? 0 : path.rfind('/')));
  while (!scope.empty() && scope.front() == '/') scope.erase(scope.begin());
  if (scope.empty()) return "";
  const std::string prefix = parent.empty() ? "" : parent + "/";
  const size_t from = !prefix.empty() && scope.rfind(prefix, 0) == 0 ? prefix.size() : 0;
  const size_t slash = scope.find('/', from);
  return slash == std::string::npos ? scope : scope.substr(0, slash);
}

}  // namespace

std::string layer_of_path(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    if (end > start) parts.push_back(path.substr(start, end - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  if (parts.size() < 2) return "";  // the last component is the op itself
  parts.pop_back();
  std::string layer;
  for (std::string_view part : parts) {
    layer += (layer.empty() ? "" : "/") + std::string(part);
    if (is_indexed(part)) return layer;
  }
  return std::string(parts.front());
}

std::string module_fqn(std::string_view layer) {
  std::string fqn(layer);
  std::replace(fqn.begin(), fqn.end(), '/', '.');
  return fqn;
}

LayerStack layer_stack(const std::vector<std::string>& paths) {
  LayerStack stack;
  std::vector<std::string> layer(paths.size());
  std::map<std::string, std::map<long, std::string>> children;  // container → index → layer
  std::vector<std::string> containers;                          // in order first seen
  for (size_t i = 0; i < paths.size(); ++i) {
    layer[i] = layer_of_path(paths[i]);
    const std::string last = layer[i].substr(layer[i].rfind('/') == std::string::npos ? 0 : layer[i].rfind('/') + 1);
    if (layer[i].empty() || !is_indexed(last)) continue;
    const auto [container, index] = split_index(layer[i]);
    if (!children.count(container)) containers.push_back(container);
    children[container].emplace(index, layer[i]);
  }
  size_t most = 1;
  for (const std::string& c : containers)
    if (children[c].size() > most) {
      most = children[c].size();
      stack.container = c;
    }
  stack.position.assign(paths.size(), kBeforeLayers);
  if (stack.container.empty()) return stack;
  std::map<std::string, int> index_of;
  for (const auto& [index, name] : children[stack.container]) {
    index_of[name] = static_cast<int>(stack.layers.size());
    stack.layers.push_back(name);
  }
  const int count = static_cast<int>(stack.layers.size());
  size_t last_in_stack = 0;
  for (size_t i = 0; i < paths.size(); ++i)
    if (index_of.count(layer[i])) last_in_stack = i;
  const std::string parent = stack.container.rfind('/') == std::string::npos
                                 ? std::string()
                                 : stack.container.substr(0, stack.container.rfind('/'));
  int current = kBeforeLayers;
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto it = index_of.find(layer[i]);
    if (it != index_of.end()) current = it->second;
    stack.position[i] = it != index_of.end() ? it->second : i > last_in_stack ? count : current;
    std::vector<std::string>* outside = stack.position[i] == kBeforeLayers ? &stack.before
                                        : stack.position[i] == count       ? &stack.after
                                                                           : nullptr;
    const std::string module = outside ? sibling_module(paths[i], parent) : "";
    if (outside && std::find(outside->begin(), outside->end(), module) == outside->end()) outside->push_back(module);
  }
  return stack;
}

}  // namespace apart
