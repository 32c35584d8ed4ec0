// Safe reads of nested fields of a run's JSON (which fields exist depends on its flags: no
// --metrics-url, no "server_metrics"): JsonAt(j, {"a", "b"}) is j["a"]["b"] or null.
#pragma once

#include <initializer_list>

#include "nlohmann/json.hpp"

namespace morserve::loadtest {

inline nlohmann::json JsonAt(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* p = &j;
  for (const char* k : path) {
    if (!p->is_object() || !p->contains(k)) return nullptr;
    p = &(*p)[k];
  }
  return *p;
}

}  // namespace morserve::loadtest
