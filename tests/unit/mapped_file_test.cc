// MappedFile (engine/io/mapped_file.h): a file maps read-only with its bytes; ReleaseMappedPages
// drops the whole pages of a range inside a live mapping from the resident set (the process's
// RSS falls by them, and the bytes read back from the file unchanged), and leaves memory outside
// every live mapping (a heap buffer, a mapping already closed) alone.
#include "engine/io/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace morserve {
namespace {

// Resident pages of this process (/proc/self/statm, second field), in bytes.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

std::string WriteFile(size_t bytes) {
  std::string path = ::testing::TempDir() + "/mapped_file_test.bin";
  std::vector<char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
  std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
  return path;
}

uint64_t Checksum(const uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum = sum * 31 + p[i];
  return sum;
}

TEST(MappedFileTest, ReleasedPagesLeaveTheResidentSetAndReadBackUnchanged) {
  constexpr size_t kBytes = size_t{64} << 20;
  const std::string path = WriteFile(kBytes);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const uint8_t* data = (*file)->data();
  ASSERT_EQ((*file)->size(), kBytes);
  const uint64_t want = Checksum(data, kBytes);  // touches every page
  const int64_t touched = ResidentBytes();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // An unaligned range: only the whole pages inside it go.
  EXPECT_EQ(ReleaseMappedPages(data + 100, kBytes - 200), kBytes - 2 * page);
  const int64_t released = touched - ResidentBytes();
  EXPECT_GT(released, static_cast<int64_t>(kBytes * 9 / 10)) << "RSS fell by " << released;
  EXPECT_EQ(Checksum(data, kBytes), want);
  // Past the mapping's end, or straddling it: nothing.
  EXPECT_EQ(ReleaseMappedPages(data + kBytes - page, 2 * page), 0u);
  std::remove(path.c_str());
}

TEST(MappedFileTest, MemoryOutsideEveryLiveMappingIsLeftAlone) {
  std::vector<uint8_t> heap(size_t{1} << 20, 0x5a);
  EXPECT_EQ(ReleaseMappedPages(heap.data(), heap.size()), 0u);
  for (uint8_t b : heap) ASSERT_EQ(b, 0x5a);
  const std::string path = WriteFile(size_t{1} << 20);
  const uint8_t* old = nullptr;
  {
    auto file = MappedFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    old = (*file)->data();
  }
  EXPECT_EQ(ReleaseMappedPages(old, size_t{1} << 20), 0u);  // closed: no longer registered
  std::remove(path.c_str());
}

}  // namespace
}  // namespace morserve
