// Python's operators on Jinja values: arithmetic (+ - * / // % **), `~` concatenation,
// ordering comparisons and `in`. Mixed types fail the way Python's TypeError would
// ("can only concatenate str (not "int") to str"), never by guessing a conversion.
#pragma once

#include <string_view>

#include "engine/tokenizer/jinja/value.h"

namespace morserve::jinja {

Value BinaryOp(std::string_view op, const Value& a, const Value& b);
// <0, 0, >0 like Python's <, ==, > on numbers, strings and lists; fails otherwise.
int Compare(const Value& a, const Value& b);
// `needle in haystack`.
bool Contains(const Value& haystack, const Value& needle);

}  // namespace morserve::jinja
