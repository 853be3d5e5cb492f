// CRC-32C (Castagnoli, the polynomial iSCSI, ext4 and RocksDB use): the checksum of every tensor in a checkpoint.
#pragma once

#include <cstdint>
#include <string>

namespace apart {

// The CRC-32C of `bytes` continuing from `crc` (0 to start): crc32c(b, crc32c(a)) == crc32c(a + b). On x86-64 with
// SSE 4.2 the CPU's crc32 instruction (several GB/s), else a table (`hardware` = false forces the table; tests
// compare both).
uint32_t crc32c(const void* bytes, size_t size, uint32_t crc = 0, bool hardware = true);
// As 8 lowercase hex digits, the form checkpoint headers store.
std::string crc32c_hex(uint32_t crc);

}  // namespace apart
