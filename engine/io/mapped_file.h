// A read-only memory map of a whole file. The mapping lives as long as the MappedFile, so
// TensorViews into it stay valid while the owning TensorStore keeps it (TensorStore::Own).
// An empty file maps to data() == nullptr, size() == 0.
//
// ReleaseMappedPages lets a reader that has copied tensors out of a mapping (the CPU runner's
// packed weight formats) drop those pages from the process's resident set: madvise(DONTNEED)
// on the whole pages of the range that lie inside a live MappedFile (touched again, they are
// read back from the file); memory outside every live mapping is left alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace morserve {

class MappedFile {
 public:
  // Maps `path` read-only; the error names the path and the failing call.
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Returns the bytes released (whole pages inside one live mapping; 0 when the range lies in
// none).
size_t ReleaseMappedPages(const void* data, size_t bytes);

}  // namespace morserve
