// Methods that templates call on values: str methods (strip, split, startswith, replace,
// ...) and the read-only dict methods (items, keys, values, get). Mutating methods
// (list.append, dict.update, ...) do not exist here, as under transformers'
// ImmutableSandboxedEnvironment.
#pragma once

#include <optional>
#include <string_view>

#include "engine/tokenizer/jinja/value.h"

namespace morserve::jinja {

// The method `name` of obj bound to obj, or nullopt when obj has no such method.
std::optional<Value> GetMethod(const Value& obj, std::string_view name);

}  // namespace morserve::jinja
