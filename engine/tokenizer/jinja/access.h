// Attribute and item access with jinja2's rules: `a.b` tries a Python attribute (a method)
// before a dict key, `a[b]` tries the key first; a miss yields Undefined that remembers
// what was missing, and only touching an Undefined further (attribute, call, arithmetic)
// fails. Lists and strings index with Python's negative indices and slices.
#pragma once

#include <optional>
#include <string_view>

#include "engine/tokenizer/jinja/value.h"

namespace morserve::jinja {

Value GetAttr(const Value& obj, std::string_view name);
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] for lists and strings; nullopt parts are omitted.
Value Slice(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
            std::optional<int64_t> step);
// jinja2's make_attrgetter: "a.b.0" walks GetItem per dotted part (digits as indices).
Value GetAttributePath(const Value& obj, std::string_view path);

}  // namespace morserve::jinja
