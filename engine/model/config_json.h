// JSON field readers shared by the config parsers (engine/model/config.cc, huginn_config.cc):
// each error names the field as "<prefix><key>: <problem>".
#pragma once

#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace morserve::config_json {

using nlohmann::json;

// A JSON value quoted in an error message. Values may hold ill-formed UTF-8 when the object
// did not come from JSON text (the MoR YAML import): replaced, never thrown.
inline std::string Quote(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

inline absl::Status FieldError(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// Reads an integer field; `required` makes absence an error.
inline absl::Status GetInt(const json& j, const std::string& prefix, const char* key, bool required,
                           int* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? FieldError(prefix + key, "missing") : absl::OkStatus();
  }
  if (!it->is_number_integer()) return FieldError(prefix + key, "must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > (1 << 30)) return FieldError(prefix + key, absl::StrCat("out of range: ", v));
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

inline absl::Status GetFloat(const json& j, const std::string& prefix, const char* key,
                             float* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return FieldError(prefix + key, "must be a number");
  *out = it->get<float>();
  if (std::isnan(*out)) return FieldError(prefix + key, "is NaN");
  return absl::OkStatus();
}

inline absl::Status GetBool(const json& j, const std::string& prefix, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(prefix + key, "must be true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

// Reads a string field that must be one of `names` (mapped to `values`).
template <typename E>
absl::Status GetEnum(const json& j, const std::string& prefix, const char* key,
                     const std::vector<std::pair<const char*, E>>& options, E* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  std::vector<std::string> names;
  for (const auto& [name, value] : options) {
    names.push_back(name);
    if (it->is_string() && it->get<std::string>() == name) {
      *out = value;
      return absl::OkStatus();
    }
  }
  return FieldError(prefix + key, absl::StrCat("must be one of ", absl::StrJoin(names, ", "),
                                               ", got ", Quote(*it)));
}

inline absl::Status CheckKnownKeys(const json& j, const std::string& prefix,
                                   const std::set<std::string>& known) {
  if (!j.is_object()) return FieldError(prefix.substr(0, prefix.size() - 1), "must be an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.count(it.key())) {
      return FieldError(prefix + it.key(),
                        absl::StrCat("unknown key (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

inline absl::Status GetTokenIds(const json& j, const char* key, std::vector<int>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_integer()) {
    out->push_back(it->get<int>());
    return absl::OkStatus();
  }
  if (it->is_array()) {
    for (const json& v : *it) {
      if (!v.is_number_integer()) return FieldError(key, "must be an integer or a list of them");
      out->push_back(v.get<int>());
    }
    return absl::OkStatus();
  }
  return FieldError(key, "must be an integer or a list of them");
}

inline bool Truthy(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

template <size_t N>
bool OneOf(const std::string& v, const char* const (&list)[N]) {
  for (const char* x : list) {
    if (v == x) return true;
  }
  return false;
}

}  // namespace morserve::config_json
