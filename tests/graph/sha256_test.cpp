// SHA-256 against FIPS 180-4's examples, and the SHA-extension path against the portable one.
#include "graph/sha256.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "tests/support/temp_dir.h"

namespace apart {
namespace {

TEST(TheSha256Digest, GivesTheFipsExampleDigestsOnBothPaths) {
  for (bool extensions : {false, true}) {
    EXPECT_EQ(sha256_hex("", extensions), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc", extensions), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", extensions),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(sha256_hex(std::string(1'000'000, 'a'), extensions),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
}

TEST(TheSha256Digest, TakesTheSameDigestWithAndWithoutTheCpusShaExtensionsAtEveryLength) {
  if (!cpu_has_sha_extensions()) GTEST_SKIP() << "this CPU has no SHA extensions: only the portable path runs";
  std::mt19937 rng(3);
  std::string bytes;
  for (size_t length = 0; length < 700; ++length) {
    EXPECT_EQ(sha256_hex(bytes, true), sha256_hex(bytes, false)) << "length " << length;
    bytes.push_back(static_cast<char>(rng()));
  }
}

TEST(TheSha256Digest, HashesAFileInPiecesAsItsBytesAtOnce) {
  const apart::testing::TempDir dir("sha256_test");
  const std::string path = (dir / "sha256_test.bin").string();
  std::string bytes;
  std::mt19937 rng(5);
  for (int i = 0; i < (3 << 20) + 77; ++i) bytes.push_back(static_cast<char>(rng()));  // more than one read
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(sha256_file_hex(path), sha256_hex(bytes, false));
}

}  // namespace
}  // namespace apart
