// apart run's gradient reducer for one stage (internal to train/pipeline.cpp), as PyTorch DDP's Reducer is one
// object: the stage's accumulated gradients, its all-reduce buckets over the replicas (host or device buffers), and
// under ZeRO the shards this replica owns, their reduce-scatter, and the params' all-gather (docs/runtime.md, "ZeRO").
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/tensor.h"
#include "runtime/zero_shards.h"

namespace apart {

// A stage's trained params as its executors hold them (the forward's, shared by the backward passes).
struct StageParams {
  std::vector<std::string> names;
  std::vector<Tensor*> tensors;
  std::vector<int64_t> elements;  // what each tensor holds whole (ZeRO-3 empties it between uses)
  std::vector<std::vector<int64_t>> shapes;
  // Each executor's slot for the param (forward, backward, B pass; shared storage). ZeRO-3 binds the gathered
  // param into every slot for a pass and empties them after it.
  std::vector<std::vector<Tensor*>> slots;
  std::map<std::string, size_t> index;  // name → index
  size_t size() const { return names.size(); }
};

struct ReducerOptions {
  int zero = 0;                            // the ZeRO stage the replicas run (0 without replicas)
  std::vector<size_t> production_order;    // the params in the order the backward produces their gradients
  std::vector<bool> tied;                  // by param: held by other stages too (whole buckets, stepped whole)
  std::vector<bool> counts_in_norm;        // by param: this rank adds it whole to the global norm
  std::vector<bool> pieces_count_in_norm;  // by param: this rank adds its ZeRO pieces of it to the global norm
};

// The gradients of a stage's params in all-reduce buckets (PyTorch DDP's 25 MB), in the order the backward
// produces them, so a bucket starts reducing while the rest of the last backward runs. On a host-memory backend
// the gradient accumulators are views of their bucket's buffer, which the collective reduces in place.
// Under ZeRO (stage.zero ≥ 1 with replicas) the buckets of params no other stage holds are `sharded`: padded to a
// multiple of the replicas and reduce-scattered (runtime/zero_shards.h); tied params keep whole buckets. Under
// ZeRO-2/3 a sharded bucket holds one param: it is filled, reduce-scattered and freed micro-batch by micro-batch,
// and ZeRO-3 gathers it for each task that reads the param, so that what a replica holds beyond its shards is a
// param or two at a time (the planner's working set), not a 25 MB bucket.
class GradientReducer {
 public:
  // `replicas`: the stage's replicas (nullptr with one); `device_replicas`: the same over the device world (NCCL),
  // whose buckets then live in `backend`'s memory (nullptr: the host's). Under ZeRO-3 the sharded params' slots are
  // emptied here: from then on the executors ask gathered_param for them.
  GradientReducer(StageParams& params, Backend& backend, std::unique_ptr<Communicator> replicas,
                  std::unique_ptr<Communicator> device_replicas, const ReducerOptions& options);

  int zero() const { return zero_; }
  Tensor& grad(size_t param) { return grads_[param]; }  // the accumulated gradient (empty for ZeRO-2/3 sharded ones)

  void begin_step();
  // Accumulates param `param`'s gradient `value` of one micro-batch (`first`/`last` of the pass that produces it),
  // weighted by `weight`, and starts its bucket's collective when the bucket completes.
  void accumulate(size_t param, const Tensor& value, bool first, bool last, double weight);
  void after_pass();  // ZeRO-2/3: collect the pass's reduce-scatters
  // Waits for every collective in flight; the reduced gradients (ZeRO-1: this replica's shards) are then what
  // step_grads hold.
  void finish();
  void after_step();       // ZeRO-1/2: every replica's stepped shards into every replica's params
  void gather_for_save();  // ZeRO-3: the params whole in their slots until release_params
  // ZeRO-3: param `name` whole, gathered for one task (the executors' param source, Executor::set_param_source).
  Tensor gathered_param(const std::string& name);
  // ZeRO-3: empties the sharded params' slots, so that between tasks this replica holds only its pieces.
  void release_params();
  // ZeRO-3 empties this param's tensors between passes: a param of a sharded bucket.
  bool sharded_between_uses(size_t param) const { return zero_ >= 3 && buckets_[bucket_of_[param]].sharded; }

