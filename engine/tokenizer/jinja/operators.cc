#include "engine/tokenizer/jinja/operators.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/error.h"

namespace morserve::jinja {
namespace {

constexpr size_t kMaxRepeatBytes = size_t{64} << 20;

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t AsInt(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }

[[noreturn]] void Unsupported(const std::string& op, const Value& a, const Value& b) {
  Fail(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '",
                    TypeName(b), "'"));
}

Value Arithmetic(std::string_view op, const Value& a, const Value& b) {
  if (IsIntLike(a) && IsIntLike(b)) {
    const int64_t x = AsInt(a), y = AsInt(b);
    int64_t r = 0;
    if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value(r);
    if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value(r);
    if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value(r);
    if (op == "//" || op == "%") {
      if (y == 0) Fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) Fail("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (op == "**" && y >= 0) {
      int64_t acc = 1;
      for (int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(acc, x, &acc)) Fail("integer overflow in **");
        if (acc == 0 || acc == 1) break;
      }
      if (acc == 1 && x == -1 && y % 2 == 1) acc = -1;
      return Value(acc);
    }
    if (op == "+" || op == "-" || op == "*") Fail("integer overflow in " + std::string(op));
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "/") {
    if (y == 0) Fail("division by zero");
    return Value(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) Fail("float division or modulo by zero");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    if (op == "%") return Value(m);
    return Value(std::floor(x / y));
  }
  if (op == "**") {
    if (x == 0 && y < 0) Fail("0.0 cannot be raised to a negative power");
    return Value(std::pow(x, y));
  }
  Fail("unknown operator " + std::string(op));
}

Value Repeat(const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value(std::string()) : Value::MakeList({});
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (s.size() * static_cast<size_t>(n) > kMaxRepeatBytes) Fail("string repetition too large");
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.as_list().items;
  if (items.size() * static_cast<size_t>(n) > kMaxRepeatBytes / 16)
    Fail("list repetition too large");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::MakeList(std::move(out));
}

}  // namespace

Value BinaryOp(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") return Value(ToStr(a) + ToStr(b));
  RequireDefined(a);
  RequireDefined(b);
  if (a.is_number() && b.is_number()) return Arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::MakeList(std::move(items), a.as_list().tuple && b.as_list().tuple);
    }
    if (a.is_string()) {
      Fail(absl::StrCat("can only concatenate str (not \"", TypeName(b), "\") to str"));
    }
    if (a.is_list()) {
      Fail(absl::StrCat("can only concatenate list (not \"", TypeName(b), "\") to list"));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && IsIntLike(b)) return Repeat(a, AsInt(b));
    if ((b.is_string() || b.is_list()) && IsIntLike(a)) return Repeat(b, AsInt(a));
  }
  Unsupported(std::string(op), a, b);
}

int Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (IsIntLike(a) && IsIntLike(b)) return AsInt(a) < AsInt(b) ? -1 : AsInt(a) > AsInt(b);
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  RequireDefined(a);
  RequireDefined(b);
  Fail(absl::StrCat("'<' not supported between instances of '", TypeName(a), "' and '", TypeName(b),
                    "'"));
}

bool Contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!needle.is_string()) {
        Fail("'in <string>' requires string as left operand, not " + TypeName(needle));
      }
      return haystack.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : haystack.as_list().items) {
        if (Equal(v, needle)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return needle.is_string() && haystack.as_dict().Find(needle.as_string()) != nullptr;
    default:
      Fail("argument of type '" + TypeName(haystack) + "' is not iterable");
  }
}

}  // namespace morserve::jinja
