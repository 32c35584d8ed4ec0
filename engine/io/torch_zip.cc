// PyTorch zip checkpoint reader (see torch_zip.h).
#include "engine/io/torch_zip.h"

#include <zip.h>

#include <filesystem>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/io/unpickler.h"

namespace morserve {
namespace {

constexpr uint64_t kMaxPickleBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxDeflateRatio = 1100;  // deflate cannot expand beyond ~1032:1

absl::Status FileError(const std::string& file, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}

absl::Status TensorError(const std::string& name, const std::string& file,
                         const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", file, ": ", what));
}

absl::Status EntryError(const std::string& what) { return absl::InvalidArgumentError(what); }

// Prefixes an entry error with the archive path.
absl::Status InFile(const std::string& file, const absl::Status& status) {
  return FileError(file, std::string(status.message()));
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
using ZipPtr = std::unique_ptr<zip_t, ZipCloser>;

// An open archive plus the facts needed to bound every read.
struct Archive {
  ZipPtr zip;
  std::string path;
  uint64_t file_size = 0;
  std::string prefix;  // "<top>/"
};

absl::StatusOr<Archive> OpenArchive(const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", ec.message()));
  int code = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY, &code);
  if (z == nullptr) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    const std::string message = zip_error_strerror(&error);
    zip_error_fini(&error);
    return FileError(path, absl::StrCat("not a readable zip archive (", message,
                                        "); legacy non-zip torch files are not supported"));
  }
  Archive archive{ZipPtr(z), path, file_size, ""};
  const zip_int64_t n = zip_get_num_entries(z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(z, static_cast<zip_uint64_t>(i), 0);
    if (name == nullptr) continue;
    const std::string_view entry(name);
    const size_t slash = entry.find('/');
    if (slash != std::string_view::npos && entry.substr(slash) == "/data.pkl") {
      archive.prefix = std::string(entry.substr(0, slash + 1));
      return archive;
    }
  }
  return FileError(path, "no <top>/data.pkl entry: not a torch.save zip checkpoint");
}

// Reads the entry `name` whole, if its size (bounded by the archive) is within max_size.
// Errors do not name the archive: callers add the file, or the tensor and the file.
absl::StatusOr<std::vector<uint8_t>> ReadEntry(const Archive& archive, const std::string& name,
                                               uint64_t max_size) {
  const zip_int64_t index = zip_name_locate(archive.zip.get(), name.c_str(), 0);
  if (index < 0) return EntryError(absl::StrCat("missing entry ", name));
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(archive.zip.get(), static_cast<zip_uint64_t>(index), 0, &st) != 0 ||
      (st.valid & (ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD)) !=
          (ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD)) {
    return EntryError(absl::StrCat("cannot stat entry ", name));
  }
  if (st.size > max_size) {
    return EntryError(absl::StrCat("entry ", name, " has ", st.size, " bytes, more than the ",
                                   max_size, " expected"));
  }
  // Bound the allocation below by what the archive can really hold.
  const bool stored = st.comp_method == ZIP_CM_STORE;
  if (st.comp_size > archive.file_size ||
      (stored ? st.size > st.comp_size : st.size / kMaxDeflateRatio > st.comp_size)) {
    return EntryError(absl::StrCat("entry ", name, " claims ", st.size,
                                   " bytes, more than the archive can hold"));
  }
  zip_file_t* f = zip_fopen_index(archive.zip.get(), static_cast<zip_uint64_t>(index), 0);
  if (f == nullptr) {
    return EntryError(
        absl::StrCat("cannot open entry ", name, ": ", zip_strerror(archive.zip.get())));
  }
  std::vector<uint8_t> bytes(st.size);
  uint64_t done = 0;
  while (done < st.size) {
    const zip_int64_t got = zip_fread(f, bytes.data() + done, st.size - done);
    if (got <= 0) break;
    done += static_cast<uint64_t>(got);
  }
  uint8_t extra = 0;  // reading to the end makes libzip check the CRC
  const bool clean_end = done == st.size && zip_fread(f, &extra, 1) == 0;
  const std::string error = zip_file_strerror(f);
  zip_fclose(f);
  if (done == st.size && !clean_end) {
    return EntryError(absl::StrCat("entry ", name, " is corrupt (", error, ")"));
  }
  if (done != st.size) {
    return EntryError(absl::StrCat("entry ", name, " truncated: read ", done, " of ", st.size,
                                   " bytes (", error, ")"));
  }
  return bytes;
}

