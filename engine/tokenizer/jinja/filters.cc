#include "engine/tokenizer/jinja/filters.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/access.h"
#include "engine/tokenizer/jinja/builtin_tests.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/operators.h"
#include "engine/tokenizer/jinja/text.h"

namespace morserve::jinja {
namespace {

constexpr std::string_view kFilters[] = {
    "abs",    "attr",   "capitalize", "count",      "d",           "default", "dictsort",
    "e",      "escape", "first",      "float",      "forceescape", "indent",  "int",
    "items",  "join",   "last",       "length",     "list",        "lower",   "map",
    "max",    "min",    "reject",     "rejectattr", "replace",     "reverse", "round",
    "safe",   "select", "selectattr", "sort",       "string",      "sum",     "title",
    "tojson", "trim",   "unique",     "upper",      "wordcount"};

std::string FilterString(const std::string& filter, const Value* v) {
  if (v == nullptr || !v->is_string()) {
    Fail(absl::StrCat("filter '", filter, "': expected a string argument"));
  }
  return v->as_string();
}

bool FilterBool(const Value* v, bool def) { return v == nullptr ? def : Truthy(*v); }

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python int(x) for strings: optional sign and whitespace, digits with underscores.
bool ParseInt(const std::string& s, int64_t* out) {
  std::string t = PyStrip(s, nullptr, true, true);
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if ((c == '+' || c == '-') && i == 0) {
      digits += c;
    } else if (c >= '0' && c <= '9') {
      digits += c;
    } else if (c == '_' && i > 0 && i + 1 < t.size()) {
      continue;
    } else {
      return false;
    }
  }
  if (digits.empty() || digits == "+" || digits == "-") return false;
  errno = 0;
  char* end = nullptr;
  *out = std::strtoll(digits.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

bool ParseFloat(const std::string& s, double* out) {
  std::string t = PyStrip(s, nullptr, true, true);
  if (t.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return *end == '\0';
}

Value IntFilter(const Value& v, const CallArgs& args) {
  const Value* def = args.Get(0, "default");
  const Value fallback = def != nullptr ? *def : Value(int64_t{0});
  if (args.Get(1, "base") != nullptr) Fail("filter 'int': base is not supported");
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) return fallback;
    return Value(static_cast<int64_t>(std::trunc(v.as_float())));
  }
  if (v.is_string()) {
    int64_t i = 0;
    if (ParseInt(v.as_string(), &i)) return Value(i);
    double d = 0;
    if (ParseFloat(v.as_string(), &d) && std::isfinite(d))
      return Value(static_cast<int64_t>(std::trunc(d)));
  }
  return fallback;
}

Value FloatFilter(const Value& v, const CallArgs& args) {
  const Value* def = args.Get(0, "default");
  const Value fallback = def != nullptr ? *def : Value(0.0);
  if (v.is_number()) return Value(v.as_double());
  double d = 0;
  if (v.is_string() && ParseFloat(v.as_string(), &d)) return Value(d);
  return fallback;
}

Value ToJsonFilter(const Value& v, const CallArgs& args) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  args.Check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = FilterBool(args.Get(0, "ensure_ascii"), false);
  if (const Value* indent = args.Get(1, "indent"); indent != nullptr && !indent->is_none()) {
    if (indent->is_int()) {
      o.indent = indent->as_int();
    } else {
      Fail("filter 'tojson': indent must be an integer");
    }
    o.item_separator = ",";
  }
  if (const Value* sep = args.Get(2, "separators"); sep != nullptr && !sep->is_none()) {
    if (!sep->is_list() || sep->as_list().items.size() != 2 ||
        !sep->as_list().items[0].is_string() || !sep->as_list().items[1].is_string()) {
      Fail("filter 'tojson': separators must be a pair of strings");
    }
    o.item_separator = sep->as_list().items[0].as_string();
    o.key_separator = sep->as_list().items[1].as_string();
  }
  o.sort_keys = FilterBool(args.Get(3, "sort_keys"), false);
  return Value(ToJson(v, o));
}

std::vector<Value> Items(const Value& v) {
  if (v.is_undefined()) return {};
  if (!v.is_dict())
    Fail("filter 'items': can only get item pairs from a mapping, not " + TypeName(v));
  std::vector<Value> out;
  for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::MakeList({Value(k), x}, true));
  return out;
}

