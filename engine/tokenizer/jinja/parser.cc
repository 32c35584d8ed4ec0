#include "engine/tokenizer/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/builtin_tests.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/filters.h"

namespace morserve::jinja {
namespace {

constexpr int kMaxDepth = 200;

[[noreturn]] void SyntaxError(std::string message, size_t offset) {
  throw JinjaError(ErrorKind::kSyntax, std::move(message), offset);
}
[[noreturn]] void Unsupported(std::string message, size_t offset) {
  throw JinjaError(ErrorKind::kUnsupported, std::move(message), offset);
}

ExprPtr MakeExpr(Expr::Kind kind, size_t offset) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->offset = offset;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body ParseTemplate() {
    Body body = ParseUntil({});
    return body;
  }

 private:
  // ----- token helpers
  const Token& Peek(size_t k = 0) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  const Token& Next() {
    const Token& t = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op, size_t k = 0) const {
    return Peek(k).type == TokenType::kOperator && Peek(k).value == op;
  }
  bool IsName(std::string_view name, size_t k = 0) const {
    return Peek(k).type == TokenType::kName && Peek(k).value == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEnd:
        return "end of template";
      case TokenType::kText:
        return "template text";
      case TokenType::kVarBegin:
        return "'{{'";
      case TokenType::kVarEnd:
        return "'}}'";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kString:
        return "string literal";
      default:
        return "'" + t.value + "'";
    }
  }
  void ExpectOp(const std::string& op) {
    if (!SkipOp(op)) {
      SyntaxError(absl::StrCat("expected '", op, "', got ", Describe(Peek())), Peek().offset);
    }
  }
  std::string ExpectName(const std::string& what) {
    if (Peek().type != TokenType::kName) {
      SyntaxError(absl::StrCat("expected ", what, ", got ", Describe(Peek())), Peek().offset);
    }
    return Next().value;
  }
  void ExpectBlockEnd() {
    if (Peek().type != TokenType::kBlockEnd) {
      SyntaxError("expected end of statement '%}', got " + Describe(Peek()), Peek().offset);
    }
    Next();
  }
  // Consumes "{% name %}".
  void ExpectEndTag(const std::string& name) {
    if (Peek().type != TokenType::kBlockBegin || !IsName(name, 1)) {
      SyntaxError(absl::StrCat("expected '{% ", name, " %}', got ", Describe(Peek())),
                  Peek().offset);
    }
    Next();
    Next();
    ExpectBlockEnd();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxDepth) SyntaxError("template nested too deeply", p->Peek().offset);
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  // ----- statements
  // Parses until "{% kw" with kw in `end` (left unconsumed) or, when `end` is empty, until the
  // end of the template.
  Body ParseUntil(std::initializer_list<std::string_view> end) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = Peek();
      switch (t.type) {
        case TokenType::kEnd:
          if (end.size() != 0) {
            SyntaxError(absl::StrCat("unexpected end of template, expected '{% ",
                                     std::string(*(end.end() - 1)), " %}'"),
                        t.offset);
          }
          return body;
        case TokenType::kText: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kText;
          s->offset = t.offset;
          s->text = Next().value;
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kVarBegin: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kOutput;
          s->offset = Next().offset;
          s->expr = ParseTuple(true);
          if (Peek().type != TokenType::kVarEnd) {
            SyntaxError("expected end of print statement '}}', got " + Describe(Peek()),
                        Peek().offset);
          }
          Next();
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kBlockBegin: {
          if (Peek(1).type == TokenType::kName) {
            for (std::string_view kw : end) {
              if (Peek(1).value == kw) return body;
            }
          }
          body.push_back(ParseStatement());
          break;
        }
        default:
          SyntaxError("unexpected " + Describe(t), t.offset);
      }
    }
  }

  StmtPtr ParseStatement() {
    const size_t offset = Next().offset;  // {%
    const Token& kw = Peek();
    if (kw.type != TokenType::kName)
      SyntaxError("expected statement name, got " + Describe(kw), kw.offset);
    const std::string name = Next().value;
    auto s = std::make_unique<Stmt>();
    s->offset = offset;
    if (name == "if") return ParseIf(std::move(s));
    if (name == "for") return ParseFor(std::move(s));
    if (name == "set") return ParseSet(std::move(s));
    if (name == "macro") return ParseMacro(std::move(s));
    if (name == "break" || name == "continue") {
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      ExpectBlockEnd();
      return s;
    }
    if (name == "generation") {
      // transformers' AssistantTracker block: renders its body in place.
      s->kind = Stmt::Kind::kScope;
      ExpectBlockEnd();
      s->body = ParseUntil({"endgeneration"});
      ExpectEndTag("endgeneration");
      return s;
    }
    static constexpr std::string_view kKnown[] = {"call", "filter",     "include", "import",
                                                  "from", "extends",    "block",   "with",
                                                  "do",   "autoescape", "trans"};
    for (std::string_view k : kKnown) {
      if (name == k) Unsupported("unsupported statement '{% " + name + " %}'", kw.offset);
    }
    SyntaxError("unknown statement '" + name + "'", kw.offset);
  }

  StmtPtr ParseIf(StmtPtr s) {
    s->kind = Stmt::Kind::kIf;
    s->expr = ParseTuple(true);
    ExpectBlockEnd();
    s->body = ParseUntil({"elif", "else", "endif"});
    const size_t tag_offset = Next().offset;  // {%
    const std::string which = Next().value;
    if (which == "elif") {
      auto nested = std::make_unique<Stmt>();
      nested->offset = tag_offset;
      s->else_body.push_back(ParseIf(std::move(nested)));
    } else if (which == "else") {
      ExpectBlockEnd();
      s->else_body = ParseUntil({"endif"});
      ExpectEndTag("endif");
    } else {
      ExpectBlockEnd();
    }
    return s;
  }

  std::vector<std::string> ParseTargets(const std::string& what) {
    std::vector<std::string> names;
    const bool paren = SkipOp("(");
    do {
      if (paren && IsOp(")")) break;
      names.push_back(ExpectName(what));
    } while (SkipOp(","));
    if (paren) ExpectOp(")");
    return names;
  }

  StmtPtr ParseFor(StmtPtr s) {
    s->kind = Stmt::Kind::kFor;
    s->targets = ParseTargets("loop variable name");
    if (!SkipName("in"))
      SyntaxError("expected 'in' in for loop, got " + Describe(Peek()), Peek().offset);
    s->expr = ParseTuple(false);
    if (SkipName("if")) s->filter = ParseExpression(true);
    if (IsName("recursive")) Unsupported("recursive for loops are not supported", Peek().offset);
    ExpectBlockEnd();
    s->body = ParseUntil({"else", "endfor"});
    if (IsName("else", 1)) {
      Next();
      Next();
      ExpectBlockEnd();
      s->else_body = ParseUntil({"endfor"});
    }
    ExpectEndTag("endfor");
    return s;
  }

  StmtPtr ParseSet(StmtPtr s) {
    s->kind = Stmt::Kind::kSet;
    if (Peek().type == TokenType::kName && IsOp(".", 1)) {
      s->targets.push_back(Next().value);
      Next();
      s->attr = ExpectName("attribute name");
    } else {
      s->targets = ParseTargets("variable name");
    }
    if (SkipOp("=")) {
      s->expr = ParseTuple(true);
      ExpectBlockEnd();
      return s;
    }
    if (s->targets.size() != 1 || !s->attr.empty()) {
      SyntaxError("expected '=' in set statement", Peek().offset);
    }
    if (IsOp("|")) Unsupported("filtered block set is not supported", Peek().offset);
    ExpectBlockEnd();
    s->kind = Stmt::Kind::kSetBlock;
    s->body = ParseUntil({"endset"});
    ExpectEndTag("endset");
    return s;
  }

  StmtPtr ParseMacro(StmtPtr s) {
    s->kind = Stmt::Kind::kMacro;
    s->name = ExpectName("macro name");
    ExpectOp("(");
    bool saw_default = false;
    while (!IsOp(")")) {
      if (!s->params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      std::string param = ExpectName("parameter name");
      ExprPtr def;
      if (SkipOp("=")) {
        def = ParseExpression(true);
        saw_default = true;
      } else if (saw_default) {
        SyntaxError("non-default argument follows default argument", Peek().offset);
      }
      s->params.emplace_back(std::move(param), std::move(def));
    }
    ExpectOp(")");
    ExpectBlockEnd();
    s->body = ParseUntil({"endmacro"});
    ExpectEndTag("endmacro");
    return s;
  }

  // ----- expressions
  ExprPtr ParseTuple(bool with_condexpr) {
    const size_t offset = Peek().offset;
    ExprPtr first = ParseExpression(with_condexpr);
    if (!IsOp(",")) return first;
    auto tuple = MakeExpr(Expr::Kind::kTuple, offset);
    tuple->args.push_back(std::move(first));
    while (SkipOp(",")) {
      const TokenType t = Peek().type;
      if (t == TokenType::kVarEnd || t == TokenType::kBlockEnd || IsOp(")") || IsName("if")) break;
      tuple->args.push_back(ParseExpression(with_condexpr));
    }
    return tuple;
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    if (!with_condexpr) return ParseOr();
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      const size_t offset = Next().offset;
      auto cond = MakeExpr(Expr::Kind::kCondExpr, offset);
      cond->args.push_back(ParseOr());
      cond->args.push_back(std::move(expr));
      cond->args.push_back(SkipName("else") ? ParseExpression(true) : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  // `left (word right)*` for the keyword operators `or` and `and`, left-associative.
  ExprPtr ParseLogical(const char* word, Expr::Kind kind, ExprPtr (Parser::*next)()) {
    ExprPtr left = (this->*next)();
    while (IsName(word)) {
      auto e = MakeExpr(kind, Next().offset);
      e->args.push_back(std::move(left));
      e->args.push_back((this->*next)());
      left = std::move(e);
    }
    return left;
  }
  ExprPtr ParseOr() { return ParseLogical("or", Expr::Kind::kOr, &Parser::ParseAnd); }
  ExprPtr ParseAnd() { return ParseLogical("and", Expr::Kind::kAnd, &Parser::ParseNot); }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      auto e = MakeExpr(Expr::Kind::kNot, Next().offset);
      e->args.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const size_t offset = Peek().offset;
    ExprPtr first = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.type == TokenType::kOperator &&
          (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == ">" ||
           t.value == "<=" || t.value == ">=")) {
        op = Next().value;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = MakeExpr(Expr::Kind::kCompare, offset);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr Binary(std::string op, size_t offset, ExprPtr left, ExprPtr right) {
    auto e = MakeExpr(Expr::Kind::kBinary, offset);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  // `left (op right)*` for the arithmetic operators `ops`, left-associative.
  ExprPtr ParseArithmetic(std::initializer_list<const char*> ops, ExprPtr (Parser::*next)()) {
    ExprPtr left = (this->*next)();
    auto at_op = [&] {
      for (const char* op : ops) {
        if (IsOp(op)) return true;
      }
      return false;
    };
    while (at_op()) {
      const Token& t = Next();
      left = Binary(t.value, t.offset, std::move(left), (this->*next)());
    }
    return left;
  }
  ExprPtr ParseMath1() { return ParseArithmetic({"+", "-"}, &Parser::ParseConcat); }
  ExprPtr ParseConcat() { return ParseArithmetic({"~"}, &Parser::ParseMath2); }
  ExprPtr ParseMath2() { return ParseArithmetic({"*", "/", "//", "%"}, &Parser::ParsePow); }
  ExprPtr ParsePow() { return ParseArithmetic({"**"}, &Parser::ParseUnaryFiltered); }
  ExprPtr ParseUnaryFiltered() { return ParseUnary(true); }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      node = MakeExpr(t.value == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.offset);
      node->args.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Next();
    switch (t.type) {
      case TokenType::kName: {
        if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
          auto e = MakeExpr(Expr::Kind::kLiteral, t.offset);
          e->value = Value(t.value == "true" || t.value == "True");
          return e;
        }
        if (t.value == "none" || t.value == "None") {
          auto e = MakeExpr(Expr::Kind::kLiteral, t.offset);
          e->value = Value::None();
          return e;
        }
        auto e = MakeExpr(Expr::Kind::kName, t.offset);
        e->name = t.value;
        return e;
      }
      case TokenType::kString: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t.offset);
        std::string s = t.value;
        while (Peek().type == TokenType::kString) s += Next().value;
        e->value = Value(std::move(s));
        return e;
      }
      case TokenType::kInteger: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t.offset);
        int64_t v = 0;
        auto res = std::from_chars(t.value.data(), t.value.data() + t.value.size(), v);
        if (res.ec != std::errc()) SyntaxError("integer literal out of range", t.offset);
        e->value = Value(v);
        return e;
      }
      case TokenType::kFloat: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t.offset);
        e->value = Value(std::strtod(t.value.c_str(), nullptr));
        return e;
      }
      case TokenType::kOperator:
        if (t.value == "(") return ParseParenthesized(t.offset);
        if (t.value == "[") return ParseListLiteral(t.offset);
        if (t.value == "{") return ParseDictLiteral(t.offset);
        break;
      default:
        break;
    }
    SyntaxError("unexpected " + Describe(t), t.offset);
  }

  ExprPtr ParseParenthesized(size_t offset) {
    if (SkipOp(")")) return MakeExpr(Expr::Kind::kTuple, offset);
    ExprPtr first = ParseExpression(true);
    if (SkipOp(")")) return first;
    auto tuple = MakeExpr(Expr::Kind::kTuple, offset);
    tuple->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (IsOp(")")) break;
      tuple->args.push_back(ParseExpression(true));
    }
    ExpectOp(")");
    return tuple;
  }

  ExprPtr ParseListLiteral(size_t offset) {
    auto list = MakeExpr(Expr::Kind::kList, offset);
    while (!IsOp("]")) {
      if (!list->args.empty()) ExpectOp(",");
      if (IsOp("]")) break;
      list->args.push_back(ParseExpression(true));
    }
    ExpectOp("]");
    return list;
  }

  ExprPtr ParseDictLiteral(size_t offset) {
    auto dict = MakeExpr(Expr::Kind::kDict, offset);
    while (!IsOp("}")) {
      if (!dict->args.empty()) ExpectOp(",");
      if (IsOp("}")) break;
      dict->args.push_back(ParseExpression(true));
      ExpectOp(":");
      dict->args.push_back(ParseExpression(true));
    }
    ExpectOp("}");
    return dict;
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        const size_t offset = Next().offset;
        const Token& t = Next();
        if (t.type == TokenType::kName) {
          auto e = MakeExpr(Expr::Kind::kGetAttr, offset);
          e->name = t.value;
          e->args.push_back(std::move(node));
          node = std::move(e);
        } else if (t.type == TokenType::kInteger) {
          auto e = MakeExpr(Expr::Kind::kGetItem, offset);
          auto index = MakeExpr(Expr::Kind::kLiteral, t.offset);
          index->value = Value(static_cast<int64_t>(std::strtoll(t.value.c_str(), nullptr, 10)));
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(index));
          node = std::move(e);
        } else {
          SyntaxError("expected attribute name after '.', got " + Describe(t), t.offset);
        }
      } else if (IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        auto call = MakeExpr(Expr::Kind::kCall, node->offset);
        call->args.push_back(std::move(node));
        ParseCallArgs(call.get());
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    const size_t offset = Next().offset;  // [
    ExprPtr start, stop, step;
    bool is_slice = false;
    if (!IsOp(":")) start = ParseExpression(true);
    if (SkipOp(":")) {
      is_slice = true;
      if (!IsOp("]") && !IsOp(":")) stop = ParseExpression(true);
      if (SkipOp(":") && !IsOp("]")) step = ParseExpression(true);
    }
    if (!start && !is_slice) SyntaxError("expected subscript expression", Peek().offset);
    ExpectOp("]");
    auto e = MakeExpr(is_slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, offset);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(start));
    if (is_slice) {
      e->args.push_back(std::move(stop));
      e->args.push_back(std::move(step));
    }
    return e;
  }

  // Appends positional arguments to e->args and keywords to e->kwargs.
  void ParseCallArgs(Expr* e) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) {
        Unsupported("argument unpacking (*args, **kwargs) is not supported", Peek().offset);
      }
      if (Peek().type == TokenType::kName && IsOp("=", 1)) {
        std::string key = Next().value;
        Next();
        e->kwargs.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!e->kwargs.empty()) {
          SyntaxError("positional argument follows keyword argument", Peek().offset);
        }
        e->args.push_back(ParseExpression(true));
      }
    }
    ExpectOp(")");
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Next();
        const Token& t = Peek();
        std::string name = ExpectName("filter name");
        while (IsOp(".")) {
          Next();
          name += "." + ExpectName("filter name");
        }
        if (!IsKnownFilter(name)) Unsupported("unsupported filter '" + name + "'", t.offset);
        auto f = MakeExpr(Expr::Kind::kFilter, t.offset);
        f->name = std::move(name);
        f->args.push_back(std::move(node));
        if (IsOp("(")) ParseCallArgs(f.get());
        node = std::move(f);
      } else if (IsName("is")) {
        Next();
        auto test = MakeExpr(Expr::Kind::kTest, Peek().offset);
        test->negated = SkipName("not");
        const Token& t = Peek();
        // `none`, `true` and `false` are both literals and test names.
        if (t.type != TokenType::kName)
          SyntaxError("expected test name, got " + Describe(t), t.offset);
        test->name = Next().value;
        if (!IsKnownTest(test->name))
          Unsupported("unsupported test '" + test->name + "'", t.offset);
        test->args.push_back(std::move(node));
        if (IsOp("(")) {
          ParseCallArgs(test.get());
        } else if (StartsTestArgument()) {
          test->args.push_back(ParsePostfix(ParsePrimary()));
        }
        node = std::move(test);
      } else if (IsOp("(")) {
        auto call = MakeExpr(Expr::Kind::kCall, node->offset);
        call->args.push_back(std::move(node));
        ParseCallArgs(call.get());
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  bool StartsTestArgument() const {
    const Token& t = Peek();
    if (t.type == TokenType::kName) {
      return t.value != "else" && t.value != "or" && t.value != "and" && t.value != "is" &&
             t.value != "if" && t.value != "in" && t.value != "not";
    }
    return t.type == TokenType::kString || t.type == TokenType::kInteger ||
           t.type == TokenType::kFloat || IsOp("[") || IsOp("{");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body Parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).ParseTemplate(); }

}  // namespace morserve::jinja
