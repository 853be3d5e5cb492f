// A stage's gradient reducer: buckets, their collectives over the replicas, ZeRO's shards (see gradient_reducer.h).
#include "train/gradient_reducer.h"

#include <optional>

#include "graph/error.h"
#include "profiler/collectives.h"

namespace apart {

GradientReducer::GradientReducer(StageParams& params, Backend& backend, std::unique_ptr<Communicator> replicas,
                                 std::unique_ptr<Communicator> device_replicas, const ReducerOptions& options)
    : params_(params), backend_(backend), replicas_(std::move(replicas)), device_replicas_(std::move(device_replicas)) {
  zero_ = replicas_ ? options.zero : 0;
  for (size_t i = 0; i < params_.size(); ++i) grads_.push_back(backend_.empty(DType::kFloat32, params_.shapes[i]));
  build_buckets(options);
  build_step_lists(options);
  if (zero_ >= 3)
    release_params();  // from here this replica holds only its pieces of the sharded params, between tasks
}

void GradientReducer::build_buckets(const ReducerOptions& options) {
  // Buckets in the backward's production order; under ZeRO sharded and whole ones fill side by side.
  bucket_of_.assign(params_.size(), 0);
  bucket_at_.assign(params_.size(), 0);
  std::optional<size_t> open[2];  // the bucket being filled: whole, sharded
  std::vector<double> filled;
  for (size_t i : options.production_order) {
    const bool sharded = zero_ > 0 && !options.tied[i];
    std::optional<size_t>& current = open[sharded ? 1 : 0];
    if (!current || filled[*current] >= kAllreduceBucketBytes || (sharded && zero_ >= 2)) {  // ZeRO-2/3: one param each
      current = buckets_.size();
      buckets_.emplace_back().sharded = sharded;
      filled.push_back(0);
    }
    bucket_at_[i] = static_cast<int64_t>(filled[*current] / 4);
    buckets_[*current].params.push_back(i);
    bucket_of_[i] = *current;
    filled[*current] += static_cast<double>(params_.elements[i]) * 4;  // float32
  }
  for (Bucket& b : buckets_) {
    if (device_replicas_) b.device = &backend_;  // reduced over NCCL where the gradients are
    if (zero_ < 2 || !b.sharded) b.hold(flat_length(b));
  }  // ZeRO-2/3 hold their sharded buckets only while they reduce
  // The accumulators of the buckets held through the step live in them (no second copy of the gradients) where
  // the backend's memory is the host's, which the collectives run on.
  grads_in_buckets_ = backend_.host_memory() || device_replicas_;
  if (grads_in_buckets_)
    for (Bucket& b : buckets_)
      for (size_t p : b.flat.defined() ? b.params : std::vector<size_t>{})
        grads_[p] = b.flat.flat_range(bucket_at_[p], bucket_at_[p] + params_.elements[p]).view(params_.shapes[p]);
}

void GradientReducer::build_step_lists(const ReducerOptions& options) {
  if (zero_ == 0) {
    step_names_ = params_.names;
    step_params_ = params_.tensors;
    for (Tensor& g : grads_) step_grads_.push_back(&g);
    step_counts_in_norm_ = options.counts_in_norm;
    return;
  }
  std::vector<std::vector<size_t>> bucket_params;
  for (const Bucket& b : buckets_) bucket_params.push_back(b.sharded ? b.params : std::vector<size_t>{});
  pieces_ = owned_pieces(bucket_params, params_.elements, replicas_->size(), replicas_->rank());
  pieces_of_bucket_.assign(buckets_.size(), {});
  for (size_t k = 0; k < pieces_.size(); ++k) pieces_of_bucket_[pieces_[k].bucket].push_back(k);
  for (const ShardPiece& piece : pieces_) {
    const Tensor& p = *params_.tensors[piece.param];
    if (zero_ >= 3) {  // storage of its own: the whole param is emptied by release_params
      Tensor& own = piece_params_.emplace_back(backend_.empty(DType::kFloat32, {piece.end - piece.begin}));
      backend_.copy(p.flat_range(piece.begin, piece.end), own);
    } else {
      piece_params_.push_back(p.flat_range(piece.begin, piece.end));  // a view: the step updates the param
    }
    // ZeRO-2/3 keep no whole gradient of a sharded param: its pieces accumulate their own.
    piece_grads_.push_back(zero_ >= 2 ? backend_.empty(DType::kFloat32, {piece.end - piece.begin})
                                      : grads_[piece.param].flat_range(piece.begin, piece.end));
    const bool whole = piece.begin == 0 && piece.end == p.elements();
    const std::string& name = params_.names[piece.param];
    step_names_.push_back(whole ? name
                                : name + "[" + std::to_string(piece.begin) + ":" + std::to_string(piece.end) + "]");
    // Only this stage holds it, and only this replica owns the piece.
    step_counts_in_norm_.push_back(options.pieces_count_in_norm[piece.param]);
  }
  for (size_t k = 0; k < pieces_.size(); ++k) {
    step_params_.push_back(&piece_params_[k]);
    step_grads_.push_back(&piece_grads_[k]);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!options.tied[i]) continue;
    step_names_.push_back(params_.names[i]);
    step_params_.push_back(params_.tensors[i]);
    step_grads_.push_back(&grads_[i]);
    step_counts_in_norm_.push_back(options.counts_in_norm[i]);
  }
  if (zero_ >= 2)
    for (size_t i = 0; i < params_.size(); ++i)
      if (!options.tied[i]) grads_[i] = Tensor();
}

