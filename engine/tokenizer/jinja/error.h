// The one error type of the Jinja interpreter. Lexer, parser and interpreter throw it; it
// never leaves engine/tokenizer/jinja: Template turns it into an absl::Status with the line
// and column of `offset`. Exceptions are used inside because nearly every node of a
// recursive evaluator can fail, and threading a Status through each would double the code
// without making any failure clearer.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace morserve::jinja {

enum class ErrorKind {
  kSyntax,       // malformed template text
  kUnsupported,  // valid Jinja this interpreter does not implement
  kRuntime,      // type errors, undefined values, bad arguments while rendering
  kRaised,       // the template called raise_exception(msg)
};

struct JinjaError {
  static constexpr size_t kNoOffset = static_cast<size_t>(-1);
  JinjaError(ErrorKind kind, std::string message, size_t offset = kNoOffset)
      : kind(kind), message(std::move(message)), offset(offset) {}
  ErrorKind kind;
  std::string message;
  size_t offset;  // byte offset in the (normalised) template source
};

[[noreturn]] inline void Fail(std::string message) {
  throw JinjaError(ErrorKind::kRuntime, std::move(message));
}

}  // namespace morserve::jinja
