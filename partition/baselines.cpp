// Baseline partitioners (uniform, params, torchgpipe balance_by_time, PipeDream's DP, METIS + cycle repair). Each
// baseline only chooses a split; costs, memory and the estimate are apart's own (stage_cost.cpp), so the numbers
// compare splits, not cost models.
#include "partition/baselines.h"

#include <metis.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <string>

#include "graph/error.h"
#include "profiler/collectives.h"

namespace apart {

BlockAssignment baseline_split(const AtomicGraph& atomic, Method method, int stages, double microbatch) {
  const size_t n = atomic.size();
  APART_CHECK(stages >= 1 && static_cast<size_t>(stages) <= n, "baseline stage count");
  if (method == Method::kGpipeBalance) return gpipe_balance_split(atomic, stages, microbatch);
  BlockAssignment a;
  a.blocks = static_cast<uint32_t>(stages);
  a.block_of.resize(n);
  if (method == Method::kParams) {
    std::vector<double> prefix(n + 1, 0);
    for (size_t c = 0; c < n; ++c) prefix[c + 1] = prefix[c] + static_cast<double>(atomic.components[c].cost.param_bytes);
    // Boundary s at the first component where the running sum reaches s/S of the total, keeping ≥ 1 per stage.
    std::vector<size_t> bounds{0};
    for (int s = 1; s < stages; ++s) {
      const double target = prefix[n] * s / stages;
      size_t b = static_cast<size_t>(std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin());
      b = std::max(b, bounds.back() + 1);
      b = std::min(b, n - static_cast<size_t>(stages - s));
      bounds.push_back(b);
    }
    bounds.push_back(n);
    for (int s = 0; s < stages; ++s)
      for (size_t c = bounds[s]; c < bounds[s + 1]; ++c) a.block_of[c] = BlockId(static_cast<uint32_t>(s));
  } else {
    for (size_t c = 0; c < n; ++c) a.block_of[c] = BlockId(static_cast<uint32_t>(c * stages / n));
  }
  return a;
}

std::vector<double> component_times(const AtomicGraph& atomic, double microbatch) {
  std::vector<double> t(atomic.size());
  for (size_t c = 0; c < atomic.size(); ++c)
    t[c] = atomic.components[c].cost.forward.at(microbatch) + atomic.components[c].cost.backward.at(microbatch);
  return t;
}

// ---------------- torchgpipe balance_by_time ----------------

std::vector<size_t> block_partition(const std::vector<double>& costs, int parts) {
  const size_t n = costs.size();
  APART_CHECK(parts >= 1 && static_cast<size_t>(parts) <= n, "block_partition needs 1 ≤ parts ≤ elements");
  const auto [lo_it, hi_it] = std::minmax_element(costs.begin(), costs.end());
  const double lo = *lo_it, range = *hi_it - *lo_it;
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + (range > 0 ? (costs[i] - lo) / range : 0.0);
  const size_t k = static_cast<size_t>(parts);
  std::vector<size_t> splits(k);  // end of block i (exclusive)
  for (size_t x = 0; x + 1 < k; ++x) splits[x] = n / k * (x + 1);
  splits[k - 1] = n;
  auto start = [&](size_t i) { return i > 0 ? splits[i - 1] : 0; };
  auto block_size = [&](size_t i) { return prefix[splits[i]] - prefix[start(i)]; };
  auto sizes = [&] {
    std::vector<size_t> s(k);
    for (size_t i = 0; i < k; ++i) s[i] = splits[i] - start(i);
    return s;
  };
  // Python's max/min over (size, index) tuples: ties go to the larger index for max, the smaller for min.
  auto heaviest = [&] {
    size_t p = 0;
    for (size_t i = 1; i < k; ++i)
      if (block_size(i) >= block_size(p)) p = i;
    return p;
  };
  auto lightest = [&] {
    size_t q = 0;
    for (size_t i = 1; i < k; ++i)
      if (block_size(i) < block_size(q)) q = i;
    return q;
  };
  // The paper proves termination; the cap only guards against floating-point cycling.
  for (size_t steps = 0; steps < 1'000'000;) {
    const size_t p = heaviest();  // (1)
    const double max_size = block_size(p);
    while (true) {
      const size_t q = lightest();  // (2)
      if (max_size <= block_size(q) + 1) return sizes();
      // (3) move one element from the neighbour h of q on p's side into q. torchgpipe relies on Bh being
      // non-empty afterwards; with zero-cost elements it may not be, so we stop there instead (never empty).
      size_t h;
      if (p < q) {
        h = q - 1;
        if (splits[h] - start(h) <= 1) return sizes();
        splits[h] -= 1;
      } else {
        h = q + 1;
        if (splits[h] - start(h) <= 1) return sizes();
        splits[q] += 1;
      }
      if (++steps >= 1'000'000) return sizes();
      if (p == h) break;  // (4) back to (1)
    }
  }
  return sizes();
}

BlockAssignment gpipe_balance_split(const AtomicGraph& atomic, int stages, double microbatch) {
  const std::vector<size_t> sizes = block_partition(component_times(atomic, microbatch), stages);
  BlockAssignment a;
  a.blocks = static_cast<uint32_t>(stages);
  a.block_of.reserve(atomic.size());
  for (size_t s = 0; s < sizes.size(); ++s) a.block_of.insert(a.block_of.end(), sizes[s], BlockId(static_cast<uint32_t>(s)));
  return a;
}

// ---------------- PipeDream ----------------

PipeDreamSplit pipedream_dp(const PipeDreamCosts& c) {
  const size_t n = c.layers;
  const int units = c.units;
  APART_CHECK(n >= 1 && units >= 1, "pipedream_dp needs layers and workers");
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Stage table T(i→j, r) (∞ when it does not fit), row-major over (i, j, r).
  const size_t stride_j = static_cast<size_t>(units) + 1, stride_i = (n + 1) * stride_j;
  std::vector<double> stage((n + 1) * stride_i, kInf);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j <= n; ++j)
      for (int r = 1; r <= units; ++r)
        if (c.fits(i, j, r)) stage[i * stride_i + j * stride_j + r] = c.stage_s(i, j, r);
  std::vector<double> comm(n + 1, 0);
  for (size_t i = 1; i < n; ++i) comm[i] = c.comm_s(i);
  // A(j, u): least bottleneck for layers [0, j) on exactly u workers; choice = (split i, last stage's r), i = 0
  // meaning one stage.
  std::vector<double> a((n + 1) * stride_j, kInf);
  std::vector<std::pair<size_t, int>> choice((n + 1) * stride_j, {0, 0});
  for (size_t j = 1; j <= n; ++j)
    for (int u = 1; u <= units; ++u) {
      double best = stage[j * stride_j + u];  // i = 0
      std::pair<size_t, int> pick{0, u};
      for (size_t i = 1; i < j; ++i) {
        if (comm[i] >= best) continue;
        for (int r = 1; r < u; ++r) {
          const double v = std::max({a[i * stride_j + (u - r)], comm[i], stage[i * stride_i + j * stride_j + r]});
          if (v < best) {
            best = v;
            pick = {i, r};
          }
        }
      }
      a[j * stride_j + u] = best;
      choice[j * stride_j + u] = pick;
    }
  PipeDreamSplit out;
  int best_u = 0;
  for (int u = 1; u <= units; ++u)
    if (a[n * stride_j + u] < (best_u ? a[n * stride_j + best_u] : kInf)) best_u = u;
  if (!best_u) return out;
  out.bottleneck_s = a[n * stride_j + best_u];
  size_t j = n;
  int u = best_u;
  std::vector<size_t> bounds{n};
  while (j > 0) {
    const auto [i, r] = choice[j * stride_j + u];
    out.replicas.push_back(r);
    bounds.push_back(i);
    u -= r;
    j = i;
  }
  std::reverse(bounds.begin(), bounds.end());
  std::reverse(out.replicas.begin(), out.replicas.end());
  out.boundaries = std::move(bounds);
  return out;
}

