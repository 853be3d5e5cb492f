// graph/output_path: file identity (hard links, symlinks, `..`), containment, and the checks on output paths.
#include "graph/output_path.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "graph/error.h"

namespace apart {
namespace {
namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed (made writable first) at the end.
class Scratch {
 public:
  Scratch() : path_(fs::temp_directory_path() / ("apart_output_path_" + std::to_string(::getpid()) + "_" +
                                                 std::to_string(counter_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->is_directory() && !it->is_symlink()) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }
  fs::path file(const std::string& name, const std::string& text = "x") const {
    std::ofstream(path_ / name) << text;
    return path_ / name;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kInternal;  // "did not throw"
}

TEST(SameFile, SeesAHardLinkASymlinkAndADottedPathAsTheSameFile) {
  Scratch s;
  const fs::path a = s.file("a.onnx");
  fs::create_hard_link(a, s / "hard.onnx");
  fs::create_symlink(a, s / "soft.onnx");
  EXPECT_TRUE(same_file(a, s / "hard.onnx"));
  EXPECT_TRUE(same_file(a, s / "soft.onnx"));
  EXPECT_TRUE(same_file(a, s.path() / "." / "a.onnx"));
  EXPECT_FALSE(same_file(a, s.file("b.onnx")));
  EXPECT_FALSE(same_file(a, s / "missing.onnx"));
}

TEST(ContainsPath, FindsAFileInsideAFolderReachedThroughASymlinkOrDotDot) {
  Scratch s;
  fs::create_directories(s / "real" / "sub");
  const fs::path model = s.file("real/sub/m.onnx");
  fs::create_directory_symlink(s / "real", s / "link");
  EXPECT_TRUE(contains_path(s / "real", model));
  EXPECT_TRUE(contains_path(s / "real", s / "link" / "sub" / "m.onnx"));
  EXPECT_TRUE(contains_path(s / "real" / "sub", s / "real" / "sub"));
  EXPECT_TRUE(contains_path(s.path(), s / "real" / "sub" / ".." / "sub" / "m.onnx"));
  // a/b/../c is not inside a/b.
  fs::create_directories(s / "real" / "other");
  EXPECT_FALSE(contains_path(s / "real" / "sub", s / "real" / "sub" / ".." / "other"));
  EXPECT_FALSE(contains_path(s / "real" / "other", model));
}

TEST(ContainsPath, CountsTheFolderHoldingASymlinkNamedAsTheInput) {
  Scratch s;
  fs::create_directories(s / "elsewhere");
  fs::create_directories(s / "proj");
  fs::create_symlink(s.file("elsewhere/m.onnx"), s / "proj" / "m.onnx");
  EXPECT_TRUE(contains_path(s / "proj", s / "proj" / "m.onnx"));       // removing proj removes the link
  EXPECT_TRUE(contains_path(s / "elsewhere", s / "proj" / "m.onnx"));  // and the file it points to is there
}

TEST(WritableDirectory, IsFalseForAFolderMadeReadOnlyEvenForRoot) {
  Scratch s;
  fs::create_directory(s / "ro");
  EXPECT_TRUE(writable_directory(s / "ro"));
  fs::permissions(s / "ro", fs::perms(0555));
  EXPECT_FALSE(writable_directory(s / "ro"));
  EXPECT_FALSE(writable_directory(s.file("f")));
}

TEST(CheckOutputNotInput, RefusesAnInputByIdentityAndNamesItsRole) {
  Scratch s;
  const fs::path model = s.file("m.onnx");
  fs::create_hard_link(model, s / "hard.onnx");
  const std::vector<InputFile> inputs{{"the model", model}};
  try {
    check_output_not_input(s / "hard.onnx", inputs, "-o");
    FAIL() << "a hard link to the model was accepted as output";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("-o"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_output_not_input(s / "new.json", inputs, "-o"));
}

TEST(CheckOutputWritable, RefusesFoldersSymlinksDevicesReadOnlyFilesAndMissingFolders) {
  Scratch s;
  fs::create_directory(s / "dir");
  fs::create_symlink(s.file("target.json"), s / "link.json");
  const fs::path ro = s.file("ro.json");
  fs::permissions(ro, fs::perms(0444));
  fs::create_directory(s / "rodir");
  fs::permissions(s / "rodir", fs::perms(0555));
  EXPECT_EQ(kind_of([&] { check_output_writable(s / "dir", "-o"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([&] { check_output_writable(s.path() / "dir/", "-o"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([&] { check_output_writable(s / "link.json", "-o"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([&] { check_output_writable("/dev/null", "-o"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([&] { check_output_writable(ro, "-o"); }), ErrorKind::kSystemError);
  EXPECT_EQ(kind_of([&] { check_output_writable(s / "missing" / "x.json", "-o"); }), ErrorKind::kSystemError);
  EXPECT_EQ(kind_of([&] { check_output_writable(s / "rodir" / "x.json", "-o"); }), ErrorKind::kSystemError);
  EXPECT_NO_THROW(check_output_writable(s / "new.json", "-o"));
  EXPECT_NO_THROW(check_output_writable(s.file("old.json"), "-o"));
}

TEST(CheckOutputDirectoryWritable, RefusesAFileAFolderUnderAFileAndAReadOnlyParent) {
  Scratch s;
  const fs::path file = s.file("f");
  fs::create_directory(s / "rodir");
  fs::permissions(s / "rodir", fs::perms(0555));
  EXPECT_EQ(kind_of([&] { check_output_directory_writable(file, "--checkpoint-dir"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([&] { check_output_directory_writable(file / "ck", "--checkpoint-dir"); }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([&] { check_output_directory_writable(s / "rodir", "--checkpoint-dir"); }), ErrorKind::kSystemError);
  EXPECT_EQ(kind_of([&] { check_output_directory_writable(s / "rodir" / "a" / "b", "--checkpoint-dir"); }),
            ErrorKind::kSystemError);
  EXPECT_NO_THROW(check_output_directory_writable(s / "new" / "ck", "--checkpoint-dir"));
}

}  // namespace
}  // namespace apart
