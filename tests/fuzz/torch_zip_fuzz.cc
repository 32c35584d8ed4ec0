// Fuzzes the PyTorch zip checkpoint loader (engine/io/torch_zip.cc: libzip, the archive
// layout, the pickled state dict, storage bounds) on pytorch_model.bin files, written to the
// scratch directory because the loader reads a path. The first byte picks the form:
//   even: the rest is the whole file (zip structure itself fuzzed);
//   odd:  a well-formed archive is built with libzip from the rest: a 16-bit little-endian
//         length, that many bytes of archive/data.pkl, and the storages archive/data/<key>
//         for every key the pickle names (read with ReadTorchStateDict), filled cyclically
//         from the remaining bytes to the size the pickle gives them (bit 1 of the first byte
//         set: to that size plus 1, a mismatch), so mutations reach the pickle and the
//         storage checks instead of dying at the zip's CRCs.
// Property: every loaded tensor's bytes are readable (ASan) and match its shape and dtype.
#include <zip.h>

#include <map>

#include "engine/io/tensor_store.h"
#include "engine/io/torch_zip.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void AddEntry(zip_t* z, const char* name, std::string_view bytes) {
  zip_source_t* src = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
  morserve::fuzz::Check(src != nullptr && zip_file_add(z, name, src, ZIP_FL_OVERWRITE) >= 0,
                        "adding a zip entry");
}

// The bytes of a storage of `n` bytes: `fill` repeated (zeros when empty).
std::string Storage(uint64_t n, std::string_view fill) {
  std::string out(n, '\0');
  for (uint64_t i = 0; i < n && !fill.empty(); ++i) out[i] = fill[i % fill.size()];
  return out;
}

// Builds archive/data.pkl and archive/data/<key> at `path` (see the file comment).
void WriteArchive(const std::string& path, std::string_view rest, bool off_by_one) {
  size_t pickle_len = 0;
  if (rest.size() >= 2) {
    pickle_len = static_cast<uint8_t>(rest[0]) | (static_cast<uint8_t>(rest[1]) << 8);
    rest.remove_prefix(2);
  }
  pickle_len = std::min(pickle_len, rest.size());
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  morserve::fuzz::Check(z != nullptr, "creating a zip");
  const std::string_view pickle = rest.substr(0, pickle_len), fill = rest.substr(pickle_len);
  AddEntry(z, "archive/data.pkl", pickle);
  // zip_source_buffer keeps pointers until zip_close: the storages live until then.
  std::map<std::string, std::string> storages;
  absl::StatusOr<std::vector<morserve::TorchTensorRecord>> records =
      morserve::ReadTorchStateDict(pickle, "fuzz");
  if (records.ok()) {
    for (const morserve::TorchTensorRecord& r : *records) {
      absl::StatusOr<morserve::DType> t = morserve::TorchStorageDType(r, "fuzz");
      if (!t.ok() || r.storage_numel < 0 || r.storage_numel > (1 << 20)) continue;
      const uint64_t n = r.storage_numel * morserve::DTypeSize(*t) + (off_by_one ? 1 : 0);
      storages.emplace(r.storage_key, Storage(n, fill));
    }
  }
  for (const auto& [key, bytes] : storages) AddEntry(z, ("archive/data/" + key).c_str(), bytes);
  morserve::fuzz::Check(zip_close(z) == 0, "writing a zip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  if (size == 0) return 0;
  static const std::string path = fuzz::ScratchDir() + "/pytorch_model.bin";
  const std::string_view rest = fuzz::AsText(data + 1, size - 1);
  if (data[0] & 1) {
    WriteArchive(path, rest, data[0] & 2);
  } else {
    fuzz::WriteFile(path, rest);
  }
  TensorStore store;
  absl::Status s = LoadTorchZip(path, &store);
  if (!s.ok()) {
    fuzz::Check(!s.message().empty(), "an error says what is wrong");
    return 0;
  }
  for (const auto& [name, v] : store.tensors()) {
    fuzz::TouchBytes(v.data, v.nbytes());
    if (v.numel() <= 4096) (void)v.ToF32Vector();
  }
  return 0;
}
