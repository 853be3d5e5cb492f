// SHA-256 (FIPS 180-4), small and dependency-free: portable C++, or the CPU's SHA extensions where it has them.
#include "graph/sha256.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "graph/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace apart {
namespace {

constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// FIPS 180-4 §6.2.2 over `blocks` 64-byte blocks.
void compress_portable(std::array<uint32_t, 8>& h, const uint8_t* data, size_t blocks) {
  for (; blocks > 0; --blocks, data += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t(data[4 * i]) << 24) | (uint32_t(data[4 * i + 1]) << 16) | (uint32_t(data[4 * i + 2]) << 8) |
             data[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The same with the x86 SHA extensions (Intel SHA-NI, since Goldmont/Ice Lake/Zen): four rounds per two
// sha256rnds2, the message schedule by sha256msg1/msg2, the state held as ABEF and CDGH.
__attribute__((target("sha,sse4.1,ssse3"))) void compress_sha_extensions(std::array<uint32_t, 8>& h,
                                                                          const uint8_t* data, size_t blocks) {
  const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);  // big-endian words
  __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[0]));
  __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[4]));
  const __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
  for (; blocks > 0; --blocks, data += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[16];  // message words 4g..4g+3 of each group of four rounds
    for (int g = 0; g < 16; ++g) {
      if (g < 4) {
        w[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * g)), byte_swap);
      } else {
        // W[t] = σ1(W[t−2]) + W[t−7] + σ0(W[t−15]) + W[t−16]: msg1 adds σ0 to W[t−16], alignr supplies W[t−7],
        // msg2 adds σ1 (the lanes depending on each other inside the group).
        const __m128i partial = _mm_add_epi32(_mm_sha256msg1_epu32(w[g - 4], w[g - 3]), _mm_alignr_epi8(w[g - 1], w[g - 2], 4));
        w[g] = _mm_sha256msg2_epu32(partial, w[g - 1]);
      }
      __m128i k = _mm_add_epi32(w[g], _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kK[static_cast<size_t>(4 * g)])));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, k);
      k = _mm_shuffle_epi32(k, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, k);
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  dcba = _mm_blend_epi16(feba, dchg, 0xF0);
  hgfe = _mm_alignr_epi8(dchg, feba, 8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[0]), dcba);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[4]), hgfe);
}
bool has_sha_extensions() {
  // CPUID directly (clang 14's __builtin_cpu_supports knows no "sha"): leaf 7 EBX bit 29 SHA, leaf 1 ECX bit 19 SSE4.1.
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19))) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29)) != 0;
  }();
  return has;
}
#else
bool has_sha_extensions() { return false; }
#endif

struct Sha256 {
  std::array<uint32_t, 8> h{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> block{};
  size_t used = 0;
  uint64_t length = 0;
  bool extensions = has_sha_extensions();

  void compress(const uint8_t* data, size_t blocks) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (extensions) return compress_sha_extensions(h, data, blocks);
#endif
    compress_portable(h, data, blocks);
  }
  void update(const char* bytes, size_t n) {
    const auto* data = reinterpret_cast<const uint8_t*>(bytes);
    length += n;
    if (used > 0) {  // fill the partial block first
      const size_t take = std::min(n, block.size() - used);
      std::memcpy(block.data() + used, data, take);
      used += take;
      data += take;
      n -= take;
      if (used < block.size()) return;
      compress(block.data(), 1);
      used = 0;
    }
    compress(data, n / 64);  // whole blocks straight from the input
    data += n / 64 * 64;
    n %= 64;
    std::memcpy(block.data(), data, n);
    used = n;
  }  std::string finish() {
    const uint64_t bits = length * 8;
    const char pad = static_cast<char>(0x80);
    update(&pad, 1);
    const char zero = 0;
    while (used != 56) update(&zero, 1);
    for (int i = 7; i >= 0; --i) {
      const char byte = static_cast<char>((bits >> (8 * i)) & 0xff);
      update(&byte, 1);
    }
    std::string hex;
    char buf[9];
    for (uint32_t v : h) {
      std::snprintf(buf, sizeof buf, "%08x", v);
      hex += buf;
    }
    return hex;
  }
};

}  // namespace

bool cpu_has_sha_extensions() { return has_sha_extensions(); }

std::string sha256_hex(const std::string& bytes, bool sha_extensions) {
  Sha256 s;
  s.extensions = sha_extensions && has_sha_extensions();
  s.update(bytes.data(), bytes.size());
  return s.finish();
}

std::string sha256_file_hex(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError("cannot read " + path.string());
  Sha256 s;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    s.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return s.finish();
}

}  // namespace apart
