// Fuzz target: bytes as a checkpoint file (train/checkpoint.h read_checkpoint: magic, version, JSON header, tensor
// table, data), what apart train/run --resume reads.
#include <cstddef>
#include <cstdint>

#include "fuzz_target.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return apart::fuzz::run_one(
      [&] { apart::read_checkpoint(apart::fuzz::write_scratch("checkpoint.apart", data, size)); });
}
