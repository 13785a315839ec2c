// MappedFile and the registry of this process's file mappings (base/mmap.h): a mapped file's
// range is listed while it is mapped and gone once unmapped; a file read into memory is
// never listed (dropping its pages would zero them).
#include "infera/base/mmap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace infera {
namespace {

namespace fs = std::filesystem;

bool listed(const MappedFile& f) {
  const auto ranges = mapped_file_ranges();
  const auto begin = reinterpret_cast<uintptr_t>(f.data());
  return std::find(ranges.begin(), ranges.end(), std::make_pair(begin, begin + f.size())) != ranges.end();
}

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("infera_mmap_test_" + std::to_string(::getpid()));
    std::ofstream(path_, std::ios::binary) << std::string(10000, 'x');
  }
  void TearDown() override { fs::remove(path_); }
  fs::path path_;
};

TEST_F(MappedFileTest, AMappingIsListedUntilItIsUnmapped) {
  uintptr_t begin = 0;
  {
    MappedFile f(path_.string());
    ASSERT_EQ(f.size(), 10000u);
    EXPECT_EQ(f.data()[9999], 'x');
    EXPECT_TRUE(listed(f));
    begin = reinterpret_cast<uintptr_t>(f.data());
    MappedFile moved = std::move(f);  // a move keeps the one mapping, listed once
    EXPECT_TRUE(listed(moved));
    const auto ranges = mapped_file_ranges();
    EXPECT_EQ(std::count_if(ranges.begin(), ranges.end(), [&](const auto& r) { return r.first == begin; }), 1);
  }
  const auto ranges = mapped_file_ranges();
  EXPECT_TRUE(std::none_of(ranges.begin(), ranges.end(), [&](const auto& r) { return r.first == begin; }));
  EXPECT_TRUE(std::is_sorted(ranges.begin(), ranges.end()));
}

TEST_F(MappedFileTest, AFileReadIntoMemoryIsNotListed) {
  MappedFile f(path_.string(), /*load_into_memory=*/true);
  ASSERT_EQ(f.size(), 10000u);
  EXPECT_EQ(f.data()[0], 'x');
  EXPECT_FALSE(listed(f));
  const auto a = reinterpret_cast<uintptr_t>(f.data());
  for (const auto& [b, e] : mapped_file_ranges())
    EXPECT_FALSE(a >= b && a < e) << "heap memory inside a listed mapping";
}

}  // namespace
}  // namespace infera
