#include "engine/tokenizer/jinja/template.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/lexer.h"
#include "engine/tokenizer/jinja/parser.h"

namespace morserve::jinja {
namespace {

std::string Location(const std::string& source, size_t offset) {
  if (offset == JinjaError::kNoOffset) return "";
  offset = std::min(offset, source.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return absl::StrCat(" at line ", line, ", column ", col);
}

absl::Status ToStatus(const JinjaError& e, const std::string& source) {
  const std::string where = Location(source, e.offset);
  switch (e.kind) {
    case ErrorKind::kSyntax:
      return absl::InvalidArgumentError(
          absl::StrCat("template syntax error", where, ": ", e.message));
    case ErrorKind::kUnsupported:
      return absl::UnimplementedError(
          absl::StrCat("template uses unsupported Jinja", where, ": ", e.message));
    case ErrorKind::kRaised:
      return absl::InvalidArgumentError(
          absl::StrCat("template raised an exception", where, ": ", e.message));
    case ErrorKind::kRuntime:
      return absl::InvalidArgumentError(
          absl::StrCat("template render error", where, ": ", e.message));
  }
  return absl::InternalError(e.message);
}

bool ExprMentions(const Expr& e, std::string_view name) {
  if (e.kind == Expr::Kind::kName && e.name == name) return true;
  for (const ExprPtr& a : e.args) {
    if (a && ExprMentions(*a, name)) return true;
  }
  for (const auto& [k, v] : e.kwargs) {
    if (v && ExprMentions(*v, name)) return true;
  }
  return false;
}

bool BodyMentions(const Body& body, std::string_view name) {
  for (const StmtPtr& s : body) {
    if ((s->expr && ExprMentions(*s->expr, name)) ||
        (s->filter && ExprMentions(*s->filter, name)) || BodyMentions(s->body, name) ||
        BodyMentions(s->else_body, name)) {
      return true;
    }
    for (const auto& [p, def] : s->params) {
      if (def && ExprMentions(*def, name)) return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  auto normalized = std::make_shared<const std::string>(NormalizeSource(source));
  try {
    auto body = std::make_shared<const Body>(jinja::Parse(Tokenize(*normalized)));
    return Template(std::move(normalized), std::move(body));
  } catch (const JinjaError& e) {
    return ToStatus(e, *normalized);
  }
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context,
                                             const RenderOptions& options) const {
  if (!context.is_object())
    return absl::InvalidArgumentError("template context must be a JSON object");
  try {
    auto globals = std::make_shared<Scope>();
    AddGlobals(options.clock, globals.get());
    auto scope = std::make_shared<Scope>(globals);
    for (const auto& [k, v] : context.items()) scope->Set(k, FromJson(v));
    RenderLimits limits;
    limits.max_steps = options.max_steps;
    return Interpret(*body_, std::move(scope), limits);
  } catch (const JinjaError& e) {
    return ToStatus(e, *source_);
  }
}

bool Template::MentionsName(std::string_view name) const { return BodyMentions(*body_, name); }

}  // namespace morserve::jinja
