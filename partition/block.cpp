// Block level (paper §IV-B): coarsen → initial partition (the coarsest nodes, compacted to k blocks) → uncoarsen +
// refine → a contiguous fallback when a block still breaks a cap. Every block is balanced in two weights at once,
// like METIS's multi-constraint partitioning (ncon = 2, Karypis & Kumar, SC 1998): time, and memory (weights with
// their gradients and optimizer state, plus saved activations); a merge or move happens only when both stay under
// their caps. Memory is not additive: a weight read by several nodes of a block counts once.
// Acyclicity: nodes are merged only when adjacent in a topological order of the current level, so every quotient
// edge points forward in that order; refinement moves a node to the next (previous) block only when none of its
// successors (predecessors) stays in its block, which keeps every edge forward.
#include "partition/block.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>

#include "graph/error.h"
#include "partition/stage_cost.h"

namespace apart {
namespace {

struct Edge {
  uint32_t from, to;
  double bytes;
};

// Per-component weights at the reference micro-batch, and the weights (parameters) each component reads.
struct ComponentWeights {
  std::vector<double> time_s;
  std::vector<double> activation_bytes;
  std::vector<std::vector<uint32_t>> params;  // indices into param_bytes, sorted, unique
  std::vector<int64_t> param_bytes;           // per weight, as stored in the model
  double state_per_param_byte = 0;            // weights + gradients + optimizer state per stored byte
};

ComponentWeights component_weights(const AtomicGraph& atomic, const TrainingSpec& training, double u) {
  ComponentWeights w;
  const size_t n = atomic.size();
  w.time_s.resize(n);
  w.activation_bytes.resize(n);
  w.params.resize(n);
  for (size_t c = 0; c < n; ++c) {
    const BlockCost& cost = atomic.components[c].cost;
    w.time_s[c] = cost.forward.at(u) + cost.backward.at(u);
    // As StageEvaluator::evaluate: the cost table's saved bytes are at the run's precision already.
    w.activation_bytes[c] = cost.saved_per_sample * u;
  }
  // As make_block_sequence: the weights come from the ParamUse list, each counted once per block reading it.
  for (const ParamUse& p : atomic.params) {
    const uint32_t index = static_cast<uint32_t>(w.param_bytes.size());
    w.param_bytes.push_back(p.bytes);
    for (uint32_t c : p.readers) w.params[c].push_back(index);
  }
  w.state_per_param_byte = state_bytes_per_param_byte(training.optimizer, training.precision);
  return w;
}

int64_t param_bytes_of(const ComponentWeights& w, const std::vector<uint32_t>& params) {
  int64_t bytes = 0;
  for (uint32_t p : params) bytes += w.param_bytes[p];
  return bytes;
}

BlockWeight weight_of(const ComponentWeights& w, double time_s, double activation_bytes, int64_t param_bytes) {
  return {time_s, activation_bytes + w.state_per_param_byte * static_cast<double>(param_bytes)};
}

BlockWeight weight_of_components(const ComponentWeights& cw, const std::vector<uint32_t>& components) {
  double time = 0, activation = 0;
  std::vector<uint32_t> params;
  for (uint32_t c : components) {
    time += cw.time_s[c];
    activation += cw.activation_bytes[c];
    params.insert(params.end(), cw.params[c].begin(), cw.params[c].end());
  }
  std::sort(params.begin(), params.end());
  params.erase(std::unique(params.begin(), params.end()), params.end());
  return weight_of(cw, time, activation, param_bytes_of(cw, params));
}

std::vector<BlockWeight> weights_of_blocks(const ComponentWeights& cw, const BlockAssignment& assignment) {
  std::vector<std::vector<uint32_t>> members(assignment.blocks);
  for (uint32_t c = 0; c < assignment.block_of.size(); ++c) members[assignment.block_of[c].value()].push_back(c);
  std::vector<BlockWeight> weights;
  weights.reserve(members.size());
  for (const auto& m : members) weights.push_back(weight_of_components(cw, m));
  return weights;
}

// The graph of one level: node weights and forward edges (from < to in the level's order).
struct LevelGraph {
  std::vector<double> time_s, activation_bytes;
  std::vector<std::vector<uint32_t>> params;  // distinct weights read by the node's components, sorted
  std::vector<std::vector<std::pair<uint32_t, double>>> succ, pred;
  size_t size() const { return time_s.size(); }
};

LevelGraph make_level_graph(const ComponentWeights& cw, const std::vector<Edge>& edges,
                            const std::vector<uint32_t>& node_of, uint32_t nodes) {
  LevelGraph g;
  g.time_s.assign(nodes, 0);
  g.activation_bytes.assign(nodes, 0);
  g.params.resize(nodes);
  g.succ.resize(nodes);
  g.pred.resize(nodes);
  for (size_t c = 0; c < node_of.size(); ++c) {
    const uint32_t x = node_of[c];
    g.time_s[x] += cw.time_s[c];
    g.activation_bytes[x] += cw.activation_bytes[c];
    g.params[x].insert(g.params[x].end(), cw.params[c].begin(), cw.params[c].end());
  }
  for (auto& p : g.params) {
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  std::vector<Edge> agg;
  agg.reserve(edges.size());
  for (const Edge& e : edges) {
    const uint32_t a = node_of[e.from], b = node_of[e.to];
    if (a != b) agg.push_back({a, b, e.bytes});
  }
  std::sort(agg.begin(), agg.end(), [](const Edge& x, const Edge& y) {
    return x.from != y.from ? x.from < y.from : x.to < y.to;
  });
  for (size_t i = 0; i < agg.size();) {
    size_t j = i;
    double bytes = 0;
    while (j < agg.size() && agg[j].from == agg[i].from && agg[j].to == agg[i].to) bytes += agg[j++].bytes;
    g.succ[agg[i].from].push_back({agg[i].to, bytes});
    g.pred[agg[i].to].push_back({agg[i].from, bytes});
    i = j;
  }
  return g;
}

// Weight of nodes x and y together: their weights added, each distinct parameter once.
BlockWeight merged_weight(const ComponentWeights& cw, const LevelGraph& g, uint32_t x, uint32_t y) {
  std::vector<uint32_t> both;
  std::set_union(g.params[x].begin(), g.params[x].end(), g.params[y].begin(), g.params[y].end(),
                 std::back_inserter(both));
  return weight_of(cw, g.time_s[x] + g.time_s[y], g.activation_bytes[x] + g.activation_bytes[y],
                   param_bytes_of(cw, both));
}

// A labelling of one level's nodes into blocks with each block's weights, kept current under moves. A weight's
// bytes count in a block while at least one of the block's nodes reads it.
class LevelBlocks {
 public:
  LevelBlocks(const ComponentWeights& cw, const LevelGraph& g, std::vector<uint32_t> block_of, uint32_t blocks)
      : cw_(cw), g_(g), block_of_(std::move(block_of)), time_(blocks, 0), activation_(blocks, 0),
        param_bytes_(blocks, 0), nodes_(blocks, 0), holders_(cw.param_bytes.size()) {
    for (uint32_t x = 0; x < g.size(); ++x) add(x, block_of_[x]);
  }
  uint32_t block_of(uint32_t x) const { return block_of_[x]; }
  uint32_t blocks() const { return static_cast<uint32_t>(time_.size()); }
  uint32_t nodes_in(uint32_t b) const { return nodes_[b]; }
  const std::vector<uint32_t>& labels() const { return block_of_; }
  BlockWeight weight(uint32_t b) const { return weight_of(cw_, time_[b], activation_[b], param_bytes_[b]); }
  // Block b's weight after node x (of b) leaves it / after node x (not of b) joins it.
  BlockWeight weight_without(uint32_t x, uint32_t b) const {
    int64_t bytes = param_bytes_[b];
    for (uint32_t p : g_.params[x])
      if (holders(p, b) == 1) bytes -= cw_.param_bytes[p];
    return weight_of(cw_, time_[b] - g_.time_s[x], activation_[b] - g_.activation_bytes[x], bytes);
  }
  BlockWeight weight_with(uint32_t x, uint32_t b) const {
    int64_t bytes = param_bytes_[b];
    for (uint32_t p : g_.params[x])
      if (holders(p, b) == 0) bytes += cw_.param_bytes[p];
    return weight_of(cw_, time_[b] + g_.time_s[x], activation_[b] + g_.activation_bytes[x], bytes);
  }
  void move(uint32_t x, uint32_t to) {
    remove(x, block_of_[x]);
    block_of_[x] = to;
    add(x, to);
  }

 private:
  // Nodes of block b that read parameter p. A parameter is read by few blocks: a short list per parameter.
  uint32_t holders(uint32_t p, uint32_t b) const {
    for (auto [block, count] : holders_[p])
      if (block == b) return count;
    return 0;
  }
  void add(uint32_t x, uint32_t b) {
    time_[b] += g_.time_s[x];
    activation_[b] += g_.activation_bytes[x];
    ++nodes_[b];
    for (uint32_t p : g_.params[x]) {
      auto& list = holders_[p];
      auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == b; });
      if (it == list.end()) {
        list.push_back({b, 1});
        param_bytes_[b] += cw_.param_bytes[p];
      } else {
        ++it->second;
      }
    }
  }
  void remove(uint32_t x, uint32_t b) {
    time_[b] -= g_.time_s[x];
    activation_[b] -= g_.activation_bytes[x];
    --nodes_[b];
    for (uint32_t p : g_.params[x]) {
      auto& list = holders_[p];
      auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == b; });
      APART_CHECK(it != list.end(), "block weights lost track of a parameter");
      if (--it->second == 0) {
        list.erase(it);
        param_bytes_[b] -= cw_.param_bytes[p];
      }
    }
  }

  const ComponentWeights& cw_;
  const LevelGraph& g_;
  std::vector<uint32_t> block_of_;
  std::vector<double> time_, activation_;
  std::vector<int64_t> param_bytes_;
  std::vector<uint32_t> nodes_;
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> holders_;  // per parameter: (block, nodes reading it)
};