// select/reject/selectattr/rejectattr.
Value SelectFilter(std::string_view name, const Value& v, const CallArgs& args) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  size_t next = 0;
  std::string attr;
  if (by_attr) attr = FilterString(std::string(name), args.Get(next++, ""));
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > next) {
    test = FilterString(std::string(name), &args.positional[next++]);
    test_args.positional.assign(args.positional.begin() + static_cast<long>(next),
                                args.positional.end());
    if (!IsKnownTest(test)) Fail("filter '" + std::string(name) + "': unknown test '" + test + "'");
  }
  std::vector<Value> out;
  for (const Value& item : Iterate(v)) {
    const Value subject = by_attr ? GetAttributePath(item, attr) : item;
    const bool pass = test.empty() ? Truthy(subject) : ApplyTest(test, subject, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

Value MapFilter(const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (const Value* attr = args.Get(static_cast<size_t>(-1), "attribute")) {
    if (!attr->is_string() && !attr->is_int()) Fail("filter 'map': attribute must be a string");
    const std::string path = attr->is_string() ? attr->as_string() : std::to_string(attr->as_int());
    const Value* def = args.Get(static_cast<size_t>(-1), "default");
    for (const Value& item : Iterate(v)) {
      Value x = GetAttributePath(item, path);
      out.push_back(x.is_undefined() && def != nullptr ? *def : x);
    }
    return Value::MakeList(std::move(out));
  }
  if (args.positional.empty()) Fail("filter 'map': needs a filter name or attribute=");
  const std::string filter = FilterString("map", &args.positional[0]);
  if (!IsKnownFilter(filter) || filter == "map")
    Fail("filter 'map': unsupported filter '" + filter + "'");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : Iterate(v)) out.push_back(ApplyFilter(filter, item, rest));
  return Value::MakeList(std::move(out));
}

// Sort key with jinja2's case_sensitive=False: strings compare lowercased.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(AsciiLower(v.as_string()));
  return v;
}

