// safetensors reader (see safetensors.h). Layout: 8-byte little-endian header length N,
// N bytes of JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}),
// then the data region; offsets are relative to the start of the data region.
#include "engine/io/safetensors.h"

#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/io/mapped_file.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

using Json = nlohmann::ordered_json;  // keeps header order

constexpr char kMetadataKey[] = "__metadata__";

absl::Status FileError(const std::string& file, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}

absl::Status TensorError(const std::string& name, const std::string& file,
                         const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", file, ": ", what));
}

uint64_t ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses `text` as JSON without exceptions; sets *duplicate_key to a top-level key that
// occurs twice (nlohmann would silently keep the last one).
Json ParseHeaderJson(std::string_view text, std::string* duplicate_key) {
  std::set<std::string> keys;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.insert(key).second && duplicate_key->empty()) *duplicate_key = key;
    }
    return true;
  };
  return Json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
}

// Reads a JSON non-negative integer that fits in int64.
bool AsNonNegativeInt(const Json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
  } else {
    return false;
  }
  return *out <= static_cast<uint64_t>(INT64_MAX);
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const Json& j, const std::string& name,
                                                const std::string& file) {
  if (!j.is_array()) return TensorError(name, file, "'shape' is not an array");
  std::vector<int64_t> shape;
  for (const Json& d : j) {
    uint64_t v = 0;
    if (!AsNonNegativeInt(d, &v)) {
      return TensorError(name, file, absl::StrCat("bad dimension ", d.dump(), " in shape"));
    }
    shape.push_back(static_cast<int64_t>(v));
  }
  return shape;
}

// Byte size of a tensor, or an error when the product overflows.
absl::StatusOr<uint64_t> TensorBytes(const std::vector<int64_t>& shape, DType dtype,
                                     const std::string& name, const std::string& file) {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return TensorError(name, file, absl::StrCat("shape ", ShapeString(shape), " overflows"));
    }
  }
  return n;
}

absl::StatusOr<TensorView> ParseEntry(const std::string& name, const Json& entry,
                                      const uint8_t* data, uint64_t data_size,
                                      const std::string& file) {
  if (!entry.is_object()) return TensorError(name, file, "header entry is not an object");
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return TensorError(name, file, "missing or non-string 'dtype'");
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  const std::optional<DType> dtype = DTypeFromSafetensors(dtype_name);
  if (!dtype) return TensorError(name, file, absl::StrCat("unknown dtype '", dtype_name, "'"));
  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return TensorError(name, file, "missing 'shape'");
  absl::StatusOr<std::vector<int64_t>> shape = ParseShape(*shape_it, name, file);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<uint64_t> nbytes = TensorBytes(*shape, *dtype, name, file);
  if (!nbytes.ok()) return nbytes.status();

  const auto offsets_it = entry.find("data_offsets");
  uint64_t begin = 0, end = 0;
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !AsNonNegativeInt((*offsets_it)[0], &begin) || !AsNonNegativeInt((*offsets_it)[1], &end)) {
    return TensorError(name, file, "'data_offsets' is not two non-negative integers");
  }
  if (end < begin) {
    return TensorError(name, file, absl::StrCat("data_offsets end ", end, " < begin ", begin));
  }
  if (end > data_size) {
    return TensorError(name, file,
                       absl::StrCat("data_offsets [", begin, ", ", end,
                                    ") outside the data region of ", data_size, " bytes"));
  }
  if (end - begin != *nbytes) {
    return TensorError(
        name, file,
        absl::StrCat("size ", end - begin, " bytes does not match ", std::string(DTypeName(*dtype)),
                     " ", ShapeString(*shape), " (", *nbytes, " bytes)"));
  }
  TensorView view;
  view.name = name;
  view.file = file;
  view.dtype = *dtype;
  view.shape = *std::move(shape);
  view.data = data + begin;  // non-null even for an empty tensor: present, zero bytes
  return view;
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const char* text = reinterpret_cast<const char*>((*file)->data());
  Json j = Json::parse(text, text + (*file)->size(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return FileError(path, "not valid JSON");
  return j;
}

// Shard file names must stay inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

// weight_map as shard -> tensor names in it.
absl::StatusOr<std::map<std::string, std::set<std::string>>> ReadWeightMap(
    const std::string& index_path) {
  absl::StatusOr<Json> index = ReadJsonFile(index_path);
  if (!index.ok()) return index.status();
  if (!index->is_object()) return FileError(index_path, "index is not a JSON object");
  const auto it = index->find("weight_map");
  if (it == index->end() || !it->is_object()) {
    return FileError(index_path, "missing or non-object 'weight_map'");
  }
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [tensor, shard] : it->items()) {
    if (!shard.is_string() || !IsPlainFileName(shard.get_ref<const std::string&>())) {
      return TensorError(tensor, index_path,
                         absl::StrCat("weight_map value ", shard.dump(), " is not a file name"));
    }
    shards[shard.get<std::string>()].insert(tensor);
  }
  if (shards.empty()) return FileError(index_path, "empty 'weight_map'");
  return shards;
}

}  // namespace

