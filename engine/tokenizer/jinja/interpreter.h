// Walks the syntax tree and renders text. Statements append to one output string; loop
// control (break/continue, from jinja2.ext.loopcontrols which transformers enables)
// travels as a return value. Output size and macro recursion are bounded, so a hostile
// template fails with an error instead of exhausting memory or the stack.
#pragma once

#include <string>

#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/scope.h"

namespace morserve::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{256} << 20;
  int max_call_depth = 64;
};

// Throws JinjaError; offsets point at the node that failed.
std::string Interpret(const Body& body, ScopePtr globals, const RenderLimits& limits);

}  // namespace morserve::jinja
