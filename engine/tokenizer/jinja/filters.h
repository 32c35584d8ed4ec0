// Jinja's built-in filters that chat templates use, with jinja2's semantics on Python
// values, plus `tojson` as transformers redefines it (json.dumps with ensure_ascii=False;
// indent, separators, sort_keys and ensure_ascii arguments). Names are checked at parse
// time through IsKnownFilter, so an unsupported filter fails at load.
#pragma once

#include <string_view>

#include "engine/tokenizer/jinja/value.h"

namespace morserve::jinja {

bool IsKnownFilter(std::string_view name);
// args excludes the operand. Throws JinjaError on bad operands or arguments.
Value ApplyFilter(std::string_view name, const Value& operand, const CallArgs& args);

}  // namespace morserve::jinja
