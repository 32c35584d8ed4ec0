#include "engine/tokenizer/jinja/builtin_tests.h"

#include <cmath>
#include <string>

#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/operators.h"
#include "engine/tokenizer/jinja/text.h"

namespace morserve::jinja {
namespace {

constexpr std::string_view kTests[] = {
    "defined", "undefined", "none",   "boolean", "true",        "false",    "integer",
    "float",   "number",    "string", "mapping", "iterable",    "sequence", "callable",
    "sameas",  "escaped",   "lower",  "upper",   "even",        "odd",      "divisibleby",
    "eq",      "equalto",   "==",     "ne",      "!=",          "lt",       "lessthan",
    "<",       "le",        "<=",     "gt",      "greaterthan", ">",        "ge",
    ">=",      "in"};

const Value& Arg(std::string_view test, const CallArgs& args) {
  const Value* v = args.Get(0, "value");
  if (v == nullptr) Fail("test '" + std::string(test) + "' needs an argument");
  return *v;
}

int64_t IntOperand(std::string_view test, const Value& v) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  Fail("test '" + std::string(test) + "' needs an integer, got " + TypeName(v));
}

}  // namespace

bool IsKnownTest(std::string_view name) {
  for (std::string_view t : kTests) {
    if (t == name) return true;
  }
  return false;
}

bool ApplyTest(std::string_view name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  // Undefined has __len__ and __getitem__ in jinja2, so it counts as a sequence.
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && AsciiLower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && AsciiUpper(v.as_string()) == v.as_string();
  if (name == "even") return IntOperand(name, v) % 2 == 0;
  if (name == "odd") return IntOperand(name, v) % 2 != 0;
  if (name == "divisibleby") {
    const int64_t d = IntOperand(name, Arg(name, args));
    if (d == 0) Fail("integer division or modulo by zero");
    return IntOperand(name, v) % d == 0;
  }
  if (name == "sameas") {
    const Value& o = Arg(name, args);
    if (v.kind() != o.kind()) return false;
    if (v.is_list()) return &v.as_list() == &o.as_list();
    if (v.is_dict()) return &v.as_dict() == &o.as_dict();
    return Equal(v, o);
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, Arg(name, args));
  if (name == "ne" || name == "!=") return !Equal(v, Arg(name, args));
  if (name == "lt" || name == "lessthan" || name == "<") return Compare(v, Arg(name, args)) < 0;
  if (name == "le" || name == "<=") return Compare(v, Arg(name, args)) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(v, Arg(name, args)) > 0;
  if (name == "ge" || name == ">=") return Compare(v, Arg(name, args)) >= 0;
  if (name == "in") return Contains(Arg(name, args), v);
  Fail("unsupported test '" + std::string(name) + "'");
}

}  // namespace morserve::jinja