// One coarsening step: match adjacent pairs (x, x+1) by gain t(a)+t(b)+comm(a,b)−t(a∪b) = comm(a,b) (times are
// additive), heaviest communication first (ties: the lighter pair), when the pair is within both caps.
CoarseLevel coarsen_once(const ComponentWeights& cw, const LevelGraph& g, const BlockCaps& caps, uint32_t min_nodes) {
  const uint32_t n = static_cast<uint32_t>(g.size());
  struct Pair {
    uint32_t left;
    double gain, load;
  };
  std::vector<Pair> pairs;
  for (uint32_t x = 0; x + 1 < n; ++x) {
    double comm = 0;
    for (auto [to, bytes] : g.succ[x])
      if (to == x + 1) comm = bytes;
    const BlockWeight w = merged_weight(cw, g, x, x + 1);
    if (caps.admits(w)) pairs.push_back({x, comm, caps.load(w)});
  }
  std::sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
    if (a.gain != b.gain) return a.gain > b.gain;
    if (a.load != b.load) return a.load < b.load;
    return a.left < b.left;
  });
  std::vector<char> matched(n, 0);
  std::vector<char> merge_with_next(n, 0);
  uint32_t remaining = n;
  for (const Pair& p : pairs) {
    if (remaining <= min_nodes) break;  // never coarser than k: the DP needs k blocks
    if (matched[p.left] || matched[p.left + 1]) continue;
    --remaining;
    matched[p.left] = matched[p.left + 1] = 1;
    merge_with_next[p.left] = 1;
  }
  CoarseLevel level;
  level.parent_of.resize(n);
  uint32_t next = 0;
  for (uint32_t x = 0; x < n; ++x) {
    level.parent_of[x] = next;
    if (merge_with_next[x]) level.parent_of[++x] = next;
    ++next;
  }
  level.nodes = next;
  return level;
}

