#include "engine/tokenizer/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace morserve::jinja {

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

void CallArgs::Check(const std::string& fn, size_t max_positional,
                     std::initializer_list<std::string_view> allowed) const {
  if (positional.size() > max_positional) {
    Fail(absl::StrCat(fn, "() takes at most ", max_positional, " positional argument(s) (",
                      positional.size(), " given)"));
  }
  for (const auto& [k, v] : keyword) {
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      Fail(absl::StrCat(fn, "() got an unexpected keyword argument '", k, "'"));
    }
  }
}

Value Value::MakeList(std::vector<Value> items, bool tuple) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->tuple = tuple;
  return Value(std::move(l));
}

Value Value::MakeCallable(std::string name, std::function<Value(CallArgs&)> fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

double Value::as_double() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return as_float();
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.as_list().tuple ? "tuple" : "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return !v.as_list().items.empty();
    case Value::Kind::kDict:
      return !v.as_dict().items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
      const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.as_list().items;
      const auto& y = b.as_list().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.as_namespace() == &b.as_namespace();
    case Value::Kind::kCallable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return v.as_string();
    default:
      return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(v.as_int());
    case Value::Kind::kFloat:
      return PyFloatRepr(v.as_float());
    case Value::Kind::kString:
      return PyStrRepr(v.as_string());
    case Value::Kind::kList: {
      const List& l = v.as_list();
      std::string inner = absl::StrJoin(
          l.items, ", ", [](std::string* out, const Value& x) { out->append(Repr(x)); });
      if (l.tuple) return l.items.size() == 1 ? "(" + inner + ",)" : "(" + inner + ")";
      return "[" + inner + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.as_dict().items) {
        if (!first) out += ", ";
        first = false;
        out += PyStrRepr(k) + ": " + Repr(x);
      }
      return out + "}";
    }
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kCallable:
      return "<function " + v.as_callable().name + ">";
  }
  return "";
}

void RequireDefined(const Value& v) {
  if (v.is_undefined()) {
    Fail(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
  }
}

std::vector<Value> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.as_list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : v.as_dict().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (std::string_view c : SplitChars(v.as_string())) chars.emplace_back(std::string(c));
      return chars;
    }
    default:
      Fail("'" + TypeName(v) + "' object is not iterable");
  }
}

namespace {

void JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (std::string_view ch : SplitChars(s)) {
    const auto b = static_cast<unsigned char>(ch[0]);
    if (ch.size() == 1) {
      switch (b) {
        case '"':
          *out += "\\\"";
          continue;
        case '\\':
          *out += "\\\\";
          continue;
        case '\n':
          *out += "\\n";
          continue;
        case '\r':
          *out += "\\r";
          continue;
        case '\t':
          *out += "\\t";
          continue;
        case '\b':
          *out += "\\b";
          continue;
        case '\f':
          *out += "\\f";
          continue;
        default:
          break;
      }
      if (b < 0x20 || (ensure_ascii && b >= 0x80)) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", b);
        *out += buf;
        continue;
      }
      *out += ch;
      continue;
    }
    if (!ensure_ascii) {
      *out += ch;
      continue;
    }
    uint32_t cp = b & (ch.size() == 2 ? 0x1F : ch.size() == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < ch.size(); ++k) cp = (cp << 6) | (ch[k] & 0x3F);
    char buf[16];
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    }
    *out += buf;
  }
  *out += '"';
}

void JsonValue(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  if (depth > 512) Fail("tojson: value nested too deeply");
  const bool pretty = o.indent.has_value();
  auto newline = [&](int d) {
    *out += '\n';
    out->append(static_cast<size_t>(std::max<int64_t>(0, *o.indent)) * d, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return;
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      *out += absl::StrCat(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d))
        *out += "NaN";
      else if (std::isinf(d))
        *out += d < 0 ? "-Infinity" : "Infinity";
      else
        *out += PyFloatRepr(d);
      return;
    }
    case Value::Kind::kString:
      JsonString(v.as_string(), o.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (pretty) newline(depth + 1);
        JsonValue(items[i], o, depth + 1, out);
      }
      if (pretty) newline(depth);
      *out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.as_dict().items) entries.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      if (entries.empty()) {
        *out += "{}";
        return;
      }
      *out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (pretty) newline(depth + 1);
        JsonString(entries[i]->first, o.ensure_ascii, out);
        *out += o.key_separator;
        JsonValue(entries[i]->second, o, depth + 1, out);
      }
      if (pretty) newline(depth);
      *out += '}';
      return;
    }
    default:
      Fail("Object of type " + TypeName(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  JsonValue(v, options, 0, &out);
  return out;
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(FromJson(x));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (const auto& [k, x] : j.items()) d->items.emplace_back(k, FromJson(x));
      return Value(std::move(d));
    }
    default:
      return Value::None();  // binary and discarded values have no Python form
  }
}

}  // namespace morserve::jinja