absl::Status CheckByteOrder(const Archive& archive) {
  const std::string name = archive.prefix + "byteorder";
  if (zip_name_locate(archive.zip.get(), name.c_str(), 0) < 0) return absl::OkStatus();
  absl::StatusOr<std::vector<uint8_t>> order = ReadEntry(archive, name, 64);
  if (!order.ok()) return InFile(archive.path, order.status());
  if (std::string(order->begin(), order->end()) != "little") {
    return FileError(archive.path, "big-endian storages are not supported");
  }
  return absl::OkStatus();
}

bool IsPlainKey(const std::string& key) {
  return !key.empty() && key != "." && key != ".." && key.find('/') == std::string::npos;
}

// Product of dims, false on a negative dim or overflow.
bool Numel(const std::vector<int64_t>& shape, int64_t* numel) {
  *numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(*numel, d, numel)) return false;
  }
  return true;
}

bool IsContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  for (int64_t d : shape) {
    if (d == 0) return true;  // empty: no element is addressed
  }
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];  // cannot overflow: Numel() succeeded first
  }
  return true;
}

// One storage read into an owned buffer, with the dtype it was first used as.
struct Storage {
  std::shared_ptr<std::vector<uint8_t>> bytes;
  DType dtype;
};

absl::StatusOr<const Storage*> GetStorage(const Archive& archive, const TorchTensorRecord& r,
                                          DType dtype, std::map<std::string, Storage>* cache) {
  if (const auto it = cache->find(r.storage_key); it != cache->end()) {
    if (it->second.dtype != dtype) {
      return TensorError(r.name, archive.path,
                         absl::StrCat("storage ", r.storage_key, " used with two dtypes"));
    }
    const uint64_t need = static_cast<uint64_t>(r.storage_numel) * DTypeSize(dtype);
    if (it->second.bytes->size() != need) {
      return TensorError(r.name, archive.path,
                         absl::StrCat("storage ", r.storage_key, " used with two sizes"));
    }
    return &it->second;
  }
  uint64_t need = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(r.storage_numel), DTypeSize(dtype), &need)) {
    return TensorError(r.name, archive.path, "storage size overflows");
  }
  const std::string entry = absl::StrCat(archive.prefix, "data/", r.storage_key);
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadEntry(archive, entry, need);
  if (!bytes.ok()) {
    return TensorError(r.name, archive.path, std::string(bytes.status().message()));
  }
  if (bytes->size() != need) {
    return TensorError(
        r.name, archive.path,
        absl::StrCat("storage ", entry, " has ", bytes->size(), " bytes, expected ", need));
  }
  if (bytes->empty()) bytes->reserve(1);  // an empty tensor still gets a non-null pointer
  Storage storage{std::make_shared<std::vector<uint8_t>>(*std::move(bytes)), dtype};
  return &cache->emplace(r.storage_key, std::move(storage)).first->second;
}

}  // namespace

absl::StatusOr<std::vector<TorchTensorRecord>> ReadTorchStateDict(std::string_view pickle,
                                                                  const std::string& file) {
  absl::StatusOr<Unpickled> u = Unpickle(pickle);
  if (!u.ok()) return FileError(file, absl::StrCat("data.pkl: ", u.status().message()));
  const PickleValue& root = u->at(u->root);
  if (root.kind != PickleKind::kDict) return FileError(file, "data.pkl does not hold a dict");
  std::vector<TorchTensorRecord> records;
  for (size_t i = 0; i + 1 < root.items.size(); i += 2) {
    const PickleValue& key = u->at(root.items[i]);
    const PickleValue& value = u->at(root.items[i + 1]);
    if (key.kind != PickleKind::kString) return FileError(file, "state dict key is not a string");
    if (value.kind != PickleKind::kTensor) return TensorError(key.str, file, "not a tensor");
    const PickleValue& storage = u->at(value.storage);
    records.push_back(TorchTensorRecord{key.str, storage.str, storage.storage_type,
                                        storage.storage_numel, value.storage_offset, value.shape,
                                        value.stride});
  }
  return records;
}