absl::StatusOr<std::vector<TensorView>> ParseSafetensors(const uint8_t* bytes, size_t size,
                                                         const std::string& file) {
  if (size < 8) {
    return FileError(file, absl::StrCat("truncated: ", size,
                                        " bytes, need an 8-byte header "
                                        "length"));
  }
  const uint64_t header_len = ReadLe64(bytes);
  if (header_len > size - 8) {
    return FileError(file, absl::StrCat("header length ", header_len, " goes beyond the file (",
                                        size, " bytes)"));
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes + 8), header_len);
  std::string duplicate;
  const Json header = ParseHeaderJson(text, &duplicate);
  if (header.is_discarded()) return FileError(file, "header is not valid JSON");
  if (!header.is_object()) return FileError(file, "header is not a JSON object");
  if (!duplicate.empty()) return TensorError(duplicate, file, "listed twice in the header");

  const uint64_t data_size = size - 8 - header_len;
  const uint8_t* data = bytes + 8 + header_len;  // may be one past the end when empty
  std::vector<TensorView> views;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) continue;
    absl::StatusOr<TensorView> view = ParseEntry(name, entry, data, data_size, file);
    if (!view.ok()) return view.status();
    views.push_back(*std::move(view));
  }
  return views;
}

absl::Status LoadSafetensorsFile(const std::string& path, TensorStore* store) {
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<std::vector<TensorView>> views =
      ParseSafetensors((*file)->data(), (*file)->size(), path);
  if (!views.ok()) return views.status();
  store->Own(*file);
  for (TensorView& view : *views) {
    if (absl::Status s = store->Add(std::move(view)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status LoadShardedSafetensors(const std::string& index_path, TensorStore* store) {
  absl::StatusOr<std::map<std::string, std::set<std::string>>> shards = ReadWeightMap(index_path);
  if (!shards.ok()) return shards.status();
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  for (const auto& [shard, expected] : *shards) {
    const std::string path = (dir / shard).string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return TensorError(*expected.begin(), index_path,
                         absl::StrCat("shard ", path, " listed in the index is missing"));
    }
    absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(path);
    if (!file.ok()) return file.status();
    absl::StatusOr<std::vector<TensorView>> views =
        ParseSafetensors((*file)->data(), (*file)->size(), path);
    if (!views.ok()) return views.status();
    store->Own(*file);
    std::set<std::string> found;
    for (TensorView& view : *views) {
      const std::string name = view.name;
      // Add first: a tensor in two shards is reported with both files.
      if (absl::Status s = store->Add(std::move(view)); !s.ok()) return s;
      if (!expected.contains(name)) {
        return TensorError(name, path, absl::StrCat("not listed for this shard in ", index_path));
      }
      found.insert(name);
    }
    for (const std::string& name : expected) {
      if (!found.contains(name)) {
        return TensorError(name, path,
                           absl::StrCat("listed in ", index_path, " but not found in the shard"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace morserve
