// A variable scope. Lookups walk to the parent; assignments always land in the scope itself,
// which gives jinja2's rule that `set` inside a for loop or macro does not leak out.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/tokenizer/jinja/value.h"

namespace morserve::jinja {

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent = nullptr) : parent_(std::move(parent)) {}

  const Value* Lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
      auto it = s->vars_.find(name);
      if (it != s->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void Set(std::string name, Value value) { vars_[std::move(name)] = std::move(value); }

 private:
  std::shared_ptr<Scope> parent_;
  std::unordered_map<std::string, Value> vars_;
};

using ScopePtr = std::shared_ptr<Scope>;

}  // namespace morserve::jinja
