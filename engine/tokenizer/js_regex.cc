#include "engine/tokenizer/js_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

// JavaScript's \s: WhiteSpace and LineTerminator code points, as class-body text.
constexpr const char* kJsSpaceClassBody =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";

}  // namespace

absl::StatusOr<std::string> TranslateJsRegex(std::string_view js_pattern) {
  // transformers.js' PROBLEMATIC_REGEX_MAP entry for the contraction group.
  std::string pattern = absl::StrReplaceAll(
      AView(js_pattern),
      {{"(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"}});
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[++i];
      if (e == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", kJsSpaceClassBody, in_class ? "" : "]");
      } else if (e == 'S') {
        if (in_class) {
          return absl::InvalidArgumentError(absl::StrCat(
              "regex '", AView(js_pattern), "': \\S inside a character class is not supported"));
        }
        absl::StrAppend(&out, "[^", kJsSpaceClassBody, "]");
      } else if (e == '#' || e == '&' || e == '~') {
        out.push_back(e);  // transformers.js drops these needless escapes
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out.push_back(c);
      continue;
    }
    if (c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal in PCRE2 but ends an empty class in JS.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        return absl::InvalidArgumentError(absl::StrCat(
            "regex '", AView(js_pattern), "': empty character class is not supported"));
      }
      continue;
    }
    if (c == '.') {
      out += "[^\\n\\r\\x{2028}\\x{2029}]";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string JsRegex::Escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}/-").find(c) != std::string_view::npos) {
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<JsRegex>> JsRegex::Compile(std::string_view js_pattern) {
  absl::StatusOr<std::string> translated = TranslateJsRegex(js_pattern);
  if (!translated.ok()) return translated.status();
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated->data()), translated->size(),
                    PCRE2_UTF | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "regex '", AView(js_pattern),
        "' does not compile: ", reinterpret_cast<const char*>(message), " at offset ", offset));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  auto regex = std::unique_ptr<JsRegex>(new JsRegex());
  regex->code_ = code;
  return regex;
}

JsRegex::~JsRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void JsRegex::ForEachMatch(std::string_view text,
                           absl::FunctionRef<void(size_t, size_t)> fn) const {
  auto* code = static_cast<pcre2_code*>(code_);
  // One match block per thread and pattern size class is enough; the ovector holds the
  // groups of this pattern, so it is created from it.
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t start = ov[0], end = ov[1];
    fn(start, end);
    if (end == start) {
      if (end >= text.size()) break;
      size_t next = end;
      NextCodePoint(text, &next);
      pos = next;
    } else {
      pos = end;
    }
  }
  pcre2_match_data_free(md);
}

std::string JsRegex::ReplaceAll(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t prev = 0;
  ForEachMatch(text, [&](size_t start, size_t end) {
    out.append(text.substr(prev, start - prev));
    out.append(replacement);
    prev = end;
  });
  out.append(text.substr(prev));
  return out;
}

}  // namespace morserve