// Initial partition: the coarsest nodes, merged pairwise while there are more than k. Merging neighbours in the
// order keeps every edge forward; the pair whose union has the least load goes first (ties: the later pair, so
// the first blocks stay fine: under 1F1B the first stages keep the most micro-batches in flight, so memory places
// their cuts). Uncoarsening then moves nodes out of any block this pushes over a cap.
std::vector<uint32_t> initial_partition(const ComponentWeights& cw, const LevelGraph& g, const BlockCaps& caps,
                                        uint32_t k) {
  const uint32_t n = static_cast<uint32_t>(g.size());
  std::vector<uint32_t> block_of(n);
  std::iota(block_of.begin(), block_of.end(), 0u);
  if (n <= k) return block_of;
  // Blocks as runs of nodes, their weights recomputed per candidate pair: cheap, since coarsening stops only when
  // every adjacent pair breaks a cap (1.5 × total / k), which leaves fewer than about 3k nodes.
  std::vector<double> time(g.time_s), activation(g.activation_bytes);
  std::vector<std::vector<uint32_t>> params(g.params);
  auto union_weight = [&](size_t a, size_t b) {
    std::vector<uint32_t> both;
    std::set_union(params[a].begin(), params[a].end(), params[b].begin(), params[b].end(), std::back_inserter(both));
    return std::pair{weight_of(cw, time[a] + time[b], activation[a] + activation[b], param_bytes_of(cw, both)), both};
  };
  std::vector<uint32_t> first_node(n);  // run b starts at node first_node[b]
  std::iota(first_node.begin(), first_node.end(), 0u);
  std::vector<double> pair_load(n - 1);
  for (size_t b = 0; b + 1 < n; ++b) pair_load[b] = caps.load(union_weight(b, b + 1).first);
  while (time.size() > k) {
    size_t best = 0;
    for (size_t b = 1; b + 1 < time.size(); ++b)
      if (pair_load[b] <= pair_load[best]) best = b;
    params[best] = union_weight(best, best + 1).second;
    time[best] += time[best + 1];
    activation[best] += activation[best + 1];
    const auto at = static_cast<std::ptrdiff_t>(best) + 1;
    time.erase(time.begin() + at);
    activation.erase(activation.begin() + at);
    params.erase(params.begin() + at);
    first_node.erase(first_node.begin() + at);
    pair_load.erase(pair_load.begin() + at - 1);
    if (best > 0) pair_load[best - 1] = caps.load(union_weight(best - 1, best).first);
    if (best + 1 < time.size()) pair_load[best] = caps.load(union_weight(best, best + 1).first);
  }
  for (uint32_t b = 0, x = 0; b < time.size(); ++b) {
    const uint32_t end = b + 1 < time.size() ? first_node[b + 1] : n;
    for (; x < end; ++x) block_of[x] = b;
  }
  return block_of;
}

