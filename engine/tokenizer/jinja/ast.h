// Syntax tree of a parsed template. Nodes are plain structs with a kind tag and the byte
// offset of their first token, so that run-time errors can name a line and column. One
// Expr shape serves every expression kind; the comment on each kind says which fields it uses.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja/value.h"

namespace morserve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items
    kDict,      // args: keys and values interleaved
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]]; missing parts are null
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs)
    kTest,      // args[0] is [not] name(args[1..]); negated
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kNot,       // not args[0]
    kBinary,    // args[0] name args[1], name one of + - * / // % ** ~
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...; ops: == != < > <= >= in notin
    kCondExpr,  // args[1] if args[0] else args[2]; args[2] may be null
  };

  Kind kind;
  size_t offset = 0;
  std::string name;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // if expr: body else else_body (elif chains nest in else_body)
    kFor,       // for targets in expr [if filter]: body else else_body
    kSet,       // set targets = expr, or set targets[0].attr = expr (namespace)
    kSetBlock,  // set targets[0] %} body {% endset
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
    kScope,  // a block rendered in place ({% generation %})
  };

  Kind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;                                     // kSet on a namespace attribute
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro; default may be null
  Body body;
  Body else_body;
};

}  // namespace morserve::jinja
