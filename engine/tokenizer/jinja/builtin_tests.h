// Jinja's tests (`x is defined`, `x is not none`, `n is divisibleby 3`), with the
// Python-level meaning of each: `iterable` holds for str, list, dict and Undefined;
// `number` holds for bool; `mapping` for dict but not namespace.
#pragma once

#include <string_view>

#include "engine/tokenizer/jinja/value.h"

namespace morserve::jinja {

bool IsKnownTest(std::string_view name);
// args.positional excludes the operand. Throws JinjaError on bad arguments.
bool ApplyTest(std::string_view name, const Value& operand, const CallArgs& args);

}  // namespace morserve::jinja