// Refinement at one level: move boundary nodes between neighbouring blocks p and p ± 1, keeping every edge forward
// and the receiving block within both caps, when (1) p breaks a cap and the move lightens it (balance comes
// first, as in METIS), (2) it cuts communication, or (3) at equal cut, p stays the heavier of the two.
int refine(const LevelGraph& g, LevelBlocks& blocks, const BlockCaps& caps, int passes) {
  const uint32_t n = static_cast<uint32_t>(g.size());
  const uint32_t block_count = blocks.blocks();
  int moves = 0;
  for (int pass = 0; pass < passes; ++pass) {
    int moved = 0;
    for (uint32_t x = 0; x < n; ++x) {
      const uint32_t p = blocks.block_of(x);
      if (blocks.nodes_in(p) <= 1) continue;  // a move never empties a block
      bool succ_in_p = false, pred_in_p = false;
      double to_next = 0, to_prev = 0, inside = 0;
      for (auto [y, bytes] : g.succ[x]) {
        if (blocks.block_of(y) == p) { succ_in_p = true; inside += bytes; }
        else if (blocks.block_of(y) == p + 1) to_next += bytes;
      }
      for (auto [y, bytes] : g.pred[x]) {
        if (blocks.block_of(y) == p) { pred_in_p = true; inside += bytes; }
        else if (p > 0 && blocks.block_of(y) == p - 1) to_prev += bytes;
      }
      const double p_load = caps.load(blocks.weight(p));
      const double p_load_after = caps.load(blocks.weight_without(x, p));
      auto worth = [&](uint32_t q, double gain) {
        const BlockWeight q_after = blocks.weight_with(x, q);
        if (!caps.admits(q_after)) return false;
        if (p_load > 1 && p_load_after < p_load) return true;
        if (gain > 0) return true;
        return gain == 0 && p_load_after > caps.load(q_after);  // strictly more even
      };
      uint32_t target = p;
      if (!succ_in_p && p + 1 < block_count && worth(p + 1, to_next - inside)) target = p + 1;
      else if (!pred_in_p && p > 0 && worth(p - 1, to_prev - inside)) target = p - 1;
      if (target != p) {
        blocks.move(x, target);
        ++moved;
      }
    }
    moves += moved;
    if (moved == 0) break;
  }
  return moves;
}