Value SortFilter(const Value& v, const CallArgs& args) {
  args.Check("sort", 3, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = FilterBool(args.Get(0, "reverse"), false);
  const bool case_sensitive = FilterBool(args.Get(1, "case_sensitive"), false);
  const Value* attr = args.Get(2, "attribute");
  std::vector<Value> items = Iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) {
    Value key = attr != nullptr ? GetAttributePath(item, ToStr(*attr)) : item;
    keyed.emplace_back(SortKey(key, case_sensitive), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? Compare(b.first, a.first) < 0 : Compare(a.first, b.first) < 0;
  });
  std::vector<Value> out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

Value DictSortFilter(const Value& v, const CallArgs& args) {
  args.Check("dictsort", 3, {"case_sensitive", "by", "reverse"});
  const bool case_sensitive = FilterBool(args.Get(0, "case_sensitive"), false);
  const Value* by = args.Get(1, "by");
  const bool by_value = by != nullptr && ToStr(*by) == "value";
  const bool reverse = FilterBool(args.Get(2, "reverse"), false);
  std::vector<Value> items = Items(v);
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const Value& x = a.as_list().items[by_value ? 1 : 0];
    const Value& y = b.as_list().items[by_value ? 1 : 0];
    const int c = Compare(SortKey(x, case_sensitive), SortKey(y, case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return Value::MakeList(std::move(items));
}

Value IndentFilter(const Value& v, const CallArgs& args) {
  args.Check("indent", 3, {"width", "first", "blank"});
  const Value* width = args.Get(0, "width");
  std::string pad = "    ";
  if (width != nullptr)
    pad = width->is_string()
              ? width->as_string()
              : std::string(std::max<int64_t>(0, IntFilter(*width, {}).as_int()), ' ');
  const bool first = FilterBool(args.Get(1, "first"), false);
  const bool blank = FilterBool(args.Get(2, "blank"), false);
  std::string s = ToStr(v);
  std::string out;
  size_t start = 0;
  bool is_first = true;
  while (true) {
    const size_t nl = s.find('\n', start);
    std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    const bool empty = line.empty();
    if ((!is_first || first) && (blank || !empty)) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
    is_first = false;
  }
  return Value(std::move(out));
}

Value MinMax(const Value& v, const CallArgs& args, bool want_max) {
  args.Check(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  const bool case_sensitive = FilterBool(args.Get(0, "case_sensitive"), false);
  const Value* attr = args.Get(1, "attribute");
  std::vector<Value> items = Iterate(v);
  if (items.empty()) return Value::MakeUndefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  auto key = [&](const Value& x) {
    return SortKey(attr != nullptr ? GetAttributePath(x, ToStr(*attr)) : x, case_sensitive);
  };
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = Compare(key(items[i]), key(items[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

}  // namespace

bool IsKnownFilter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

Value ApplyFilter(std::string_view name, const Value& v, const CallArgs& args) {
  if (name == "safe") return v;
  if (name == "tojson") return ToJsonFilter(v, args);
  if (name == "default" || name == "d") {
    const Value* def = args.Get(0, "default_value");
    const bool boolean = FilterBool(args.Get(1, "boolean"), false);
    if (v.is_undefined() || (boolean && !Truthy(v))) return def != nullptr ? *def : Value("");
    return v;
  }
  if (name == "string") return Value(ToStr(v));
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(static_cast<int64_t>(CharCount(v.as_string())));
    if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().items.size()));
    if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().items.size()));
    if (v.is_undefined()) return Value(int64_t{0});
    Fail("object of type '" + TypeName(v) + "' has no len()");
  }
  if (name == "trim") {
    const Value* chars = args.Get(0, "chars");
    const std::string* set = chars != nullptr && !chars->is_none() ? &chars->as_string() : nullptr;
    if (chars != nullptr && !chars->is_none() && !chars->is_string())
      Fail("filter 'trim': chars must be a string");
    return Value(PyStrip(ToStr(v), set, true, true));
  }
  if (name == "upper") return Value(AsciiUpper(ToStr(v)));
  if (name == "lower") return Value(AsciiLower(ToStr(v)));
  if (name == "capitalize") return Value(PyCapitalize(ToStr(v)));
  if (name == "title") return Value(JinjaTitle(ToStr(v)));
  if (name == "e" || name == "escape" || name == "forceescape") return Value(HtmlEscape(ToStr(v)));
  if (name == "replace") {
    args.Check("replace", 3, {"old", "new", "count"});
    const Value* count = args.Get(2, "count");
    return Value(PyReplace(ToStr(v), FilterString(std::string(name), args.Get(0, "old")),
                           FilterString(std::string(name), args.Get(1, "new")),
                           count != nullptr && count->is_int() ? count->as_int() : -1));
  }
  if (name == "join") {
    args.Check("join", 2, {"d", "attribute"});
    const Value* sep = args.Get(0, "d");
    const Value* attr = args.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(v)) {
      if (!first) out += sep != nullptr ? ToStr(*sep) : "";
      first = false;
      out += ToStr(attr != nullptr ? GetAttributePath(item, ToStr(*attr)) : item);
    }
    return Value(std::move(out));
  }
  if (name == "first") {
    std::vector<Value> items = Iterate(v);
    return items.empty() ? Value::MakeUndefined("No first item, sequence was empty.")
                         : items.front();
  }
  if (name == "last") {
    std::vector<Value> items = Iterate(v);
    return items.empty() ? Value::MakeUndefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "list") return Value::MakeList(Iterate(v));
  if (name == "items") return Value::MakeList(Items(v));
  if (name == "reverse") {
    if (v.is_string()) return Slice(v, std::nullopt, std::nullopt, -1);
    std::vector<Value> items = Iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "unique") {
    std::vector<Value> out;
    for (const Value& item : Iterate(v)) {
      const Value key = SortKey(item, false);
      bool seen = false;
      for (const Value& o : out) seen = seen || Equal(SortKey(o, false), key);
      if (!seen) out.push_back(item);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "int") return IntFilter(v, args);
  if (name == "float") return FloatFilter(v, args);
  if (name == "abs") {
    if (v.is_int()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
    Fail("bad operand type for abs(): '" + TypeName(v) + "'");
  }
  if (name == "round") {
    args.Check("round", 2, {"precision", "method"});
    const Value* p = args.Get(0, "precision");
    const int64_t precision = p != nullptr && p->is_int() ? p->as_int() : 0;
    const std::string method = args.Get(1, "method") ? ToStr(*args.Get(1, "method")) : "common";
    if (!v.is_number()) Fail("filter 'round': expected a number");
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.as_double() * scale;
    const double r = method == "ceil"    ? std::ceil(x)
                     : method == "floor" ? std::floor(x)
                                         : std::round(x);
    return Value(r / scale);
  }
  if (name == "sum") {
    args.Check("sum", 2, {"attribute", "start"});
    const Value* attr = args.Get(0, "attribute");
    const Value* start = args.Get(1, "start");
    Value total = start != nullptr ? *start : Value(int64_t{0});
    for (const Value& item : Iterate(v)) {
      total = BinaryOp("+", total, attr != nullptr ? GetAttributePath(item, ToStr(*attr)) : item);
    }
    return total;
  }
  if (name == "min" || name == "max") return MinMax(v, args, name == "max");
  if (name == "wordcount")
    return Value(static_cast<int64_t>(PySplit(ToStr(v), nullptr, -1).size()));
  if (name == "attr") return GetAttr(v, FilterString(std::string(name), args.Get(0, "name")));
  if (name == "map") return MapFilter(v, args);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectFilter(name, v, args);
  }
  if (name == "sort") return SortFilter(v, args);
  if (name == "dictsort") return DictSortFilter(v, args);
  if (name == "indent") return IndentFilter(v, args);
  Fail("unsupported filter '" + std::string(name) + "'");
}

}  // namespace morserve::jinja