PipeDreamPlan pipedream_split(const AtomicGraph& atomic, const Cluster& cluster, const TrainingSpec& training,
                              double microbatch, int max_layers, int max_units) {
  PipeDreamPlan plan;
  const size_t n = atomic.size();
  const std::vector<double> times = component_times(atomic, microbatch);
  // Layers: contiguous groups by cumulative time (a group never empty, order kept).
  plan.layers.block_of.resize(n);
  if (n <= static_cast<size_t>(max_layers)) {
    for (size_t c = 0; c < n; ++c) plan.layers.block_of[c] = BlockId(static_cast<uint32_t>(c));
    plan.layers.blocks = static_cast<uint32_t>(n);
  } else {
    const double total = std::accumulate(times.begin(), times.end(), 0.0);
    double before = 0;
    uint32_t layer = 0, last_bucket = UINT32_MAX;
    for (size_t c = 0; c < n; ++c) {
      const auto bucket = static_cast<uint32_t>(total > 0 ? std::min<double>(max_layers - 1, before / total * max_layers)
                                                          : static_cast<double>(c * max_layers / n));
      if (last_bucket != UINT32_MAX && bucket != last_bucket) ++layer;
      last_bucket = bucket;
      plan.layers.block_of[c] = BlockId(layer);
      before += times[c];
    }
    plan.layers.blocks = layer + 1;
  }
  const BlockSequence seq = make_block_sequence(atomic, plan.layers);
  const StageEvaluator ev(seq, cluster, training);
  const size_t layers = seq.size();
  plan.unit = (cluster.devices + max_units - 1) / max_units;
  const int units = cluster.devices / plan.unit;
  std::vector<double> t_prefix(layers + 1, 0);
  for (size_t l = 0; l < layers; ++l)
    t_prefix[l + 1] = t_prefix[l] + seq.blocks[l].forward.at(microbatch) + seq.blocks[l].backward.at(microbatch);
  const double act = activation_bytes_factor(training.precision);
  const Link& p2p = cluster.fits_one_node() ? cluster.intra_node : cluster.inter_node;
  const double batch = static_cast<double>(training.global_batch);
  // Micro-batch count whose per-replica size at one replica is `microbatch` (for the memory check).
  const int64_t m_ref = std::max<int64_t>(1, static_cast<int64_t>(batch / std::max(1.0, microbatch)));
  PipeDreamCosts costs;
  costs.layers = layers;
  costs.units = units;
  costs.stage_s = [&](size_t i, size_t j, int r) {
    const int devices = r * plan.unit;
    // The all-reduce alone: the evaluator's ring model for these devices (micro-batch irrelevant to it).
    const double allreduce = ev.evaluate(static_cast<uint32_t>(i), static_cast<uint32_t>(j), devices, 1, 0, RecomputeScope::kNone).allreduce_s;
    const double minibatches = std::max(1.0, batch / (microbatch * devices));
    return std::max(t_prefix[j] - t_prefix[i], allreduce / minibatches) / devices;
  };
  costs.comm_s = [&](size_t i) {
    const double bytes = ev.out_bytes_per_sample(0, static_cast<uint32_t>(i)) * microbatch * act;
    return 2 * transfer_time(p2p, bytes);
  };
  std::vector<char> fits((layers + 1) * (layers + 1), 0);
  for (size_t i = 0; i < layers; ++i)
    for (size_t j = i + 1; j <= layers; ++j)
      fits[i * (layers + 1) + j] =
          ev.evaluate(static_cast<uint32_t>(i), static_cast<uint32_t>(j), 1, m_ref, 1, RecomputeScope::kNone).memory_bytes <=
          cluster.usable_memory_bytes();
  costs.fits = [&](size_t i, size_t j, int) { return fits[i * (layers + 1) + j] != 0; };
  plan.split = pipedream_dp(costs);
  for (int& r : plan.split.replicas) r *= plan.unit;
  return plan;
}