int64_t GradientReducer::flat_length(const Bucket& b) const {
  int64_t n = 0;
  for (size_t p : b.params) n += params_.elements[p];
  return b.sharded ? sharded_bucket_length(n, replicas_ ? replicas_->size() : 1) : n;
}

void GradientReducer::begin_step() {
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.collected = 0;
  }
}

void GradientReducer::progress() {
  for (Bucket& other : buckets_)
    if (other.reduction) other.reduction->test();
}

void GradientReducer::accumulate(size_t i, const Tensor& value, bool first, bool last, double weight) {
  Bucket& b = buckets_[bucket_of_[i]];
  if (zero_ >= 2 && b.sharded) {  // ZeRO-2/3: each micro-batch's gradient goes straight into its bucket
    if (b.ready == 0) b.hold(flat_length(b));
    Tensor into = b.flat.flat_range(bucket_at_[i], bucket_at_[i] + value.elements());
    backend_.copy(value, into);
    if (weight != 1) (b.device ? backend_ : cpu_backend()).scale(into, weight);  // where the bucket is
    if (++b.ready < b.params.size()) return;
    b.ready = 0;
    b.reduction = replicas_of(b).reduce_scatter_sum(b.span());
    reducing_.push_back(bucket_of_[i]);
    constexpr size_t kReductionsInFlight = 2;  // their buffers are what ZeRO-2/3 hold beyond the shards
    while (reducing_.size() > kReductionsInFlight) {
      Bucket& oldest = buckets_[reducing_.front()];
      reducing_.pop_front();
      if (oldest.reduction) collect_shard(oldest);
    }
    progress();
    return;
  }
  if (first)
    backend_.copy(value, grads_[i]);  // accumulated on the backend, micro-batch by micro-batch
  else
    backend_.add_into(grads_[i], value);
  if (last && weight != 1) backend_.scale(grads_[i], static_cast<float>(weight));  // every micro-batch's alike
  if (!last || !replicas_) return;
  if (++b.ready < b.params.size()) return;
  for (size_t p : grads_in_buckets_ ? std::vector<size_t>{} : b.params)  // the collectives run on host buffers (MPI)
    backend_.copy_to_host(grads_[p].raw(), reinterpret_cast<std::byte*>(b.values() + bucket_at_[p]), grads_[p].bytes());
  b.reduction = b.sharded ? replicas_of(b).reduce_scatter_sum(b.span())  // ZeRO-1
                          : replicas_of(b).allreduce_sum(b.span());
  progress();
}

void GradientReducer::after_pass() {
  if (zero_ >= 2)
    collect_shards();  // this micro-batch's reduce-scatters, so that no whole gradient outlives its backward
}

void GradientReducer::collect_shards() {
  for (Bucket& b : buckets_)
    if (b.sharded && b.reduction) collect_shard(b);
  reducing_.clear();
}

void GradientReducer::finish() {
  if (zero_ >= 2) collect_shards();
  for (Bucket& b : buckets_) {
    if (!b.reduction) continue;
    b.reduction->wait();
    b.reduction.reset();
    if (b.sharded) continue;  // ZeRO-1: the pieces are copied into grads_ below
    for (size_t p : grads_in_buckets_ ? std::vector<size_t>{} : b.params)  // views of the bucket: reduced in place
      backend_.copy_to_device(reinterpret_cast<const std::byte*>(b.values() + bucket_at_[p]), grads_[p].raw(),
                              grads_[p].bytes());
  }
  if (zero_ != 1) return;
  // ZeRO-1: this replica's reduced shards into the gradients it steps, views of grads_ (the same bytes when those
  // are views of the bucket).
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const float* from = buckets_[pieces_[k].bucket].values() + pieces_[k].at;
    if (reinterpret_cast<const std::byte*>(from) != piece_grads_[k].raw())
      backend_.copy_to_device(reinterpret_cast<const std::byte*>(from), piece_grads_[k].raw(), piece_grads_[k].bytes());
  }
}