// The fallback: k contiguous runs of the components' (topological) order, each within both caps, with the least
// communication across run boundaries (Σ over boundaries of the bytes crossing it). Exact DP; empty when no such
// split exists. run_end[i] (the longest feasible run from i) never decreases with i, so the window of feasible
// run starts for each end slides forward and a monotone deque gives the DP's minimum in O(k·n).
std::vector<uint32_t> contiguous_split(const AtomicGraph& atomic, const ComponentWeights& cw, const BlockCaps& caps,
                                       uint32_t k) {
  const size_t n = atomic.size();
  // run_end[i]: the largest j with components [i, j) within both caps (two pointers, parameter reader counts).
  std::vector<size_t> run_end(n + 1, n);
  {
    std::vector<uint32_t> readers(cw.param_bytes.size(), 0);
    double time = 0, activation = 0;
    int64_t bytes = 0;
    size_t j = 0;
    for (size_t i = 0; i < n; ++i) {
      if (j < i) j = i;
      while (j < n) {
        int64_t more = 0;
        for (uint32_t p : cw.params[j])
          if (readers[p] == 0) more += cw.param_bytes[p];
        if (!caps.admits(weight_of(cw, time + cw.time_s[j], activation + cw.activation_bytes[j], bytes + more))) break;
        time += cw.time_s[j];
        activation += cw.activation_bytes[j];
        bytes += more;
        for (uint32_t p : cw.params[j]) ++readers[p];
        ++j;
      }
      run_end[i] = j;
      if (j > i) {  // drop component i from the window
        time -= cw.time_s[i];
        activation -= cw.activation_bytes[i];
        for (uint32_t p : cw.params[i])
          if (--readers[p] == 0) bytes -= cw.param_bytes[p];
      }
    }
  }
  // Fewest runs: greedy longest runs from the front. More than k: no split exists (fewer: runs can be split).
  uint32_t fewest = 0;
  for (size_t i = 0; i < n; i = run_end[i], ++fewest)
    if (run_end[i] == i) return {};  // component i alone breaks a cap
  if (fewest > k || k > n) return {};
  // cut[j]: bytes per sample crossing the boundary before component j.
  std::vector<double> cut(n + 1, 0);
  for (const Transfer& t : atomic.transfers) {
    cut[t.producer + 1] += t.bytes_per_sample;
    cut[t.consumers.back() + 1] -= t.bytes_per_sample;
  }
  for (size_t j = 1; j <= n; ++j) cut[j] += cut[j - 1];
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[b][j]: least cost of splitting [0, j) into b runs; from[b][j]: where the last run starts.
  std::vector<double> previous(n + 1, kInf), current(n + 1, kInf);
  std::vector<std::vector<uint32_t>> from(k + 1, std::vector<uint32_t>(n + 1, 0));
  previous[0] = 0;
  for (uint32_t b = 1; b <= k; ++b) {
    std::fill(current.begin(), current.end(), kInf);
    std::deque<size_t> window;  // run starts i, increasing, with increasing cost(i)
    size_t next_start = 0;
    auto cost = [&](size_t i) { return previous[i] + (i > 0 ? cut[i] : 0.0); };
    for (size_t j = 1; j <= n; ++j) {
      // Starts i < j become candidates as j passes them; a start leaves once its longest run ends before j.
      while (next_start < j) {
        if (std::isfinite(previous[next_start])) {
          while (!window.empty() && cost(window.back()) >= cost(next_start)) window.pop_back();
          window.push_back(next_start);
        }
        ++next_start;
      }
      while (!window.empty() && run_end[window.front()] < j) window.pop_front();
      if (!window.empty()) {
        current[j] = cost(window.front());
        from[b][j] = static_cast<uint32_t>(window.front());
      }
    }
    std::swap(previous, current);
  }
  if (!std::isfinite(previous[n])) return {};
  std::vector<uint32_t> block_of(n);
  size_t end = n;
  for (uint32_t b = k; b >= 1; --b) {
    const size_t start = from[b][end];
    for (size_t c = start; c < end; ++c) block_of[c] = b - 1;
    end = start;
  }
  return block_of;
}

}  // namespace

