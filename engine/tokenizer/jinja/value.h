// Runtime values of the Jinja interpreter, modelled on the Python objects that chat
// templates see under transformers: None, bool, int, float, str, list (and tuple), dict
// (insertion-ordered), jinja2 namespace, callables, and Jinja's Undefined. Lists, dicts and
// namespaces are shared by reference, as in Python, so `set ns.x = 1` is visible to every
// holder of `ns`. Printing, equality, truthiness and tojson follow Python's rules.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "nlohmann/json.hpp"

namespace morserve::jinja {

class Value;

struct List {
  std::vector<Value> items;
  bool tuple = false;  // only changes how it prints
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

struct Namespace {
  Dict attrs;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Argument `index`, or keyword `name`, or nullptr. Marks nothing; see CheckArity.
  const Value* Get(size_t index, std::string_view name) const;
  // Fails unless at most `max_positional` positionals and only `allowed` keywords are given.
  void Check(const std::string& fn, size_t max_positional,
             std::initializer_list<std::string_view> allowed) const;
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

struct Undefined {
  std::string hint;  // e.g. "'dict object' has no attribute 'x'" or "'foo' is undefined"
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() : v_(Undefined{}) {}
  static Value MakeUndefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value None() { return Value(nullptr); }
  Value(std::nullptr_t) : v_(std::monostate{}) {}
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::shared_ptr<List> l) : v_(std::move(l)) {}
  Value(std::shared_ptr<Dict> d) : v_(std::move(d)) {}
  Value(std::shared_ptr<Namespace> n) : v_(std::move(n)) {}
  Value(std::shared_ptr<Callable> c) : v_(std::move(c)) {}
  static Value MakeList(std::vector<Value> items, bool tuple = false);
  static Value MakeCallable(std::string name, std::function<Value(CallArgs&)> fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  double as_double() const;  // int, float or bool widened
  const std::string& as_string() const { return std::get<std::string>(v_); }
  List& as_list() const { return *std::get<std::shared_ptr<List>>(v_); }
  Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  std::variant<Undefined, std::monostate, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<Namespace>, std::shared_ptr<Callable>>
      v_;
};

// Python's type name, as used in error messages ("str", "list", "dict", "NoneType", ...).
std::string TypeName(const Value& v);
bool Truthy(const Value& v);
bool Equal(const Value& a, const Value& b);
// str(v) as Jinja prints it: None -> "None", True -> "True", Undefined -> "".
std::string ToStr(const Value& v);
std::string Repr(const Value& v);
// Fails with Jinja's UndefinedError message when v is undefined.
void RequireDefined(const Value& v);

// Items of an iterable as a for loop sees them: list items, dict keys, string characters;
// Undefined iterates as empty. Anything else fails.
std::vector<Value> Iterate(const Value& v);

struct JsonOptions {
  std::optional<int64_t> indent;
  std::string item_separator = ", ";  // Python's defaults; "," when indent is set
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(v, ...) as transformers' tojson filter calls it.
std::string ToJson(const Value& v, const JsonOptions& options);

Value FromJson(const nlohmann::ordered_json& j);

}  // namespace morserve::jinja
