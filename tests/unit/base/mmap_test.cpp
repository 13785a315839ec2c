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

// The /proc/self/maps line of the mapping that holds address a ("" when none does).
std::string maps_line_of(uintptr_t a) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    const size_t dash = line.find('-'), space = line.find(' ');
    const uintptr_t b = std::stoull(line.substr(0, dash), nullptr, 16);
    const uintptr_t e = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
    if (a >= b && a < e) return line;
  }
  return "";
}

// A file read into memory gives back the pages of a range (repacked weights' source), widened
// to 2 MiB boundaries within its whole pages, by mapping the file's same bytes there: they
// read the same, and the memory is the file's, not anonymous; pages outside the window, and
// the file's partial last page, stay as read.
TEST_F(MappedFileTest, AFileReadIntoMemoryMapsBackWholePages) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), mib = size_t{1} << 20;
  std::string bytes(3 * mib + 123, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / page);
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
  const std::string file = fs::canonical(path_).string();  // (as /proc/self/maps names it)
  uintptr_t begin = 0;
  {
    MappedFile f(path_.string(), /*load_into_memory=*/true);
    begin = reinterpret_cast<uintptr_t>(f.data());
    ASSERT_EQ(begin % (2 * mib), 0u) << "a copy of 2 MiB or more starts on a huge page";
    const auto copies = copied_file_ranges();
    ASSERT_EQ(std::count(copies.begin(), copies.end(), std::make_pair(begin, begin + f.size())), 1);
    EXPECT_EQ(maps_line_of(begin + 2 * mib).find(file), std::string::npos) << "anonymous before";
    EXPECT_EQ(map_back_file_pages(f.data() + 10, page - 20), 0u) << "no whole page inside";
    // [2 MiB + 100, + 10 pages): the window [2 MiB, 3 MiB), the copy's whole pages ending there.
    EXPECT_EQ(map_back_file_pages(f.data() + 2 * mib + 100, 10 * page), mib);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), f.size()), bytes) << "the bytes read the same";
    for (size_t at : {2 * mib, 2 * mib + 100 * page, 3 * mib - page})
      EXPECT_NE(maps_line_of(begin + at).find(file), std::string::npos) << "byte " << at;
    for (size_t at : {size_t{0}, 2 * mib - page, 3 * mib})
      EXPECT_EQ(maps_line_of(begin + at).find(file), std::string::npos) << "byte " << at;
    // The first 2 MiB: mapped back as one more range, which the file system merges into one
    // mapping with the first (contiguous offsets).
    EXPECT_EQ(map_back_file_pages(f.data() + page, page), 2 * mib);
    EXPECT_EQ(maps_line_of(begin), maps_line_of(begin + 3 * mib - page)) << "one mapping of [0, 3 MiB)";
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), f.size()), bytes);
    int outside = 0;
    EXPECT_EQ(map_back_file_pages(&outside, sizeof outside), 0u) << "not a file's copy";
    MappedFile mapped(path_.string());
    EXPECT_EQ(map_back_file_pages(mapped.data(), mapped.size()), 0u) << "a mapping is not a copy";
  }
  const auto copies = copied_file_ranges();
  EXPECT_TRUE(std::none_of(copies.begin(), copies.end(), [&](const auto& r) { return r.first == begin; }));
}

}  // namespace
}  // namespace infera
