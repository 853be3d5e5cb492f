// Names, parsers and validation of the partition options.
#include "partition/options.h"

#include "graph/error.h"

namespace apart {

std::string_view method_name(Method m) {
  switch (m) {
    case Method::kApart: return "apart";
    case Method::kUniform: return "uniform";
    case Method::kParams: return "params";
    case Method::kGpipeBalance: return "gpipe-balance";
    case Method::kPipeDream: return "pipedream";
    case Method::kMetis: return "metis";
  }
  return "?";
}
std::string_view recompute_name(Recompute r) {
  return r == Recompute::kAuto ? "auto" : r == Recompute::kOn ? "on" : "off";
}

Method parse_method(std::string_view t) {
  if (t == "apart") return Method::kApart;
  if (t == "uniform") return Method::kUniform;
  if (t == "params") return Method::kParams;
  if (t == "gpipe-balance") return Method::kGpipeBalance;
  if (t == "pipedream") return Method::kPipeDream;
  if (t == "metis") return Method::kMetis;
  throw InvalidArgument("--method " + std::string(t) +
                        ": expected apart, uniform, params, gpipe-balance, pipedream or metis");
}
Recompute parse_recompute(std::string_view t) {
  if (t == "auto") return Recompute::kAuto;
  if (t == "on") return Recompute::kOn;
  if (t == "off") return Recompute::kOff;
  throw InvalidArgument("--recompute " + std::string(t) + ": expected auto, on or off");
}

void PartitionOptions::validate() const {
  if (cluster.devices < 1) throw InvalidArgument("--devices must be at least 1");
  if (cluster.devices_per_node < 1) throw InvalidArgument("--devices-per-node must be at least 1");
  if (cluster.memory_bytes <= 0) throw InvalidArgument("the device's memory must be positive");
  if (cluster.intra_node_bandwidth <= 0 || cluster.inter_node_bandwidth <= 0)
    throw InvalidArgument("the cluster's bandwidths must be positive");
  if (training.global_batch < 1) throw InvalidArgument("--batch must be at least 1");
  if (stage.stages && *stage.stages < 1) throw InvalidArgument("--stages must be at least 1 or auto");
  if (stage.replicas && *stage.replicas < 1) throw InvalidArgument("--replicas must be at least 1 or auto");
  if (stage.microbatches && *stage.microbatches < 1) throw InvalidArgument("--microbatches must be at least 1 or auto");
  if (stage.time_limit_s < 0) throw InvalidArgument("--time-limit must not be negative");
  if (block.blocks < 0) throw InvalidArgument("--blocks must not be negative");
  if (block.balance_cap < 1) throw InvalidArgument("the block balance cap must be at least 1");
}

}  // namespace apart
