// Tests of AtomicFile: a file appears whole at commit() or not at all, and no temporary is left behind.
#include "graph/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "graph/error.h"

namespace apart {
namespace {
namespace fs = std::filesystem;

class AnAtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("apart_atomic_file_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string contents(const fs::path& path) const {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  int entries() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }

  fs::path dir_;
};

TEST_F(AnAtomicFile, AppearsOnlyAtCommitWithEverythingWritten) {
  const fs::path target = dir_ / "out.bin";
  AtomicFile file(target);
  file.write("abc", 3);
  file.stream() << "def";
  EXPECT_FALSE(fs::exists(target));
  EXPECT_EQ(file.temp_path().parent_path(), dir_);
  file.commit();
  EXPECT_EQ(contents(target), "abcdef");
  EXPECT_EQ(entries(), 1);
}

TEST_F(AnAtomicFile, ReplacesAnOlderFileWhole) {
  write_file_atomically(dir_ / "out.txt", "first version, longer");
  write_file_atomically(dir_ / "out.txt", "second");
  EXPECT_EQ(contents(dir_ / "out.txt"), "second");
  EXPECT_EQ(entries(), 1);
}

TEST_F(AnAtomicFile, LeavesNothingWhenTheWriterThrows) {
  write_file_atomically(dir_ / "kept.txt", "old");
  try {
    AtomicFile file(dir_ / "kept.txt");
    file.write("new, half", 9);
    throw std::runtime_error("the writer failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(contents(dir_ / "kept.txt"), "old");
  EXPECT_EQ(entries(), 1);
}

TEST_F(AnAtomicFile, NamesTheFileWhenItsFolderIsMissing) {
  try {
    AtomicFile file(dir_ / "missing" / "out.bin");
    FAIL() << "no error";
  } catch (const SystemError& e) {
    EXPECT_NE(std::string(e.what()).find("out.bin"), std::string::npos) << e.what();
  }
}

TEST_F(AnAtomicFile, NamesBothFilesWhenTheRenameFails) {
  fs::create_directories(dir_ / "taken" / "inside");  // a non-empty directory cannot be replaced by a file
  {
    AtomicFile file(dir_ / "taken");
    file.write("x", 1);
    try {
      file.commit();
      FAIL() << "no error";
    } catch (const SystemError& e) {
      EXPECT_NE(std::string(e.what()).find("rename"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(entries(), 1);  // the temporary is gone
}

TEST_F(AnAtomicFile, NeverWritesThroughASymlinkPlantedUnderItsTemporaryName) {
  write_file_atomically(dir_ / "victim.txt", "precious");
  const fs::path planted = dir_ / (".out.txt.tmp." + std::to_string(::getpid()) + ".0");
  fs::create_symlink(dir_ / "victim.txt", planted);
  write_file_atomically(dir_ / "out.txt", "mine");
  EXPECT_EQ(contents(dir_ / "victim.txt"), "precious");
  EXPECT_EQ(contents(dir_ / "out.txt"), "mine");
  EXPECT_TRUE(fs::is_symlink(planted));  // not ours: left alone
  EXPECT_EQ(entries(), 3);
}

TEST_F(AnAtomicFile, KeepsWritingPastAStreamsBufferAndReportsItsPosition) {
  AtomicFile file(dir_ / "big.bin");
  const std::string chunk(100000, 'z');
  file.write(chunk.data(), static_cast<int64_t>(chunk.size()));
  EXPECT_EQ(static_cast<int64_t>(file.stream().tellp()), 100000);
  file.stream() << "end";
  file.commit();
  EXPECT_EQ(contents(dir_ / "big.bin"), chunk + "end");
}

}  // namespace
}  // namespace apart
