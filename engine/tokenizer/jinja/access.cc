#include "engine/tokenizer/jinja/access.h"

#include <string>
#include <vector>

#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/methods.h"
#include "engine/tokenizer/jinja/text.h"

namespace morserve::jinja {
namespace {

std::string MissingAttribute(const Value& obj, std::string_view name) {
  return "'" + TypeName(obj) + " object' has no attribute '" + std::string(name) + "'";
}

}  // namespace

Value GetAttr(const Value& obj, std::string_view name) {
  RequireDefined(obj);
  if (std::optional<Value> method = GetMethod(obj, name)) return *method;
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().Find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.as_namespace().attrs.Find(name)) return *v;
  }
  return Value::MakeUndefined(MissingAttribute(obj, name));
}

Value GetItem(const Value& obj, const Value& key) {
  RequireDefined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().Find(key.as_string())) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (obj.is_list()) {
      const auto& items = obj.as_list().items;
      const auto n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return items[i];
      return Value::MakeUndefined(TypeName(obj) + " object has no element " + std::to_string(i));
    }
    std::vector<std::string_view> chars = SplitChars(obj.as_string());
    const auto n = static_cast<int64_t>(chars.size());
    if (i < 0) i += n;
    if (i >= 0 && i < n) return Value(std::string(chars[i]));
    return Value::MakeUndefined("str object has no element " + std::to_string(i));
  }
  if (key.is_string()) {
    if (obj.is_namespace()) {
      if (const Value* v = obj.as_namespace().attrs.Find(key.as_string())) return *v;
    }
    if (std::optional<Value> method = GetMethod(obj, key.as_string())) return *method;
    return Value::MakeUndefined(MissingAttribute(obj, key.as_string()));
  }
  return Value::MakeUndefined("'" + TypeName(obj) + " object' has no element " + Repr(key));
}

Value Slice(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
            std::optional<int64_t> step) {
  RequireDefined(obj);
  if (!obj.is_list() && !obj.is_string())
    Fail("'" + TypeName(obj) + "' object is not subscriptable");
  const int64_t st = step.value_or(1);
  if (st == 0) Fail("slice step cannot be zero");
  std::vector<std::string_view> chars;
  int64_t n = 0;
  if (obj.is_string()) {
    chars = SplitChars(obj.as_string());
    n = static_cast<int64_t>(chars.size());
  } else {
    n = static_cast<int64_t>(obj.as_list().items.size());
  }
  // PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t b = adjust(start, st < 0 ? n - 1 : 0);
  const int64_t e = adjust(stop, st < 0 ? -1 : n);
  std::vector<Value> items;
  std::string text;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_string()) {
      text.append(chars[i]);
    } else {
      items.push_back(obj.as_list().items[i]);
    }
  }
  if (obj.is_string()) return Value(std::move(text));
  return Value::MakeList(std::move(items), obj.as_list().tuple);
}

Value GetAttributePath(const Value& obj, std::string_view path) {
  Value v = obj;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part(
        path.substr(start, dot == std::string_view::npos ? path.npos : dot - start));
    if (!part.empty() && part.size() < 18 &&
        part.find_first_not_of("0123456789") == std::string::npos) {
      v = GetItem(v, Value(static_cast<int64_t>(std::stoll(part))));
    } else {
      v = GetItem(v, Value(part));
    }
    if (dot == std::string_view::npos) return v;
    start = dot + 1;
  }
}

}  // namespace morserve::jinja
