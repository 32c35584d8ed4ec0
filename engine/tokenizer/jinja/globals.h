// Global functions a chat template can call: raise_exception(msg) (transformers), range,
// namespace, dict, and strftime_now(format) (transformers, for Llama 3.1+ date lines).
// The clock behind strftime_now is injectable so tests can pin the date.
#pragma once

#include <ctime>
#include <functional>

#include "engine/tokenizer/jinja/scope.h"

namespace morserve::jinja {

// Returns the local time for strftime_now; the default reads the system clock.
using Clock = std::function<std::tm()>;

void AddGlobals(const Clock& clock, Scope* scope);

}  // namespace morserve::jinja