// ---------------- METIS k-way + cycle repair ----------------

namespace {

// METIS printf()s its complaints ("***Cannot bisect a graph with 0 vertices!") to stdout, where they would
// mix with apart's output. While one of these lives, stdout goes to a temporary file; text() returns what
// was written. Not thread-safe (nothing else prints during planning).
class StdoutCapture {
 public:
  StdoutCapture() {
    std::fflush(stdout);
    file_ = std::tmpfile();
    saved_ = file_ ? ::dup(STDOUT_FILENO) : -1;
    if (saved_ >= 0 && ::dup2(::fileno(file_), STDOUT_FILENO) < 0) {
      ::close(saved_);
      saved_ = -1;
    }
  }
  StdoutCapture(const StdoutCapture&) = delete;
  StdoutCapture& operator=(const StdoutCapture&) = delete;
  ~StdoutCapture() {
    restore();
    if (file_) std::fclose(file_);
  }
  // Restores stdout and returns what was printed meanwhile.
  std::string text() {
    restore();
    std::string out;
    if (!file_) return out;
    std::rewind(file_);
    char buf[1024];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0 && out.size() < 4096) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stdout);
    ::dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_ = nullptr;
  int saved_ = -1;
};

// METIS's messages in one line: "***" markers, tabs and newlines dropped.
std::string metis_said(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '*' || c == '\t') continue;
    if (c == '\n' || c == '\r') {
      if (!out.empty() && out.back() != ' ') out += ' ';
      continue;
    }
    out += c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