absl::StatusOr<DType> TorchStorageDType(const TorchTensorRecord& record, const std::string& file) {
  if (record.storage_type == "torch.FloatStorage") return DType::kF32;
  if (record.storage_type == "torch.HalfStorage") return DType::kF16;
  if (record.storage_type == "torch.BFloat16Storage") return DType::kBF16;
  return TensorError(record.name, file,
                     absl::StrCat("unsupported storage type ", record.storage_type,
                                  " (bf16, f16 and f32 are supported)"));
}

absl::Status CheckTorchTensor(const TorchTensorRecord& r, const std::string& file) {
  if (!IsPlainKey(r.storage_key)) {
    return TensorError(r.name, file, absl::StrCat("bad storage key '", r.storage_key, "'"));
  }
  int64_t numel = 0;
  if (!Numel(r.shape, &numel)) {
    return TensorError(r.name, file, absl::StrCat("bad shape ", ShapeString(r.shape)));
  }
  if (r.stride.size() != r.shape.size()) {
    return TensorError(r.name, file,
                       absl::StrCat("stride ", ShapeString(r.stride), " does not match shape ",
                                    ShapeString(r.shape)));
  }
  if (!IsContiguous(r.shape, r.stride)) {
    return TensorError(r.name, file,
                       absl::StrCat("non-contiguous: shape ", ShapeString(r.shape), ", stride ",
                                    ShapeString(r.stride)));
  }
  int64_t end = 0;
  if (r.storage_offset < 0 || r.storage_numel < 0 ||
      __builtin_add_overflow(r.storage_offset, numel, &end) || end > r.storage_numel) {
    return TensorError(
        r.name, file,
        absl::StrCat("elements [", r.storage_offset, ", +", numel, ") outside storage ",
                     r.storage_key, " of ", r.storage_numel, " elements"));
  }
  return absl::OkStatus();
}

absl::Status LoadTorchZip(const std::string& path, TensorStore* store) {
  absl::StatusOr<Archive> archive = OpenArchive(path);
  if (!archive.ok()) return archive.status();
  if (absl::Status s = CheckByteOrder(*archive); !s.ok()) return s;
  absl::StatusOr<std::vector<uint8_t>> pickle =
      ReadEntry(*archive, archive->prefix + "data.pkl", kMaxPickleBytes);
  if (!pickle.ok()) return InFile(path, pickle.status());
  absl::StatusOr<std::vector<TorchTensorRecord>> records = ReadTorchStateDict(
      std::string_view(reinterpret_cast<const char*>(pickle->data()), pickle->size()), path);
  if (!records.ok()) return records.status();

  std::map<std::string, Storage> storages;
  for (const TorchTensorRecord& r : *records) {
    absl::StatusOr<DType> dtype = TorchStorageDType(r, path);
    if (!dtype.ok()) return dtype.status();
    if (absl::Status s = CheckTorchTensor(r, path); !s.ok()) return s;
    absl::StatusOr<const Storage*> storage = GetStorage(*archive, r, *dtype, &storages);
    if (!storage.ok()) return storage.status();
    TensorView view;
    view.name = r.name;
    view.file = path;
    view.dtype = *dtype;
    view.shape = r.shape;
    view.data =
        (*storage)->bytes->data() + static_cast<size_t>(r.storage_offset) * DTypeSize(*dtype);
    if (absl::Status s = store->Add(std::move(view)); !s.ok()) return s;
  }
  for (auto& [key, storage] : storages) store->Own(storage.bytes);
  return absl::OkStatus();
}

}  // namespace morserve