  // What the optimizer steps: every param whole without ZeRO; under ZeRO the pieces of the sharded buckets this
  // replica owns (views of the params; gradients: views of the gradients for ZeRO-1, accumulators for ZeRO-2/3),
  // then the tied params whole. Names are the params', "name[begin:end]" for a piece of one.
  const std::vector<std::string>& step_names() const { return step_names_; }
  const std::vector<Tensor*>& step_params() const { return step_params_; }
  std::vector<Tensor*>& step_grads() { return step_grads_; }
  const std::vector<bool>& step_counts_in_norm() const { return step_counts_in_norm_; }
  // ZeRO-3: this replica's own copies of its pieces (step_names()[k] for piece k); empty otherwise.
  std::vector<Tensor>& piece_params() { return piece_params_; }
  // What it keeps between steps: the params (whole, or under ZeRO-3 this replica's pieces of the sharded ones) and
  // the gradient accumulators (whole, or under ZeRO-2/3 this replica's pieces).
  int64_t param_bytes() const;
  int64_t gradient_bytes() const;

 private:
  struct Bucket {
    std::vector<size_t> params;
    Tensor flat;  // float32: host memory (counted in tensor_memory()), or `device`'s
    // The backend whose memory holds `flat` when the bucket is reduced there (over the device replicas: its
    // all-reduce, and under ZeRO its reduce-scatter and the params' all-gather); null: the host.
    Backend* device = nullptr;
    float* values() { return flat.data<float>(); }
    std::span<float> span() { return flat.span<float>(); }
    Tensor fresh(int64_t elements) const {  // a zeroed buffer where the bucket's collectives run
      return device ? device->empty(DType::kFloat32, {elements}) : Tensor(DType::kFloat32, {elements});
    }
    void hold(int64_t elements) {  // zeroed when fresh; the padding stays zero through every collective
      if (flat.elements() != elements || !flat.defined()) flat = fresh(elements);
    }
    size_t ready = 0;
    Pending reduction;
    bool sharded = false;
    int64_t collected = 0;  // ZeRO-2/3: the micro-batches whose reduced shard this step has added into the pieces
  };
  void build_buckets(const ReducerOptions& options);
  void build_step_lists(const ReducerOptions& options);
  // Where bucket b's collectives run: the device replicas (NCCL) when its buffer is the backend's, else the host's.
  Communicator& replicas_of(const Bucket& b) { return b.device ? *device_replicas_ : *replicas_; }
  // The elements of bucket b's flat buffer: its params', padded to a multiple of the replicas when it is sharded.
  int64_t flat_length(const Bucket& b) const;
  // ZeRO-2/3: waits for bucket b's reduce-scatter of one micro-batch, adds this replica's shard into the pieces it
  // steps and frees the bucket's buffer.
  void collect_shard(Bucket& b);
  void collect_shards();  // ZeRO-2/3: every reduce-scatter still in flight
  // ZeRO: this replica's pieces of sharded bucket `bucket` into `flat` (its whole buffer), and its all-gather started.
  Pending start_allgather(size_t bucket, Tensor& flat);
  // ZeRO: every replica's shards of the sharded buckets into every replica's params, a few buckets in flight at a
  // time: after the step under ZeRO-1/2 (copied into the whole params), for --save-model under ZeRO-3 (bound whole
  // into the executors' slots until release_params).
  void allgather_params();
  void progress();  // MPI's non-blocking collectives move when tested

  StageParams& params_;
  Backend& backend_;
  std::unique_ptr<Communicator> replicas_;
  std::unique_ptr<Communicator> device_replicas_;
  int zero_ = 0;
  std::vector<Tensor> grads_;      // accumulated over the step's micro-batches
  bool grads_in_buckets_ = false;  // grads_ are views of their buckets' buffers (a host-memory backend)
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> bucket_at_;  // by param: where it starts in its bucket's buffer
  std::deque<size_t> reducing_;     // ZeRO-2/3: buckets whose reduce-scatter is in flight, oldest first
  std::vector<std::string> step_names_;
  std::vector<Tensor*> step_params_;
  std::vector<Tensor*> step_grads_;
  std::vector<bool> step_counts_in_norm_;
  std::vector<ShardPiece> pieces_;
  std::vector<std::vector<size_t>> pieces_of_bucket_;  // by bucket: indices into pieces_
  std::vector<Tensor> piece_params_, piece_grads_;
};

}  // namespace apart
