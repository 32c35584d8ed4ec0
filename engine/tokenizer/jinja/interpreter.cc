#include "engine/tokenizer/jinja/interpreter.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/access.h"
#include "engine/tokenizer/jinja/builtin_tests.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/filters.h"
#include "engine/tokenizer/jinja/operators.h"

namespace morserve::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits) : limits_(limits) {}

  Flow Exec(const Body& body, const ScopePtr& scope, std::string* out) {
    for (const StmtPtr& stmt : body) {
      Step();
      Flow flow;
      try {
        flow = ExecStmt(*stmt, scope, out);
      } catch (JinjaError& e) {
        if (e.offset == JinjaError::kNoOffset) e.offset = stmt->offset;
        throw;
      }
      if (flow != Flow::kNormal) return flow;
      if (out->size() > limits_.max_output_bytes) Fail("rendered output exceeds the size limit");
    }
    return Flow::kNormal;
  }

 private:
  void Step() {
    if (++steps_ > limits_.max_steps) Fail("rendering exceeds the step limit (a runaway loop?)");
  }

  Flow ExecStmt(const Stmt& s, const ScopePtr& scope, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out->append(s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out->append(ToStr(Eval(*s.expr, scope)));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        return Exec(Truthy(Eval(*s.expr, scope)) ? s.body : s.else_body, scope, out);
      case Stmt::Kind::kFor:
        return ExecFor(s, scope, out);
      case Stmt::Kind::kSet:
        ExecSet(s, Eval(*s.expr, scope), scope);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string text;
        Exec(s.body, scope, &text);
        scope->Set(s.targets[0], Value(std::move(text)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->Set(s.name, MakeMacro(s, scope));
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kScope:
        return Exec(s.body, scope, out);
    }
    return Flow::kNormal;
  }

  static void Assign(const std::vector<std::string>& targets, const Value& v, Scope* scope) {
    if (targets.size() == 1) {
      scope->Set(targets[0], v);
      return;
    }
    RequireDefined(v);
    if (!v.is_list() && !v.is_string())
      Fail("cannot unpack non-iterable " + TypeName(v) + " object");
    std::vector<Value> items = Iterate(v);
    if (items.size() != targets.size()) {
      Fail(absl::StrCat(items.size() < targets.size() ? "not enough" : "too many",
                        " values to unpack (expected ", targets.size(), ", got ", items.size(),
                        ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->Set(targets[i], items[i]);
  }

  void ExecSet(const Stmt& s, Value v, const ScopePtr& scope) {
    if (s.attr.empty()) {
      Assign(s.targets, v, scope.get());
      return;
    }
    const Value* ns = scope->Lookup(s.targets[0]);
    if (ns == nullptr || !ns->is_namespace()) {
      Fail("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
    }
    ns->as_namespace().attrs.Set(s.attr, std::move(v));
  }

  Flow ExecFor(const Stmt& s, const ScopePtr& scope, std::string* out) {
    const Value iterable = Eval(*s.expr, scope);
    std::vector<Value> items = Iterate(iterable);
    auto loop_scope = std::make_shared<Scope>(scope);
    if (s.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        Step();
        Assign(s.targets, item, loop_scope.get());
        if (Truthy(Eval(*s.filter, loop_scope))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Step();
      Assign(s.targets, items[i], loop_scope.get());
      loop_scope->Set("loop", LoopValue(items, i));
      if (Exec(s.body, loop_scope, out) == Flow::kBreak) break;
    }
    if (n == 0) return Exec(s.else_body, loop_scope, out);
    return Flow::kNormal;
  }

  static Value LoopValue(const std::vector<Value>& items, int64_t i) {
    const auto n = static_cast<int64_t>(items.size());
    auto d = std::make_shared<Dict>();
    d->items = {
        {"index", Value(i + 1)},
        {"index0", Value(i)},
        {"revindex", Value(n - i)},
        {"revindex0", Value(n - i - 1)},
        {"first", Value(i == 0)},
        {"last", Value(i == n - 1)},
        {"length", Value(n)},
        {"depth", Value(int64_t{1})},
        {"depth0", Value(int64_t{0})},
        {"previtem", i > 0 ? items[i - 1] : Value::MakeUndefined("there is no previous item")},
        {"nextitem", i + 1 < n ? items[i + 1] : Value::MakeUndefined("there is no next item")},
        {"cycle",
         Value::MakeCallable("loop.cycle",
                             [i](CallArgs& a) {
                               if (a.positional.empty()) Fail("no items for cycling given");
                               return a.positional[static_cast<size_t>(i) % a.positional.size()];
                             })},
    };
    return Value(std::move(d));
  }

  Value MakeMacro(const Stmt& s, const ScopePtr& def_scope) {
    // A weak reference: the defining scope holds the macro, so a strong one would be a cycle.
    // The syntax tree and this interpreter outlive every call made during the render.
    std::weak_ptr<Scope> weak_scope = def_scope;
    return Value::MakeCallable(s.name, [this, &s, weak_scope](CallArgs& a) {
      ScopePtr def_scope = weak_scope.lock();
      if (!def_scope) Fail("macro '" + s.name + "' called outside its scope");
      if (a.positional.size() > s.params.size()) {
        Fail(absl::StrCat("macro '", s.name, "' takes not more than ", s.params.size(),
                          " argument(s)"));
      }
      auto scope = std::make_shared<Scope>(def_scope);
      std::vector<bool> bound(s.params.size(), false);
      for (size_t i = 0; i < a.positional.size(); ++i) {
        scope->Set(s.params[i].first, a.positional[i]);
        bound[i] = true;
      }
      for (auto& [k, v] : a.keyword) {
        size_t i = 0;
        while (i < s.params.size() && s.params[i].first != k) ++i;
        if (i == s.params.size())
          Fail("macro '" + s.name + "' takes no keyword argument '" + k + "'");
        scope->Set(k, v);
        bound[i] = true;
      }
      for (size_t i = 0; i < s.params.size(); ++i) {
        if (bound[i]) continue;
        scope->Set(s.params[i].first, s.params[i].second
                                          ? Eval(*s.params[i].second, scope)
                                          : Value::MakeUndefined("parameter '" + s.params[i].first +
                                                                 "' was not provided"));
      }
      if (++call_depth_ > limits_.max_call_depth) {
        --call_depth_;
        Fail("maximum macro recursion depth exceeded");
      }
      std::string text;
      try {
        Exec(s.body, scope, &text);
      } catch (...) {
        --call_depth_;
        throw;
      }
      --call_depth_;
      return Value(std::move(text));
    });
  }

  Value Eval(const Expr& e, const ScopePtr& scope) {
    try {
      return EvalNode(e, scope);
    } catch (JinjaError& err) {
      if (err.offset == JinjaError::kNoOffset) err.offset = e.offset;
      throw;
    }
  }

  CallArgs EvalArgs(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i)
      args.positional.push_back(Eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, Eval(*v, scope));
    return args;
  }

  std::optional<int64_t> SliceBound(const ExprPtr& e, const ScopePtr& scope) {
    if (!e) return std::nullopt;
    const Value v = Eval(*e, scope);
    if (v.is_none()) return std::nullopt;
    if (v.is_int()) return v.as_int();
    if (v.is_bool()) return static_cast<int64_t>(v.as_bool());
    Fail("slice indices must be integers or None, not " + TypeName(v));
  }

  Value EvalNode(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        const Value* v = scope->Lookup(e.name);
        return v != nullptr ? *v : Value::MakeUndefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        for (const ExprPtr& x : e.args) items.push_back(Eval(*x, scope));
        return Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value key = Eval(*e.args[i], scope);
          if (!key.is_string()) Fail("dict literal keys must be strings, not " + TypeName(key));
          d->Set(key.as_string(), Eval(*e.args[i + 1], scope));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::kGetAttr:
        return GetAttr(Eval(*e.args[0], scope), e.name);
      case Expr::Kind::kGetItem:
        return GetItem(Eval(*e.args[0], scope), Eval(*e.args[1], scope));
      case Expr::Kind::kSlice: {
        const Value obj = Eval(*e.args[0], scope);
        const auto start = SliceBound(e.args[1], scope);
        const auto stop = SliceBound(e.args[2], scope);
        const auto step = SliceBound(e.args[3], scope);
        return Slice(obj, start, stop, step);
      }
      case Expr::Kind::kCall: {
        const Value callee = Eval(*e.args[0], scope);
        RequireDefined(callee);
        if (!callee.is_callable()) Fail("'" + TypeName(callee) + "' object is not callable");
        CallArgs args = EvalArgs(e, 1, scope);
        return callee.as_callable().fn(args);
      }
      case Expr::Kind::kFilter: {
        const Value operand = Eval(*e.args[0], scope);
        return ApplyFilter(e.name, operand, EvalArgs(e, 1, scope));
      }
      case Expr::Kind::kTest: {
        const Value operand = Eval(*e.args[0], scope);
        return Value(ApplyTest(e.name, operand, EvalArgs(e, 1, scope)) != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        const Value v = Eval(*e.args[0], scope);
        RequireDefined(v);
        if (!v.is_number()) {
          Fail(absl::StrCat("bad operand type for unary ", e.kind == Expr::Kind::kNeg ? "-" : "+",
                            ": '", TypeName(v), "'"));
        }
        if (e.kind == Expr::Kind::kPos)
          return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;
        if (v.is_float()) return Value(-v.as_float());
        return BinaryOp("-", Value(int64_t{0}), v);
      }
      case Expr::Kind::kNot:
        return Value(!Truthy(Eval(*e.args[0], scope)));
      case Expr::Kind::kBinary: {
        const Value a = Eval(*e.args[0], scope);
        const Value b = Eval(*e.args[1], scope);
        return BinaryOp(e.name, a, b);
      }
      case Expr::Kind::kAnd: {
        Value a = Eval(*e.args[0], scope);
        return Truthy(a) ? Eval(*e.args[1], scope) : a;
      }
      case Expr::Kind::kOr: {
        Value a = Eval(*e.args[0], scope);
        return Truthy(a) ? a : Eval(*e.args[1], scope);
      }
      case Expr::Kind::kCompare:
        return EvalCompare(e, scope);
      case Expr::Kind::kCondExpr: {
        if (Truthy(Eval(*e.args[0], scope))) return Eval(*e.args[1], scope);
        if (e.args[2]) return Eval(*e.args[2], scope);
        return Value::MakeUndefined(
            "the inline if-expression evaluated to false and no else "
            "section was defined");
      }
    }
    Fail("unknown expression");
  }

  Value EvalCompare(const Expr& e, const ScopePtr& scope) {
    Value left = Eval(*e.args[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = Eval(*e.args[i + 1], scope);
      const std::string& op = e.ops[i];
      bool ok;
      if (op == "==")
        ok = Equal(left, right);
      else if (op == "!=")
        ok = !Equal(left, right);
      else if (op == "in")
        ok = Contains(right, left);
      else if (op == "notin")
        ok = !Contains(right, left);
      else {
        const int c = Compare(left, right);
        ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
      }
      if (!ok) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  RenderLimits limits_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::string Interpret(const Body& body, ScopePtr globals, const RenderLimits& limits) {
  Interpreter interpreter(limits);
  std::string out;
  interpreter.Exec(body, globals, &out);
  return out;
}

}  // namespace morserve::jinja
