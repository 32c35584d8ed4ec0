#include "engine/tokenizer/jinja/globals.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/error.h"

namespace morserve::jinja {
namespace {

constexpr int64_t kMaxRange = 10'000'000;

Value Range(CallArgs& a) {
  a.Check("range", 3, {});
  std::vector<int64_t> n;
  for (const Value& v : a.positional) {
    if (!v.is_int() && !v.is_bool()) Fail("range() arguments must be integers, not " + TypeName(v));
    n.push_back(v.is_bool() ? v.as_bool() : v.as_int());
  }
  if (n.empty()) Fail("range expected at least 1 argument, got 0");
  const int64_t start = n.size() == 1 ? 0 : n[0];
  const int64_t stop = n.size() == 1 ? n[0] : n[1];
  const int64_t step = n.size() == 3 ? n[2] : 1;
  if (step == 0) Fail("range() arg 3 must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) Fail("range() too large");
    out.emplace_back(i);
  }
  return Value::MakeList(std::move(out));
}

Value MakeNamespace(CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  if (a.positional.size() > 1) Fail("namespace() takes at most 1 positional argument");
  if (!a.positional.empty()) {
    const Value& init = a.positional[0];
    if (!init.is_dict()) Fail("namespace() argument must be a mapping, not " + TypeName(init));
    ns->attrs = init.as_dict();
  }
  for (auto& [k, v] : a.keyword) ns->attrs.Set(k, v);
  return Value(std::move(ns));
}

Value MakeDict(CallArgs& a) {
  auto d = std::make_shared<Dict>();
  if (!a.positional.empty()) Fail("dict() takes keyword arguments only");
  for (auto& [k, v] : a.keyword) d->Set(k, v);
  return Value(std::move(d));
}

}  // namespace

void AddGlobals(const Clock& clock, Scope* scope) {
  scope->Set("raise_exception", Value::MakeCallable("raise_exception", [](CallArgs& a) -> Value {
               std::string message = a.positional.empty() ? "" : ToStr(a.positional[0]);
               throw JinjaError(ErrorKind::kRaised, std::move(message));
             }));
  scope->Set("range", Value::MakeCallable("range", Range));
  scope->Set("namespace", Value::MakeCallable("namespace", MakeNamespace));
  scope->Set("dict", Value::MakeCallable("dict", MakeDict));
  scope->Set("strftime_now", Value::MakeCallable("strftime_now", [clock](CallArgs& a) {
               a.Check("strftime_now", 1, {});
               if (a.positional.empty() || !a.positional[0].is_string()) {
                 Fail("strftime_now() needs a format string");
               }
               std::tm tm{};
               if (clock) {
                 tm = clock();
               } else {
                 const std::time_t now = std::time(nullptr);
                 localtime_r(&now, &tm);
               }
               char buf[512];
               const size_t n =
                   std::strftime(buf, sizeof(buf), a.positional[0].as_string().c_str(), &tm);
               if (n == 0 && !a.positional[0].as_string().empty())
                 Fail("strftime_now(): result too long");
               return Value(std::string(buf, n));
             }));
}

}  // namespace morserve::jinja
