// Recursive-descent parser from tokens to the syntax tree, with jinja2's grammar and operator
// precedence (condexpr < or < and < not < comparisons < + - < ~ < * / // % < ** < unary,
// with filters and tests binding to the unary operand). Filter and test names are checked
// here, so a template using one this interpreter lacks fails at load, not at render.
// Nesting is bounded so hostile input cannot overflow the stack.
#pragma once

#include <vector>

#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/lexer.h"

namespace morserve::jinja {

// Throws JinjaError(kSyntax or kUnsupported).
Body Parse(std::vector<Token> tokens);

}  // namespace morserve::jinja