void GradientReducer::collect_shard(Bucket& b) {
  b.reduction->wait();
  b.reduction.reset();
  // This replica's shard of the micro-batch's sum, added into the pieces it steps (the first micro-batch's copied).
  for (size_t k : pieces_of_bucket_[static_cast<size_t>(&b - buckets_.data())]) {
    const Tensor reduced = b.flat.flat_range(pieces_[k].at, pieces_[k].at + piece_grads_[k].elements());
    const Tensor shard = backend_.host_memory() || b.device ? reduced : backend_.to_device(reduced);
    if (b.collected == 0)
      backend_.copy(shard, piece_grads_[k]);
    else
      backend_.add_into(piece_grads_[k], shard);
  }
  ++b.collected;
  b.flat = Tensor();  // ZeRO-2/3 hold no whole gradient between micro-batches
}

void GradientReducer::after_step() {
  if (zero_ == 1 || zero_ == 2) allgather_params();  // ZeRO-3: for each task
}

void GradientReducer::gather_for_save() {
  if (zero_ >= 3) allgather_params();
}

void GradientReducer::allgather_params() {
  constexpr size_t kInFlight = 2;  // buckets gathering at once: their flat buffers are the transient memory
  struct Gathering {
    size_t bucket = 0;
    Tensor flat;  // the bucket's whole flat buffer, every replica's shards
    Pending done;
  };
  std::vector<Gathering> gathering;
  gathering.reserve(kInFlight);
  auto finish = [&](Gathering& g) {
    g.done->wait();
    for (size_t p : buckets_[g.bucket].params) {
      const Tensor gathered =
          g.flat.flat_range(bucket_at_[p], bucket_at_[p] + params_.elements[p]).view(params_.shapes[p]);
      if (zero_ >= 3) {  // bound until release_params(); over the buffer itself where it is the backend's, no copy
        const Tensor whole = buckets_[g.bucket].device ? gathered : backend_.to_device(gathered);
        for (Tensor* slot : params_.slots[p]) *slot = whole;
      } else {
        backend_.copy(gathered, *params_.tensors[p]);
      }
    }
  };
  for (size_t index = 0; index < buckets_.size(); ++index) {
    Bucket& b = buckets_[index];
    if (!b.sharded) continue;
    if (gathering.size() == kInFlight) {
      finish(gathering.front());
      gathering.erase(gathering.begin());
    }
    Gathering& g = gathering.emplace_back();
    g.bucket = index;
    // ZeRO-1 keeps its buckets' buffers (idle after the step; their gradients, if they are views of them, are
    // overwritten by the next step's first): the gather reuses them. ZeRO-2/3 hold none between reductions.
    g.flat = zero_ == 1 ? b.flat : b.fresh(flat_length(b));  // zero padding
    g.done = start_allgather(index, g.flat);
  }
  for (Gathering& g : gathering) finish(g);
}

Pending GradientReducer::start_allgather(size_t bucket, Tensor& flat) {
  for (size_t k : pieces_of_bucket_[bucket]) {
    Tensor into = flat.flat_range(pieces_[k].at, pieces_[k].at + piece_params_[k].elements());
    backend_.copy(piece_params_[k], into);
  }
  return replicas_of(buckets_[bucket]).allgather(flat.span<float>());
}

Tensor GradientReducer::gathered_param(const std::string& name) {
  const size_t p = params_.index.at(name);
  const size_t b = bucket_of_[p];
  Tensor flat = buckets_[b].fresh(flat_length(buckets_[b]));  // zero padding
  start_allgather(b, flat)->wait();
  // Where the buffer is the backend's, a view of it (no copy), alive while the task that asked reads it.
  const Tensor gathered = flat.flat_range(bucket_at_[p], bucket_at_[p] + params_.elements[p]).view(params_.shapes[p]);
  return buckets_[b].device ? gathered : backend_.to_device(gathered);
}

void GradientReducer::release_params() {
  if (zero_ < 3) return;
  for (size_t i = 0; i < params_.size(); ++i)
    if (sharded_between_uses(i))
      for (Tensor* slot : params_.slots[i]) *slot = Tensor();
}

int64_t GradientReducer::param_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!sharded_between_uses(i)) bytes += params_.tensors[i]->bytes();
  if (zero_ >= 3)
    for (const Tensor& p : piece_params_) bytes += p.bytes();
  return bytes;
}

int64_t GradientReducer::gradient_bytes() const {
  int64_t bytes = 0;
  for (const Tensor& g : grads_) bytes += g.bytes();
  if (zero_ >= 2)
    for (const Tensor& g : piece_grads_) bytes += g.bytes();
  return bytes;
}

}  // namespace apart
