// Block level (paper §IV-B): coarsen → (the coarsest level is the initial partition) → uncoarsen + refine →
// compact. Acyclicity: nodes are merged only when adjacent in a topological order of the current level, so
// every quotient edge points forward in that order; refinement moves a node to the next (previous) block only
// when none of its successors (predecessors) stays in its block, which keeps every edge forward.
#include "partition/block.h"

#include <algorithm>
#include <numeric>

#include "graph/error.h"

namespace apart {
namespace {

struct Edge {
  uint32_t from, to;
  double bytes;
};

// The graph of one level: node weights (seconds) and forward edges (from < to in the level's order).
struct LevelGraph {
  std::vector<double> weight;
  std::vector<std::vector<std::pair<uint32_t, double>>> succ, pred;
};

LevelGraph make_level_graph(const std::vector<double>& component_weight, const std::vector<Edge>& edges,
                            const std::vector<uint32_t>& node_of, uint32_t nodes) {
  LevelGraph g;
  g.weight.assign(nodes, 0);
  g.succ.resize(nodes);
  g.pred.resize(nodes);
  for (size_t c = 0; c < component_weight.size(); ++c) g.weight[node_of[c]] += component_weight[c];
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

// One coarsening step: match adjacent pairs (x, x+1) by gain t(a)+t(b)+comm(a,b)−t(a∪b) = comm(a,b) (times are
// additive), heaviest communication first, within the balance cap.
CoarseLevel coarsen_once(const LevelGraph& g, double cap, uint32_t min_nodes) {
  const uint32_t n = static_cast<uint32_t>(g.weight.size());
  struct Pair {
    uint32_t left;
    double gain, weight;
  };
  std::vector<Pair> pairs;
  for (uint32_t x = 0; x + 1 < n; ++x) {
    double comm = 0;
    for (auto [to, bytes] : g.succ[x])
      if (to == x + 1) comm = bytes;
    const double w = g.weight[x] + g.weight[x + 1];
    if (w <= cap) pairs.push_back({x, comm, w});
  }
  std::sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
    if (a.gain != b.gain) return a.gain > b.gain;
    if (a.weight != b.weight) return a.weight < b.weight;
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

// Refinement at one level: move boundary nodes between neighbouring blocks p and p ± 1 when it cuts
// communication, or, at equal cut, evens out time, keeping every edge forward and blocks under the cap.
int refine(const LevelGraph& g, std::vector<uint32_t>& block_of_node, std::vector<double>& block_weight,
           double cap, int passes) {
  const uint32_t n = static_cast<uint32_t>(g.weight.size());
  int moves = 0;
  std::vector<uint32_t> block_nodes(block_weight.size(), 0);  // a move never empties a block
  for (uint32_t b : block_of_node) ++block_nodes[b];
  for (int pass = 0; pass < passes; ++pass) {
    int moved = 0;
    for (uint32_t x = 0; x < n; ++x) {
      const uint32_t p = block_of_node[x];
      if (block_nodes[p] <= 1) continue;
      bool succ_in_p = false, pred_in_p = false;
      double to_next = 0, to_prev = 0, inside = 0;
      for (auto [y, bytes] : g.succ[x]) {
        if (block_of_node[y] == p) { succ_in_p = true; inside += bytes; }
        else if (block_of_node[y] == p + 1) to_next += bytes;
      }
      for (auto [y, bytes] : g.pred[x]) {
        if (block_of_node[y] == p) { pred_in_p = true; inside += bytes; }
        else if (p > 0 && block_of_node[y] == p - 1) to_prev += bytes;
      }
      const double w = g.weight[x];
      auto worth = [&](uint32_t q, double gain) {
        if (block_weight[q] + w > cap) return false;
        if (gain > 0) return true;
        return gain == 0 && block_weight[p] - w > block_weight[q] + w;  // strictly more even
      };
      const uint32_t blocks = static_cast<uint32_t>(block_weight.size());
      if (!succ_in_p && p + 1 < blocks && worth(p + 1, to_next - inside)) {
        block_of_node[x] = p + 1;
        --block_nodes[p];
        ++block_nodes[p + 1];
        block_weight[p] -= w;
        block_weight[p + 1] += w;
        ++moved;
      } else if (!pred_in_p && p > 0 && worth(p - 1, to_prev - inside)) {
        block_of_node[x] = p - 1;
        --block_nodes[p];
        ++block_nodes[p - 1];
        block_weight[p] -= w;
        block_weight[p - 1] += w;
        ++moved;
      }
    }
    moves += moved;
    if (moved == 0) break;
  }
  return moves;
}

}  // namespace

int automatic_block_count(size_t components, int devices) {
  // Fine enough that the DP can place a cut at most layer boundaries of 100-layer models and use up to k
  // stages; coarse enough that the DP (O(S·k²) per probe) stays well under a second. See docs.
  (void)devices;
  return static_cast<int>(std::min<size_t>(components, 64));
}

BlockAssignment build_blocks(const AtomicGraph& atomic, int k, const BlockOptions& options,
                             double reference_microbatch, BlockStatistics* stats) {
  const size_t n = atomic.size();
  APART_CHECK(k >= 1, "block count must be positive");
  std::vector<double> weight(n);
  for (size_t c = 0; c < n; ++c) {
    const BlockCost& cost = atomic.components[c].cost;
    weight[c] = cost.forward.at(reference_microbatch) + cost.backward.at(reference_microbatch);
  }
  std::vector<Edge> edges;
  for (const Transfer& t : atomic.transfers)
    for (uint32_t c : t.consumers) edges.push_back({t.producer, c, t.bytes_per_sample});
  const double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  const double cap = total > 0 ? options.balance_cap * total / k : 0;

  // ---------------- Coarsening ----------------
  std::vector<CoarseLevel> hierarchy;
  std::vector<uint32_t> node_of(n);
  std::iota(node_of.begin(), node_of.end(), 0u);
  uint32_t nodes = static_cast<uint32_t>(n);
  while (nodes > static_cast<uint32_t>(k)) {
    const LevelGraph g = make_level_graph(weight, edges, node_of, nodes);
    CoarseLevel level = coarsen_once(g, total > 0 ? cap : 1.0, static_cast<uint32_t>(k));
    if (level.nodes == nodes) break;  // the cap stops every merge; compaction finishes the job
    for (auto& x : node_of) x = level.parent_of[x];
    nodes = level.nodes;
    hierarchy.push_back(std::move(level));
  }

  // ---------------- Initial partition: every coarsest node is a block ----------------
  std::vector<uint32_t> block_of_node(nodes);
  std::iota(block_of_node.begin(), block_of_node.end(), 0u);
  std::vector<double> block_weight(nodes, 0);
  {
    const LevelGraph g = make_level_graph(weight, edges, node_of, nodes);
    for (uint32_t x = 0; x < nodes; ++x) block_weight[x] = g.weight[x];
  }

  // ---------------- Uncoarsening with boundary refinement ----------------
  int moves = 0;
  std::vector<uint32_t> finer_node_of = node_of;  // component → node at the current level
  for (size_t l = hierarchy.size(); l-- > 0;) {
    // Project: nodes of level l's finer side inherit their parent's block.
    const CoarseLevel& level = hierarchy[l];
    std::vector<uint32_t> finer_block(level.parent_of.size());
    for (size_t x = 0; x < level.parent_of.size(); ++x) finer_block[x] = block_of_node[level.parent_of[x]];
    // Component → finer node: undo this level's merge.
    std::vector<uint32_t> comp_to_finer(n);
    {
      // Rebuild by re-applying levels 0..l-1 from the identity.
      std::vector<uint32_t> m(n);
      std::iota(m.begin(), m.end(), 0u);
      for (size_t j = 0; j < l; ++j)
        for (auto& x : m) x = hierarchy[j].parent_of[x];
      comp_to_finer = std::move(m);
    }
    const LevelGraph g = make_level_graph(weight, edges, comp_to_finer, static_cast<uint32_t>(finer_block.size()));
    moves += refine(g, finer_block, block_weight, cap > 0 ? cap : 1.0, options.refinement_passes);
    block_of_node = std::move(finer_block);
    finer_node_of = std::move(comp_to_finer);
  }
  if (hierarchy.empty()) finer_node_of = node_of;

  // ---------------- Compaction to k blocks ----------------
  std::vector<uint32_t> block_of(n);
  for (size_t c = 0; c < n; ++c) block_of[c] = block_of_node[finer_node_of[c]];
  // Drop blocks that refinement emptied, keeping order.
  {
    std::vector<uint32_t> used(block_weight.size(), 0);
    for (uint32_t b : block_of) used[b] = 1;
    std::vector<uint32_t> renumber(block_weight.size(), 0);
    uint32_t next = 0;
    std::vector<double> w2;
    for (size_t b = 0; b < used.size(); ++b)
      if (used[b]) { renumber[b] = next++; w2.push_back(0); }
    for (size_t c = 0; c < n; ++c) {
      block_of[c] = renumber[block_of[c]];
      w2[block_of[c]] += weight[c];
    }
    block_weight = std::move(w2);
  }
  while (block_weight.size() > static_cast<size_t>(k)) {
    // Merge the lightest adjacent pair (ties: the earlier one): merging neighbours keeps edges forward.
    size_t best = 0;
    for (size_t b = 1; b + 1 < block_weight.size(); ++b)
      if (block_weight[b] + block_weight[b + 1] < block_weight[best] + block_weight[best + 1]) best = b;
    block_weight[best] += block_weight[best + 1];
    block_weight.erase(block_weight.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    for (auto& b : block_of)
      if (b > best) --b;
  }
  BlockAssignment assignment;
  assignment.block_of = std::move(block_of);
  assignment.blocks = static_cast<uint32_t>(block_weight.size());
  if (stats) {
    stats->levels = static_cast<int>(hierarchy.size());
    stats->moves = moves;
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
