// Python str semantics over UTF-8 bytes, for the Jinja interpreter. Chat templates were
// written against Python's str, so strip() without arguments removes Unicode whitespace,
// len() and slicing count code points, and title()/capitalize() follow Python's rules.
// Invalid UTF-8 is never rejected here: a stray byte counts as one character, and bytes
// pass through unchanged. Case mapping covers ASCII only (documented limitation).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace morserve::jinja {

// Splits s into characters: each is one UTF-8 sequence, or one byte when invalid.
std::vector<std::string_view> SplitChars(std::string_view s);
size_t CharCount(std::string_view s);

// Python str.isspace() for one character as returned by SplitChars.
bool IsPyWhitespace(std::string_view ch);

// str.strip/lstrip/rstrip; chars == nullptr means Unicode whitespace.
std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right);

// str.split(sep, maxsplit); sep == nullptr splits on whitespace runs.
std::vector<std::string> PySplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> PyRSplit(std::string_view s, const std::string* sep, int64_t maxsplit);

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count);
std::string AsciiUpper(std::string_view s);
std::string AsciiLower(std::string_view s);
std::string PyCapitalize(std::string_view s);
std::string PyTitle(std::string_view s);     // str.title()
std::string JinjaTitle(std::string_view s);  // the `title` filter (word starts after -\s({[<)

// Python repr() of a str: single quotes unless the text holds ' and no ".
std::string PyStrRepr(std::string_view s);

// float.__repr__: shortest round-trip digits, exponent outside [1e-4, 1e16).
std::string PyFloatRepr(double d);

// Appends the code point as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace morserve::jinja
