#include "engine/tokenizer/jinja/methods.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace morserve::jinja {
namespace {

// Optional string argument that may be None (e.g. strip(None)).
const std::string* OptionalString(const std::string& method, const Value* v) {
  if (v == nullptr || v->is_none()) return nullptr;
  if (!v->is_string())
    Fail(absl::StrCat(method, "() argument must be str or None, not ", TypeName(*v)));
  return &v->as_string();
}

const std::string& StringArg(const std::string& method, const Value* v) {
  if (v == nullptr) Fail(absl::StrCat(method, "() missing a required argument"));
  if (!v->is_string()) Fail(absl::StrCat(method, "() argument must be str, not ", TypeName(*v)));
  return v->as_string();
}

int64_t IntArg(const std::string& method, const Value* v, int64_t def) {
  if (v == nullptr || v->is_none()) return def;
  if (!v->is_int()) Fail(absl::StrCat(method, "() argument must be int, not ", TypeName(*v)));
  return v->as_int();
}

Value StringList(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.emplace_back(std::move(p));
  return Value::MakeList(std::move(items));
}

// startswith/endswith with a str or tuple of str; start/end arguments are not supported.
bool AffixMatch(const std::string& method, const std::string& s, const Value* arg, bool prefix) {
  if (arg == nullptr) Fail(absl::StrCat(method, "() takes at least 1 argument (0 given)"));
  auto match = [&](const std::string& a) {
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg->is_string()) return match(arg->as_string());
  if (arg->is_list()) {
    for (const Value& v : arg->as_list().items) {
      if (match(StringArg(method, &v))) return true;
    }
    return false;
  }
  Fail(absl::StrCat(method, " first arg must be str or a tuple of str, not ", TypeName(*arg)));
}

// str.format with {}, {0} and {name} fields; no format specs.
std::string Format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos) Fail("Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        Fail("str.format: only {}, {N} and {name} fields are supported");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < args.positional.size() ? &args.positional[auto_index++] : nullptr;
      } else if (field.find_first_not_of("0123456789") == std::string::npos) {
        const size_t k = std::stoul(field);
        v = k < args.positional.size() ? &args.positional[k] : nullptr;
      } else {
        for (const auto& [name, x] : args.keyword) {
          if (name == field) v = &x;
        }
      }
      if (v == nullptr) Fail("str.format: no argument for field {" + field + "}");
      out += ToStr(*v);
      i = close;
    } else if (c == '}') {
      Fail("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<Value> StringMethod(const std::string& s, std::string_view name) {
  using Fn = std::function<Value(CallArgs&)>;
  Fn fn;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    fn = [s, left, right, name = std::string(name)](CallArgs& a) {
      a.Check(name, 1, {});
      return Value(PyStrip(s, OptionalString(name, a.Get(0, "")), left, right));
    };
  } else if (name == "split" || name == "rsplit") {
    fn = [s, name = std::string(name)](CallArgs& a) {
      a.Check(name, 2, {"sep", "maxsplit"});
      const std::string* sep = OptionalString(name, a.Get(0, "sep"));
      if (sep != nullptr && sep->empty()) Fail("empty separator");
      const int64_t maxsplit = IntArg(name, a.Get(1, "maxsplit"), -1);
      return StringList(name == "split" ? PySplit(s, sep, maxsplit) : PyRSplit(s, sep, maxsplit));
    };
  } else if (name == "startswith" || name == "endswith") {
    fn = [s, name = std::string(name)](CallArgs& a) {
      a.Check(name, 1, {});
      return Value(AffixMatch(name, s, a.Get(0, ""), name == "startswith"));
    };
  } else if (name == "replace") {
    fn = [s](CallArgs& a) {
      a.Check("replace", 3, {"count"});
      return Value(PyReplace(s, StringArg("replace", a.Get(0, "")),
                             StringArg("replace", a.Get(1, "")),
                             IntArg("replace", a.Get(2, "count"), -1)));
    };
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    fn = [s, name = std::string(name)](CallArgs& a) {
      a.Check(name, 0, {});
      if (name == "upper") return Value(AsciiUpper(s));
      if (name == "lower") return Value(AsciiLower(s));
      if (name == "title") return Value(PyTitle(s));
      return Value(PyCapitalize(s));
    };
  } else if (name == "find" || name == "rfind" || name == "count") {
    fn = [s, name = std::string(name)](CallArgs& a) {
      a.Check(name, 1, {});
      const std::string& sub = StringArg(name, a.Get(0, ""));
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(CharCount(s) + 1));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value(n);
      }
      const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
      if (at == std::string::npos) return Value(int64_t{-1});
      return Value(static_cast<int64_t>(CharCount(std::string_view(s).substr(0, at))));
    };
  } else if (name == "join") {
    fn = [s](CallArgs& a) {
      a.Check("join", 1, {});
      const Value* items = a.Get(0, "");
      if (items == nullptr) Fail("join() takes exactly one argument (0 given)");
      std::string out;
      bool first = true;
      for (const Value& v : Iterate(*items)) {
        if (!v.is_string()) Fail("sequence item: expected str instance, " + TypeName(v) + " found");
        if (!first) out += s;
        first = false;
        out += v.as_string();
      }
      return Value(std::move(out));
    };
  } else if (name == "format") {
    fn = [s](CallArgs& a) { return Value(Format(s, a)); };
  } else if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" ||
             name == "islower" || name == "isupper") {
    fn = [s, name = std::string(name)](CallArgs& a) {
      a.Check(name, 0, {});
      std::vector<std::string_view> chars = SplitChars(s);
      if (chars.empty()) return Value(false);
      if (name == "islower") return Value(AsciiLower(s) == s && AsciiUpper(s) != s);
      if (name == "isupper") return Value(AsciiUpper(s) == s && AsciiLower(s) != s);
      for (std::string_view c : chars) {
        const char b = c.size() == 1 ? c[0] : 0;
        const bool digit = b >= '0' && b <= '9';
        const bool alpha = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z');
        bool ok = name == "isdigit"   ? digit
                  : name == "isspace" ? IsPyWhitespace(c)
                  : name == "isalpha" ? alpha
                                      : alpha || digit;
        if (!ok) return Value(false);
      }
      return Value(true);
    };
  } else {
    return std::nullopt;
  }
  return Value::MakeCallable("str." + std::string(name), std::move(fn));
}

