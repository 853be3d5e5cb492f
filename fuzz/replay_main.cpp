// A main for the fuzz targets where libFuzzer is not linked (gcc builds, APART_FUZZ off), so CTest exercises every
// target under the dev build's sanitizers without clang:
//   fuzz_T [-runs=0] [-max_total_time=N] [-seed=S] FILE|FOLDER...
// First it runs LLVMFuzzerTestOneInput once on each file named and each file of each folder named (in name order;
// names starting with '.' are skipped, so a folder can be kept in git by a .keep file): tests/regress/<T>/ and the
// seeds. Then, with -max_total_time=N (N > 0), it mutates those inputs for N seconds — bit flips, interesting bytes
// and integers, inserted, deleted, duplicated and truncated ranges, splices of two inputs — from a fixed seed
// (-seed, default 1). That is a blind mutation fuzzer: no coverage feedback, unlike the libFuzzer build of the fuzz
// preset (scripts/fuzz.sh), but it runs in every CI build. Before each mutated input runs, it is written to
// ./fuzz-last-input, so a crash leaves the input that caused it there; a clean run removes the file. Other arguments
// starting with '-' (libFuzzer's flags) are ignored, so one command line serves both builds.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;
using Bytes = std::string;

constexpr size_t kMaxMutatedSize = 1 << 20;  // a mutated input never grows past 1 MiB
constexpr const char* kLastInput = "fuzz-last-input";

Bytes read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return Bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void run(const Bytes& bytes) { LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()); }

// Reads a flag "-name=N" as an integer in [0, limit]; exits 2 naming it otherwise.
bool integer_flag(const std::string& arg, const std::string& name, uint64_t limit, uint64_t& value) {
  const std::string prefix = "-" + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  const std::string digits = arg.substr(prefix.size());
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || digits[0] == '-' || parsed > limit) {
    std::fprintf(stderr, "replay: %s takes an integer in [0, %llu] (got '%s')\n", prefix.c_str(),
                 static_cast<unsigned long long>(limit), digits.c_str());
    std::exit(2);
  }
  value = parsed;
  return true;
}

// One random edit of `b` (which may be empty), drawing a second input from `pool` for splices.
void mutate(Bytes& b, const std::vector<Bytes>& pool, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static constexpr uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe, 0x20, 0x22, 0x2d, 0x30, 0x39, 0x7b};
  switch (rng() % 9) {
    case 0:  // flip a bit
      if (!b.empty()) b[pick(b.size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:  // an interesting byte
      if (!b.empty()) b[pick(b.size())] = static_cast<char>(kInteresting[pick(sizeof kInteresting)]);
      break;
    case 2: {  // an interesting integer, little-endian, 1-8 bytes (lengths, varints, dims)
      static constexpr uint64_t kValues[] = {0, 1, 0x7f, 0xff, 0x7fff, 0xffff, 0x7fffffff, 0xffffffff,
                                             0x7fffffffffffffff, ~uint64_t{0}, 1ull << 40};
      const uint64_t v = kValues[pick(std::size(kValues))];
      const size_t width = 1 + pick(8), at = pick(b.size() + 1);
      for (size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<char>(v >> (8 * i));
      break;
    }
    case 3: {  // insert random bytes
      const size_t at = pick(b.size() + 1), n = 1 + pick(16);
      Bytes ins(n, '\0');
      for (char& c : ins) c = static_cast<char>(rng());
      b.insert(at, ins);
      break;
    }
    case 4: {  // delete a range
      if (b.empty()) break;
      const size_t at = pick(b.size());
      b.erase(at, 1 + pick(std::min<size_t>(b.size() - at, 64)));
      break;
    }
    case 5: {  // duplicate a range (repeated fields, nesting)
      if (b.empty()) break;
      const size_t at = pick(b.size()), n = 1 + pick(std::min<size_t>(b.size() - at, 256));
      b.insert(pick(b.size() + 1), b.substr(at, n));
      break;
    }
    case 6:  // truncate
      b.resize(pick(b.size() + 1));
      break;
    case 7: {  // splice: a prefix of this input and a suffix of another
      const Bytes& other = pool[pick(pool.size())];
      b = b.substr(0, pick(b.size() + 1)) + other.substr(pick(other.size() + 1));
      break;
    }
    default: {  // copy a range over another place in the input
      if (b.size() < 2) break;
      const size_t from = pick(b.size()), to = pick(b.size());
      const size_t n = 1 + pick(std::min<size_t>({b.size() - from, b.size() - to, 64}));
      b.replace(to, n, b.substr(from, n));
      break;
    }
  }
  if (b.size() > kMaxMutatedSize) b.resize(kMaxMutatedSize);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  uint64_t seconds = 0, seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (integer_flag(arg, "max_total_time", 86400, seconds) || integer_flag(arg, "seed", ~uint64_t{0} >> 1, seed))
      continue;
    if (arg.rfind('-', 0) == 0) continue;
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (const auto& entry : fs::directory_iterator(arg))
        if (entry.is_regular_file() && entry.path().filename().string().rfind('.', 0) != 0)
          files.push_back(entry.path());
    } else if (fs::is_regular_file(arg, ec)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a folder\n", arg.c_str());
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<Bytes> pool;
  for (const fs::path& file : files) {
    pool.push_back(read_bytes(file));
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), pool.back().size());
    run(pool.back());
  }
  std::fprintf(stderr, "replay: %zu inputs, no bug\n", files.size());
  if (seconds == 0) return 0;
  if (pool.empty()) pool.emplace_back();

  std::mt19937_64 rng(seed);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  uint64_t executions = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    Bytes input = pool[rng() % pool.size()];
    for (uint64_t edits = 1 + rng() % 8; edits > 0; --edits) mutate(input, pool, rng);
    {
      std::ofstream out(kLastInput, std::ios::binary | std::ios::trunc);
      out.write(input.data(), static_cast<std::streamsize>(input.size()));
    }
    run(input);
    ++executions;
  }
  std::error_code ec;
  fs::remove(kLastInput, ec);
  std::fprintf(stderr, "replay: %llu mutated inputs in %llu s (seed %llu), no bug\n",
               static_cast<unsigned long long>(executions), static_cast<unsigned long long>(seconds),
               static_cast<unsigned long long>(seed));
  return 0;
}
