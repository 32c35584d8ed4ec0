#include "engine/tokenizer/jinja/text.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace morserve::jinja {
namespace {

// Length of the UTF-8 sequence starting at s[i], or 1 when it is not a valid one.
size_t SeqLen(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n <= 1 || i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

uint32_t Decode(std::string_view ch) {
  const auto b0 = static_cast<unsigned char>(ch[0]);
  if (ch.size() == 1) return b0;
  uint32_t cp = b0 & (ch.size() == 2 ? 0x1F : ch.size() == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < ch.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
  return cp;
}

bool IsAsciiAlpha(std::string_view ch) {
  return ch.size() == 1 && ((ch[0] >= 'a' && ch[0] <= 'z') || (ch[0] >= 'A' && ch[0] <= 'Z'));
}

bool InSet(std::string_view ch, const std::string* chars) {
  if (chars == nullptr) return IsPyWhitespace(ch);
  for (std::string_view c : SplitChars(*chars)) {
    if (c == ch) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string_view> SplitChars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = SeqLen(s, i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t CharCount(std::string_view s) {
  size_t count = 0;
  for (size_t i = 0; i < s.size(); i += SeqLen(s, i)) ++count;
  return count;
}

bool IsPyWhitespace(std::string_view ch) {
  const uint32_t cp = Decode(ch);
  if (ch.size() == 1) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<std::string_view> cs = SplitChars(s);
  size_t b = 0, e = cs.size();
  if (left) {
    while (b < e && InSet(cs[b], chars)) ++b;
  }
  if (right) {
    while (e > b && InSet(cs[e - 1], chars)) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out.append(cs[i]);
  return out;
}

std::vector<std::string> PySplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  std::vector<std::string_view> cs = SplitChars(s);
  size_t i = 0;
  while (true) {
    while (i < cs.size() && IsPyWhitespace(cs[i])) ++i;
    if (i == cs.size()) break;
    std::string word;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      while (i < cs.size()) word.append(cs[i++]);
      // Python keeps the remainder as is, minus trailing whitespace.
      out.push_back(PyStrip(word, nullptr, false, true));
      break;
    }
    while (i < cs.size() && !IsPyWhitespace(cs[i])) word.append(cs[i++]);
    out.push_back(std::move(word));
  }
  return out;
}

std::vector<std::string> PyRSplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0 || sep == nullptr) return PySplit(s, sep, maxsplit);
  std::vector<std::string> rev;
  size_t end = s.size();
  while (static_cast<int64_t>(rev.size()) < maxsplit) {
    if (end < sep->size()) break;
    const size_t at = s.rfind(*sep, end - sep->size());
    if (at == std::string_view::npos) break;
    rev.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
    end = at;
  }
  rev.emplace_back(s.substr(0, end));
  return {rev.rbegin(), rev.rend()};
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count) {
  std::string out;
  if (old.empty()) {
    std::vector<std::string_view> cs = SplitChars(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cs.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(repl);
        ++done;
      }
      if (i < cs.size()) out.append(cs[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(repl);
    start = at + old.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  if (s.empty()) return "";
  const size_t n = SplitChars(s.substr(0, 4)).front().size();
  return AsciiUpper(s.substr(0, n)) + AsciiLower(s.substr(n));
}

std::string PyTitle(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (std::string_view ch : SplitChars(s)) {
    const bool alpha = IsAsciiAlpha(ch);
    out += alpha ? (prev_cased ? AsciiLower(ch) : AsciiUpper(ch)) : std::string(ch);
    prev_cased = alpha;
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (std::string_view ch : SplitChars(s)) {
    const bool sep =
        IsPyWhitespace(ch) || ch == "-" || ch == "(" || ch == "{" || ch == "[" || ch == "<";
    if (sep) {
      out.append(ch);
      word_start = true;
    } else {
      out += word_start ? AsciiUpper(ch) : AsciiLower(ch);
      word_start = false;
    }
  }
  return out;
}

std::string PyStrRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out = digits + std::string(decpt - n, '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    out += eb;
  }
  return sign + out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace morserve::jinja