std::optional<Value> DictMethod(const Value& d, std::string_view name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Value::MakeCallable("dict." + std::string(name),
                               [d, name = std::string(name)](CallArgs& a) {
                                 a.Check(name, 0, {});
                                 std::vector<Value> out;
                                 for (const auto& [k, v] : d.as_dict().items) {
                                   if (name == "items")
                                     out.push_back(Value::MakeList({Value(k), v}, /*tuple=*/true));
                                   if (name == "keys") out.emplace_back(k);
                                   if (name == "values") out.push_back(v);
                                 }
                                 return Value::MakeList(std::move(out));
                               });
  }
  if (name == "get") {
    return Value::MakeCallable("dict.get", [d](CallArgs& a) {
      a.Check("get", 2, {});
      const Value* key = a.Get(0, "");
      if (key == nullptr) Fail("get expected at least 1 argument, got 0");
      const Value* def = a.Get(1, "");
      if (key->is_string()) {
        if (const Value* v = d.as_dict().Find(key->as_string())) return *v;
      }
      return def != nullptr ? *def : Value::None();
    });
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> GetMethod(const Value& obj, std::string_view name) {
  if (obj.is_string()) return StringMethod(obj.as_string(), name);
  if (obj.is_dict()) return DictMethod(obj, name);
  return std::nullopt;
}

}  // namespace morserve::jinja
