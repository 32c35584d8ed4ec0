#include "engine/tokenizer/utf8.h"

#include <cstdint>

namespace morserve {

char32_t NextCodePoint(std::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *i;
  unsigned char b = p[0];
  if (b < 0x80) {
    *i += 1;
    return b;
  }
  if (b < 0xE0) {
    *i += 2;
    return ((b & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b < 0xF0) {
    *i += 3;
    return ((b & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *i += 4;
  return ((b & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void Utf8StreamDecoder::Emit(char32_t cp, std::string* out) {
  bool first = at_start_;
  at_start_ = false;
  if (first && strip_bom_ && cp == 0xFEFF) return;
  AppendUtf8(cp, out);
}

void Utf8StreamDecoder::Feed(unsigned char b, std::string* out) {
  if (needed_ == 0) {
    if (b < 0x80) {
      Emit(b, out);
    } else if (b >= 0xC2 && b <= 0xDF) {
      needed_ = 1;
      cp_ = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      if (b == 0xE0) lower_ = 0xA0;
      if (b == 0xED) upper_ = 0x9F;
      needed_ = 2;
      cp_ = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      if (b == 0xF0) lower_ = 0x90;
      if (b == 0xF4) upper_ = 0x8F;
      needed_ = 3;
      cp_ = b & 0x07;
    } else {
      Emit(0xFFFD, out);
    }
    return;
  }
  if (b < lower_ || b > upper_) {
    // The bad byte ends the maximal subpart and is decoded afresh.
    needed_ = seen_ = 0;
    cp_ = 0;
    lower_ = 0x80;
    upper_ = 0xBF;
    Emit(0xFFFD, out);
    Feed(b, out);
    return;
  }
  lower_ = 0x80;
  upper_ = 0xBF;
  cp_ = (cp_ << 6) | (b & 0x3F);
  if (++seen_ == needed_) {
    char32_t cp = cp_;
    needed_ = seen_ = 0;
    cp_ = 0;
    Emit(cp, out);
  }
}

void Utf8StreamDecoder::Finish(std::string* out) {
  if (needed_ != 0) {
    needed_ = seen_ = 0;
    cp_ = 0;
    lower_ = 0x80;
    upper_ = 0xBF;
    Emit(0xFFFD, out);
  }
  at_start_ = true;
}

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // Fast path over ASCII, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > n) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  Utf8StreamDecoder decoder;
  decoder.Feed(bytes, &out);
  decoder.Finish(&out);
  return out;
}

bool IsJsWhitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string_view TrimJsWhitespaceStart(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!IsJsWhitespace(NextCodePoint(s, &j))) break;
    i = j;
  }
  return s.substr(i);
}

std::string_view TrimJsWhitespaceEnd(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t j = start;
    if (!IsJsWhitespace(NextCodePoint(s, &j))) break;
    end = start;
  }
  return s.substr(0, end);
}

size_t Utf16Length(std::string_view s) {
  size_t n = 0;
  for (unsigned char b : s) {
    if ((b & 0xC0) != 0x80) n += b >= 0xF0 ? 2 : 1;
  }
  return n;
}

}  // namespace morserve
