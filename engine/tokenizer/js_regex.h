// A regular expression with JavaScript `/pattern/gu` semantics, run by PCRE2 (JIT) in UTF mode.
// tokenizer.json patterns come from Python/Rust; the reference tokenizer (transformers.js)
// rewrites a few constructs for JavaScript, and JavaScript's classes differ from PCRE2's, so
// the pattern is translated before compiling:
//  - `(?i:'s|'t|'re|'ve|'m|'ll|'d)` becomes the explicit-case form transformers.js uses;
//  - `\s`, `\S` and `.` get JavaScript's sets (\s includes U+FEFF but not U+0085/U+180E);
//  - UCP is deliberately off: with the `u` flag JavaScript's \d, \w and \b stay ASCII, while
//    \p{L}, \p{N} and friends are Unicode in both engines.
// Text passed to the matcher must be valid UTF-8 (the tokenizer sanitizes input first).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace morserve {

class JsRegex {
 public:
  static absl::StatusOr<std::unique_ptr<JsRegex>> Compile(std::string_view js_pattern);
  // Escapes a literal string into a pattern.
  static std::string Escape(std::string_view literal);
  ~JsRegex();
  JsRegex(const JsRegex&) = delete;
  JsRegex& operator=(const JsRegex&) = delete;

  // Calls fn(start, end) for each match of String.prototype.matchAll, left to right; an empty
  // match advances the search by one code point as JavaScript does.
  void ForEachMatch(std::string_view text, absl::FunctionRef<void(size_t, size_t)> fn) const;
  // String.prototype.replaceAll with a literal replacement (no `$` substitutions).
  std::string ReplaceAll(std::string_view text, std::string_view replacement) const;

 private:
  JsRegex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
};

// Translates JavaScript regex syntax to PCRE2 syntax (see the file comment); exposed for tests.
absl::StatusOr<std::string> TranslateJsRegex(std::string_view js_pattern);

}  // namespace morserve
