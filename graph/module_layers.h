// The layers of a model from its nodes' module paths ("/h.3/attn/MatMul", "/model/layers.12/mlp/..."): the layer
// a path belongs to, and the model's stack of repeated layers with every task placed before, in or after it. What
// the report names stage ends by, what `apart export` cuts at and what `apart partition --target` keeps cuts to.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace apart {

// The layer of a module path: the path up to and including its first indexed component ("h.3", "layers.12", "3",
// "block_2": digits after '.' or '_', or digits alone), "/"-joined without the leading slash ("/h.3/attn/qkv/MatMul"
// → "h.3", "/model/layers.12/mlp/fc1/MatMul" → "model/layers.12"); without an indexed component, the first
// component ("/wte/Gather" → "wte"); "" for a path with no scope (the last component is the op: "/Constant",
// "MatMul_7").
std::string layer_of_path(std::string_view path);

// A layer as a module's fully qualified name in torch: "model/layers.12" → "model.layers.12".
std::string module_fqn(std::string_view layer);

// The model's stack of repeated layers and where each task sits against it.
struct LayerStack {
  std::string container;            // the layers' common parent, "/"-joined ("blocks", "model/layers")
  std::vector<std::string> layers;  // the stack's layers by index: "blocks.0", "blocks.1", …
  // Per task (the order given): its layer's index in `layers`; kBeforeLayers for tasks that run before the stack's
  // first task (the embeddings), layers.size() for tasks after its last (final norm, head, loss). A task outside the
  // stack between two of its layers (an unscoped Constant, a skip connection) belongs to the layer before it.
  std::vector<int> position;
  // The modules before and after the stack, at the stack's level ("model/embed_tokens", "wte"; "lm_head"), in the
  // order first seen; "" for tasks with no scope (a loss op at the top level).
  std::vector<std::string> before, after;
  bool empty() const { return layers.empty(); }
};
inline constexpr int kBeforeLayers = -1;

// The stack of `paths` (each task's module path, in topological order): the container whose indexed children
// appear most often (at least two distinct indices; ties: the first seen), its layers ordered by index. Empty (no
// layers, every position kBeforeLayers) when no container has two indexed children: a model without module names.
LayerStack layer_stack(const std::vector<std::string>& paths);

}  // namespace apart