double BlockCaps::load(const BlockWeight& w) const {
  const double t = time_s > 0 ? w.time_s / time_s : 0.0;
  const double m = memory_bytes > 0 ? w.memory_bytes / memory_bytes : 0.0;
  return std::max(t, m);
}

BlockWeight block_weight_of(const AtomicGraph& atomic, const std::vector<uint32_t>& components,
                            const TrainingSpec& training, double reference_microbatch) {
  return weight_of_components(component_weights(atomic, training, reference_microbatch), components);
}

std::vector<BlockWeight> block_weights(const AtomicGraph& atomic, const BlockAssignment& assignment,
                                       const TrainingSpec& training, double reference_microbatch) {
  return weights_of_blocks(component_weights(atomic, training, reference_microbatch), assignment);
}

BlockCaps block_caps(const AtomicGraph& atomic, int k, const BlockOptions& options, const TrainingSpec& training,
                     double reference_microbatch) {
  std::vector<uint32_t> all(atomic.size());
  std::iota(all.begin(), all.end(), 0u);
  const BlockWeight total = weight_of_components(component_weights(atomic, training, reference_microbatch), all);
  BlockCaps caps;
  caps.time_s = total.time_s > 0 ? options.balance_cap * total.time_s / k : 0;
  caps.memory_bytes = total.memory_bytes > 0 ? options.balance_cap * total.memory_bytes / k : 0;
  return caps;
}

int automatic_block_count(size_t components, int devices) {
  // Fine enough that the DP can place a cut at most layer boundaries of 100-layer models and use up to k
  // stages; coarse enough that the DP (O(S·k²) per probe) stays well under a second. See docs.
  (void)devices;
  return static_cast<int>(std::min<size_t>(components, 64));
}