const char* metis_status_name(int rc) {
  switch (rc) {
    case METIS_ERROR_INPUT: return "METIS_ERROR_INPUT";
    case METIS_ERROR_MEMORY: return "METIS_ERROR_MEMORY";
    default: return "METIS_ERROR";
  }
}

}  // namespace

BlockAssignment repair_part_order(size_t nodes, const std::vector<std::pair<uint32_t, uint32_t>>& edges,
                                  const std::vector<uint32_t>& part_of) {
  APART_CHECK(part_of.size() == nodes, "one part per node");
  uint32_t parts = 0;
  for (uint32_t p : part_of) parts = std::max(parts, p + 1);
  // 1. Rank parts by the mean topological index of their nodes.
  std::vector<double> sum(parts, 0);
  std::vector<size_t> count(parts, 0);
  for (size_t v = 0; v < nodes; ++v) {
    sum[part_of[v]] += static_cast<double>(v);
    ++count[part_of[v]];
  }
  std::vector<uint32_t> order;
  for (uint32_t p = 0; p < parts; ++p)
    if (count[p]) order.push_back(p);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
    return sum[x] / static_cast<double>(count[x]) < sum[y] / static_cast<double>(count[y]);
  });
  std::vector<uint32_t> rank(parts, 0);
  for (uint32_t r = 0; r < order.size(); ++r) rank[order[r]] = r;
  // 2. Push every node to at least the part of each predecessor (nodes are numbered topologically).
  std::vector<std::vector<uint32_t>> preds(nodes);
  for (const auto& [from, to] : edges) {
    APART_CHECK(from < to && to < nodes, "edges must go from a lower to a higher topological index");
    preds[to].push_back(from);
  }
  std::vector<uint32_t> label(nodes);
  for (size_t v = 0; v < nodes; ++v) {
    label[v] = rank[part_of[v]];
    for (uint32_t u : preds[v]) label[v] = std::max(label[v], label[u]);
  }
  // 3. Renumber the non-empty parts in order.
  std::vector<uint32_t> used(order.size(), UINT32_MAX);
  for (uint32_t l : label) used[l] = 0;
  BlockAssignment a;
  for (uint32_t& u : used)
    if (u == 0) u = a.blocks++;
  a.block_of.resize(nodes);
  for (size_t v = 0; v < nodes; ++v) a.block_of[v] = BlockId(used[label[v]]);
  return a;
}

