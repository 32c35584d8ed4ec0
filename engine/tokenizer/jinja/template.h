// A parsed Jinja template and the entry point of the interpreter: Parse once, Render many
// times (Render is const and thread-safe). All failures come back as absl::Status with the
// line and column in the template:
//   InvalidArgument  malformed template (at Parse), or a render-time error such as a type
//                    error, an undefined value being used, or raise_exception(msg)
//   Unimplemented    Jinja this interpreter does not support (at Parse)
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/globals.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "nlohmann/json.hpp"

namespace morserve::jinja {

struct RenderOptions {
  Clock clock;  // for strftime_now; empty means the system's local time
  // Statements executed plus loop iterations allowed per render (RenderLimits::max_steps).
  int64_t max_steps = RenderLimits().max_steps;
};

class Template {
 public:
  static absl::StatusOr<Template> Parse(std::string_view source);

  // `context` must be a JSON object; its members become template variables, in addition to
  // the globals (raise_exception, range, namespace, dict, strftime_now).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const RenderOptions& options = {}) const;

  // True when the template mentions `name` as a variable anywhere (e.g. "tools").
  bool MentionsName(std::string_view name) const;

 private:
  Template(std::shared_ptr<const std::string> source, std::shared_ptr<const Body> body)
      : source_(std::move(source)), body_(std::move(body)) {}

  std::shared_ptr<const std::string> source_;  // normalised
  std::shared_ptr<const Body> body_;
};

}  // namespace morserve::jinja