BlockAssignment build_blocks(const AtomicGraph& atomic, int k, const BlockOptions& options,
                             const TrainingSpec& training, double reference_microbatch, BlockStatistics* stats) {
  const size_t n = atomic.size();
  APART_CHECK(k >= 1, "block count must be positive");
  const ComponentWeights cw = component_weights(atomic, training, reference_microbatch);
  const BlockCaps caps = block_caps(atomic, k, options, training, reference_microbatch);
  std::vector<Edge> edges;
  for (const Transfer& t : atomic.transfers)
    for (uint32_t c : t.consumers) edges.push_back({t.producer, c, t.bytes_per_sample});

  // ---------------- Coarsening ----------------
  std::vector<CoarseLevel> hierarchy;
  std::vector<uint32_t> node_of(n);  // component → node of the coarsest level so far
  std::iota(node_of.begin(), node_of.end(), 0u);
  uint32_t nodes = static_cast<uint32_t>(n);
  while (nodes > static_cast<uint32_t>(k)) {
    const LevelGraph g = make_level_graph(cw, edges, node_of, nodes);
    CoarseLevel level = coarsen_once(cw, g, caps, static_cast<uint32_t>(k));
    if (level.nodes == nodes) break;  // the caps stop every merge; the initial partition finishes the job
    for (auto& x : node_of) x = level.parent_of[x];
    nodes = level.nodes;
    hierarchy.push_back(std::move(level));
  }

  // ---------------- Initial partition: the coarsest nodes, compacted to k blocks ----------------
  LevelGraph coarsest = make_level_graph(cw, edges, node_of, nodes);
  std::vector<uint32_t> block_of_node = initial_partition(cw, coarsest, caps, static_cast<uint32_t>(k));
  const uint32_t block_count = block_of_node.empty() ? 0 : block_of_node.back() + 1;

  // ---------------- Uncoarsening with boundary refinement (the coarsest level first) ----------------
  int moves = 0;
  {
    LevelBlocks blocks(cw, coarsest, std::move(block_of_node), block_count);
    moves += refine(coarsest, blocks, caps, options.refinement_passes);
    block_of_node = blocks.labels();
  }
  for (size_t l = hierarchy.size(); l-- > 0;) {
    // Project: nodes of level l's finer side inherit their parent's block.
    const CoarseLevel& level = hierarchy[l];
    std::vector<uint32_t> finer_block(level.parent_of.size());
    for (size_t x = 0; x < level.parent_of.size(); ++x) finer_block[x] = block_of_node[level.parent_of[x]];
    // Component → finer node: levels 0..l-1 applied to the identity.
    std::vector<uint32_t> comp_to_finer(n);
    std::iota(comp_to_finer.begin(), comp_to_finer.end(), 0u);
    for (size_t j = 0; j < l; ++j)
      for (auto& x : comp_to_finer) x = hierarchy[j].parent_of[x];
    const LevelGraph g = make_level_graph(cw, edges, comp_to_finer, static_cast<uint32_t>(finer_block.size()));
    LevelBlocks blocks(cw, g, std::move(finer_block), block_count);
    moves += refine(g, blocks, caps, options.refinement_passes);
    block_of_node = blocks.labels();
    node_of = std::move(comp_to_finer);
  }
  std::vector<BlockId> block_of(n);
  for (size_t c = 0; c < n; ++c) block_of[c] = BlockId(block_of_node[node_of[c]]);

  BlockAssignment assignment;
  assignment.block_of = std::move(block_of);
  assignment.blocks = block_count;

  // ---------------- Fallback: contiguous runs when a block still breaks a cap ----------------
  double max_load = 0;
  for (const BlockWeight& w : weights_of_blocks(cw, assignment)) max_load = std::max(max_load, caps.load(w));
  bool rebalanced = false;
  if (max_load > 1) {
    std::vector<uint32_t> runs = contiguous_split(atomic, cw, caps, block_count);
    if (!runs.empty()) {
      for (size_t c = 0; c < n; ++c) assignment.block_of[c] = BlockId(runs[c]);
      rebalanced = true;
      max_load = 0;
      for (const BlockWeight& w : weights_of_blocks(cw, assignment)) max_load = std::max(max_load, caps.load(w));
    }
  }

  if (stats) {
    stats->levels = static_cast<int>(hierarchy.size());
    stats->moves = moves;
    stats->caps = caps;
    stats->max_load = max_load;
    stats->rebalanced = rebalanced;
    double cut = 0;
    for (const Transfer& t : atomic.transfers) {
      bool crosses = false;
      for (uint32_t c : t.consumers) crosses |= assignment.block_of[c] != assignment.block_of[t.producer];
      if (crosses) cut += t.bytes_per_sample;
    }
    stats->cut_bytes_per_sample = cut;
  }
  return assignment;
}

}  // namespace apart