BlockAssignment metis_blocks(const AtomicGraph& atomic, int parts, double microbatch) {
  const size_t n = atomic.size();
  parts = std::clamp<int>(parts, 1, static_cast<int>(n));
  std::vector<std::pair<uint32_t, uint32_t>> edges;
  std::map<std::pair<uint32_t, uint32_t>, double> bytes;  // undirected, summed over values
  for (const Transfer& t : atomic.transfers)
    for (uint32_t c : t.consumers)
      if (c != t.producer) {
        edges.emplace_back(t.producer, c);
        bytes[{t.producer, c}] += t.bytes_per_sample;
      }
  if (parts == 1) {
    BlockAssignment a;
    a.blocks = 1;
    a.block_of.assign(n, BlockId(0));
    return a;
  }
  // Integer weights: times scaled so they sum to ≤ 10⁷, bytes so the largest edge is 10⁶; both ≥ 1.
  const std::vector<double> times = component_times(atomic, microbatch);
  const double total = std::accumulate(times.begin(), times.end(), 0.0);
  std::vector<idx_t> vwgt(n);
  for (size_t v = 0; v < n; ++v)
    vwgt[v] = std::max<idx_t>(1, total > 0 ? static_cast<idx_t>(std::llround(times[v] / total * 1e7)) : 1);
  double max_bytes = 0;
  for (const auto& [e, b] : bytes) max_bytes = std::max(max_bytes, b);
  std::vector<std::vector<std::pair<idx_t, idx_t>>> adj(n);
  for (const auto& [e, b] : bytes) {
    const idx_t w = std::max<idx_t>(1, max_bytes > 0 ? static_cast<idx_t>(std::llround(b / max_bytes * 1e6)) : 1);
    adj[e.first].emplace_back(static_cast<idx_t>(e.second), w);
    adj[e.second].emplace_back(static_cast<idx_t>(e.first), w);
  }
  std::vector<idx_t> xadj{0}, adjncy, adjwgt;
  for (size_t v = 0; v < n; ++v) {
    std::sort(adj[v].begin(), adj[v].end());
    for (const auto& [u, w] : adj[v]) {
      adjncy.push_back(u);
      adjwgt.push_back(w);
    }
    xadj.push_back(static_cast<idx_t>(adjncy.size()));
  }
  if (adjncy.empty()) {  // METIS wants at least one edge; keep the arrays non-null
    adjncy.push_back(0);
    adjwgt.push_back(1);
  }
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_SEED] = 1;  // deterministic
  options[METIS_OPTION_NUMBERING] = 0;
  idx_t nvtxs = static_cast<idx_t>(n), ncon = 1, nparts = parts, objval = 0;
  std::vector<idx_t> part(n, 0);
  StdoutCapture capture;
  const int rc = METIS_PartGraphKway(&nvtxs, &ncon, xadj.data(), adjncy.data(), vwgt.data(), nullptr, adjwgt.data(),
                                     &nparts, nullptr, nullptr, options, &objval, part.data());
  // With rc OK, what METIS printed ("Cannot bisect a graph with 0 vertices": more parts than it could
  // fill) only means some parts are empty, which the repair below drops.
  const std::string said = metis_said(capture.text());
  if (rc != METIS_OK)
    throw SystemError("--method metis: METIS could not split " + std::to_string(n) + " components into " +
                      std::to_string(parts) + " parts (" + metis_status_name(rc) + (said.empty() ? "" : ": " + said) +
                      "); choose another --method (apart, uniform, params, gpipe-balance, pipedream)");
  std::vector<uint32_t> part_of(n);
  for (size_t v = 0; v < n; ++v) part_of[v] = static_cast<uint32_t>(part[v]);
  return repair_part_order(n, edges, part_of);
}

}  // namespace apart
