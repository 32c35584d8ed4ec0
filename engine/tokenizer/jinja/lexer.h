// Turns template source into tokens the way jinja2's lexer does under the settings
// transformers uses for chat templates: trim_blocks=True (a newline right after a block or
// comment tag is dropped), lstrip_blocks=True (spaces and tabs before a block or comment
// tag at the start of a line are dropped), `-` and `+` whitespace control on tags, one
// trailing newline of the template removed, \r\n and \r read as \n. Comments vanish here;
// {% raw %} bodies come out as text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace morserve::jinja {

enum class TokenType {
  kText,        // literal template text (value: the text)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifiers and keywords
  kString,      // string literal, escapes already decoded
  kInteger,
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < > <= >= = . , : | ( ) [ ] { }
  kEnd,
};

struct Token {
  TokenType type;
  std::string value;
  size_t offset;  // byte offset in the normalised source
};

// The source as the lexer reads it (newlines normalised, one trailing newline removed).
// Token offsets refer to this string.
std::string NormalizeSource(std::string_view source);

// Throws JinjaError(kSyntax) on malformed input.
std::vector<Token> Tokenize(const std::string& normalized_source);

}  // namespace morserve::jinja
