// UTF-8 helpers shared by the tokenizer: code point iteration, the WHATWG decoding of
// ill-formed input (each maximal subpart of a bad sequence becomes one U+FFFD, exactly what
// JavaScript's TextDecoder and therefore the reference tokenizer see), a streaming decoder
// with the same output, and JavaScript's definition of whitespace (String.trim, regex \s).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace morserve {

// Debian's Abseil has its own string_view type; heterogeneous hash lookups need it.
inline absl::string_view AView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Decodes the code point at s[*i] of valid UTF-8 and advances *i past it.
char32_t NextCodePoint(std::string_view s, size_t* i);
void AppendUtf8(char32_t cp, std::string* out);
// Byte length of the UTF-8 sequence that starts with lead byte b (1 for invalid leads).
inline size_t Utf8SequenceLength(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}
bool IsValidUtf8(std::string_view s);
// Replaces ill-formed sequences with U+FFFD as the WHATWG UTF-8 decoder does.
std::string SanitizeUtf8(std::string_view bytes);
// JavaScript WhiteSpace + LineTerminator (what \s and String.prototype.trim use).
bool IsJsWhitespace(char32_t cp);
std::string_view TrimJsWhitespaceStart(std::string_view s);
std::string_view TrimJsWhitespaceEnd(std::string_view s);
// Number of UTF-16 code units of valid UTF-8 text (JavaScript's string length).
size_t Utf16Length(std::string_view s);

// Streaming WHATWG UTF-8 decoder: Feed() returns the text that is certain so far, holding back
// an incomplete trailing sequence; Finish() ends the stream (a held incomplete sequence becomes
// U+FFFD). Feeding a byte string in any split yields the same text as SanitizeUtf8 of the whole.
// With strip_bom, a U+FEFF at the start of each stream is dropped (TextDecoder's default).
class Utf8StreamDecoder {
 public:
  explicit Utf8StreamDecoder(bool strip_bom = false) : strip_bom_(strip_bom) {}
  void Feed(unsigned char byte, std::string* out);
  void Feed(std::string_view bytes, std::string* out) {
    for (unsigned char b : bytes) Feed(b, out);
  }
  void Finish(std::string* out);
  bool empty() const { return needed_ == 0; }

 private:
  void Emit(char32_t cp, std::string* out);
  bool strip_bom_;
  bool at_start_ = true;
  int needed_ = 0;
  int seen_ = 0;
  char32_t cp_ = 0;
  unsigned char lower_ = 0x80;
  unsigned char upper_ = 0xBF;
};

}  // namespace morserve
