// Read-only mmap of a whole file (see mapped_file.h).
#include "engine/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  const int err = errno;
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

// The live mappings, by start address: ReleaseMappedPages only touches these.
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, size_t> live;  // start -> size
};

Registry& Mappings() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

size_t ReleaseMappedPages(const void* data, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + bytes;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  Registry& r = Mappings();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.upper_bound(begin);
  if (it == r.live.begin()) return 0;
  --it;
  if (end > it->first + it->second) return 0;  // not inside one mapping
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last <= first) return 0;
  // The page-aligned start as an offset from `data` (no integer-to-pointer cast).
  void* start = const_cast<uint8_t*>(static_cast<const uint8_t*>(data)) + (first - begin);
  if (::madvise(start, last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    absl::Status status = ErrnoError("cannot stat", path);
    ::close(fd);
    return status;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("not a regular file: ", path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* addr = nullptr;
  if (size > 0) {
    addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      absl::Status status = ErrnoError("cannot mmap", path);
      ::close(fd);
      return status;
    }
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  if (addr != nullptr) {
    std::lock_guard<std::mutex> lock(Mappings().mu);
    Mappings().live[reinterpret_cast<uintptr_t>(addr)] = size;
  }
  return std::shared_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(addr), size));
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(Mappings().mu);
    Mappings().live.erase(reinterpret_cast<uintptr_t>(data_));
  }
  ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace morserve
