#include "engine/tokenizer/jinja/lexer.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace morserve::jinja {
namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
bool IsTagSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

[[noreturn]] void SyntaxError(std::string message, size_t offset) {
  throw JinjaError(ErrorKind::kSyntax, std::move(message), offset);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  std::vector<Token> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t at = FindTagOpen(pos_);
      if (at == std::string::npos) {
        Emit(TokenType::kText, src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[at + 1];
      size_t p = at + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      EmitLeadingText(src_.substr(pos_, at - pos_), pos_, sign, kind != '{', line_starting);
      if (sign != 0) ++p;
      pos_ = p;
      if (kind == '#') {
        LexComment(at);
      } else if (kind == '%' && IsRawTag(p)) {
        LexRaw(at);
      } else {
        LexTag(at, kind);
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::kEnd, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  size_t FindTagOpen(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // Text before a tag, after `-` stripping or lstrip_blocks.
  void EmitLeadingText(std::string text, size_t offset, char sign, bool is_block_or_comment,
                       bool line_starting) {
    if (sign == '-') {
      text = PyStrip(text, nullptr, false, true);
    } else if (sign != '+' && is_block_or_comment) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        if (text.find_first_not_of(" \t", l_pos) == std::string::npos) text.resize(l_pos);
      }
    }
    if (!text.empty()) Emit(TokenType::kText, std::move(text), offset);
  }

  // After a block or comment end: `-` strips all following whitespace, otherwise
  // trim_blocks drops one newline.
  void AfterBlockEnd(bool minus) {
    if (minus) {
      SkipPyWhitespace();
    } else if (pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  void SkipPyWhitespace() {
    while (pos_ < src_.size()) {
      const size_t n = SplitChars(std::string_view(src_).substr(pos_, 4)).front().size();
      if (!IsPyWhitespace(std::string_view(src_).substr(pos_, n))) break;
      pos_ += n;
    }
  }

  void LexComment(size_t open) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) SyntaxError("unterminated comment", open);
    const bool minus = end > pos_ && src_[end - 1] == '-';
    pos_ = end + 2;
    AfterBlockEnd(minus);
  }

  bool IsRawTag(size_t p) const {
    while (p < src_.size() && IsTagSpace(src_[p])) ++p;
    return src_.compare(p, 3, "raw") == 0 && (p + 3 >= src_.size() || !IsNameChar(src_[p + 3]));
  }

  // {% raw %}...{% endraw %}: the body is text, untouched.
  void LexRaw(size_t open) {
    size_t p = src_.find("raw", pos_) + 3;
    while (p < src_.size() && IsTagSpace(src_[p])) ++p;
    const bool minus = src_.compare(p, 3, "-%}") == 0;
    if (!minus && src_.compare(p, 2, "%}") != 0) SyntaxError("expected '%}' after raw", p);
    pos_ = p + (minus ? 3 : 2);
    AfterBlockEnd(minus);
    for (size_t at = FindTagOpen(pos_); at != std::string::npos; at = FindTagOpen(at + 1)) {
      if (src_[at + 1] != '%') continue;
      size_t q = at + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign != 0) ++q;
      while (q < src_.size() && IsTagSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && IsTagSpace(src_[q])) ++q;
      const bool end_minus = src_.compare(q, 3, "-%}") == 0;
      if (!end_minus && src_.compare(q, 2, "%}") != 0) continue;
      EmitLeadingText(src_.substr(pos_, at - pos_), pos_, sign, true, false);
      pos_ = q + (end_minus ? 3 : 2);
      AfterBlockEnd(end_minus);
      return;
    }
    SyntaxError("missing {% endraw %}", open);
  }

  void LexTag(size_t open, char kind) {
    const bool is_var = kind == '{';
    Emit(is_var ? TokenType::kVarBegin : TokenType::kBlockBegin, is_var ? "{{" : "{%", open);
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && IsTagSpace(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        SyntaxError(
            absl::StrCat("unexpected end of template, expected '", is_var ? "}}" : "%}", "'"),
            open);
      }
      if (depth == 0) {
        const char* close = is_var ? "}}" : "%}";
        if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
          Emit(is_var ? TokenType::kVarEnd : TokenType::kBlockEnd, close, pos_);
          pos_ += 3;
          SkipPyWhitespace();
          return;
        }
        if (src_.compare(pos_, 2, close) == 0) {
          Emit(is_var ? TokenType::kVarEnd : TokenType::kBlockEnd, close, pos_);
          pos_ += 2;
          if (!is_var) AfterBlockEnd(false);
          return;
        }
      }
      LexExpressionToken(&depth);
    }
  }

  void LexExpressionToken(int* depth) {
    const size_t start = pos_;
    const char c = src_[pos_];
    if (IsNameStart(c)) {
      while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
      Emit(TokenType::kName, src_.substr(start, pos_ - start), start);
      return;
    }
    if (IsDigit(c)) {
      LexNumber();
      return;
    }
    if (c == '\'' || c == '"') {
      LexString();
      return;
    }
    static constexpr const char* kTwo[] = {"**", "//", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        Emit(TokenType::kOperator, op, start);
        pos_ += 2;
        return;
      }
    }
    static constexpr std::string_view kOne = "+-*/%~<>=.,:|()[]{}";
    if (kOne.find(c) == std::string_view::npos) {
      SyntaxError(absl::StrCat("unexpected character '", std::string(1, c), "'"), start);
    }
    if (c == '(' || c == '[' || c == '{') ++*depth;
    if (c == ')' || c == ']' || c == '}') {
      if (*depth == 0) SyntaxError(absl::StrCat("unexpected '", std::string(1, c), "'"), start);
      --*depth;
    }
    Emit(TokenType::kOperator, std::string(1, c), start);
    ++pos_;
  }

  size_t Digits(size_t p) const {
    while (p < src_.size() &&
           (IsDigit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && IsDigit(src_[p + 1])))) {
      ++p;
    }
    return p;
  }

  void LexNumber() {
    const size_t start = pos_;
    size_t p = Digits(pos_);
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().type == TokenType::kOperator &&
                           tokens_.back().value == ".";
    if (!after_dot) {
      if (p + 1 < src_.size() && src_[p] == '.' && IsDigit(src_[p + 1])) {
        p = Digits(p + 1);
        is_float = true;
      }
      if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && IsDigit(src_[q])) {
          p = Digits(q);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = start; i < p; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    pos_ = p;
    Emit(is_float ? TokenType::kFloat : TokenType::kInteger, std::move(text), start);
  }

  // Python string literal escapes, as jinja2 decodes them with "unicode-escape";
  // an unknown escape keeps its backslash.
  void LexString() {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) SyntaxError("unterminated string literal", start);
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) SyntaxError("unterminated string literal", start);
      const char e = src_[pos_++];
      switch (e) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          AppendUtf8(HexEscape(2, start), &out);
          break;
        case 'u':
          AppendUtf8(HexEscape(4, start), &out);
          break;
        case 'U':
          AppendUtf8(HexEscape(8, start), &out);
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++k) {
              v = v * 8 + (src_[pos_++] - '0');
            }
            AppendUtf8(v, &out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    Emit(TokenType::kString, std::move(out), start);
  }

  uint32_t HexEscape(int digits, size_t string_start) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const int h = pos_ < src_.size() ? HexValue(src_[pos_]) : -1;
      if (h < 0) SyntaxError("truncated \\x, \\u or \\U escape in string literal", string_start);
      v = v * 16 + h;
      ++pos_;
    }
    if (v > 0x10FFFF) SyntaxError("escape outside the Unicode range", string_start);
    return v;
  }

  void Emit(TokenType type, std::string value, size_t offset) {
    tokens_.push_back(Token{type, std::move(value), offset});
  }

  const std::string& src_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::string NormalizeSource(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<Token> Tokenize(const std::string& normalized_source) {
  return Lexer(normalized_source).Run();
}

}  // namespace morserve::jinja
