// CRC-32C: a reflected CRC over the Castagnoli polynomial 0x82F63B78, by table or by SSE 4.2's crc32 instruction.
#include "graph/crc32c.h"

#include <array>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace apart {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected 0x1EDC6F41

// Slicing by 8: table[k][b] is the CRC of byte b followed by k zero bytes, so 8 bytes cost 8 lookups and no shifts
// between them.
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr auto kTables = make_tables();

uint32_t crc32c_table(const unsigned char* p, size_t n, uint32_t crc) {
  while (n >= 8) {
    uint64_t word = 0;
    for (int i = 7; i >= 0; --i) word = (word << 8) | p[i];  // little-endian, whatever the host
    word ^= crc;
    crc = kTables[7][word & 0xff] ^ kTables[6][(word >> 8) & 0xff] ^ kTables[5][(word >> 16) & 0xff] ^
          kTables[4][(word >> 24) & 0xff] ^ kTables[3][(word >> 32) & 0xff] ^ kTables[2][(word >> 40) & 0xff] ^
          kTables[1][(word >> 48) & 0xff] ^ kTables[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c(const void* bytes, size_t size, uint32_t crc, bool hardware) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  crc = ~crc;
#if defined(__x86_64__)
  if (hardware && cpu_has_sse42()) return ~crc32c_sse42(p, size, crc);
#else
  (void)hardware;
#endif
  return ~crc32c_table(p, size, crc);
}

std::string crc32c_hex(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", crc);
  return text;
}

}  // namespace apart
