// Walks the syntax tree and renders text. Statements append to one output string; loop
// control (break/continue, from jinja2.ext.loopcontrols which transformers enables)
// travels as a return value. Output size, macro recursion and the number of steps are
// bounded, so a hostile template fails with an error instead of exhausting memory, the stack
// or the request's time.
#pragma once

#include <cstdint>
#include <string>

#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/scope.h"

namespace morserve::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{256} << 20;
  int max_call_depth = 64;
  // Statements executed plus loop iterations, per render: nested loops over large ranges or
  // a macro that calls itself twice per level would otherwise run for hours on one request.
  // A chat template over a thousand messages takes under 100,000.
  int64_t max_steps = 2'000'000;
};

// Throws JinjaError; offsets point at the node that failed.
std::string Interpret(const Body& body, ScopePtr globals, const RenderLimits& limits);

}  // namespace morserve::jinja
