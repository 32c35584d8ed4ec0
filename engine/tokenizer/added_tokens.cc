#include "engine/tokenizer/added_tokens.h"

#include <unicode/uchar.h>

#include "engine/tokenizer/utf8.h"

namespace morserve {

void AddedTokenSplitter::Add(AddedToken token) {
  if (token.content.empty()) return;
  int index;
  auto found = by_content_.find(token.content);
  if (found != by_content_.end()) {
    index = found->second;  // a later entry with the same content wins, as in a JS Map
    tokens_[index] = token;
  } else {
    index = static_cast<int>(tokens_.size());
    tokens_.push_back(token);
    by_content_.emplace(token.content, index);
  }
  int node = 0;
  for (unsigned char b : token.content) {
    auto it = children_[node].find(b);
    if (it == children_[node].end()) {
      int child = static_cast<int>(children_.size());
      children_.emplace_back();
      terminal_.push_back(-1);
      children_[node].emplace(b, child);
      node = child;
    } else {
      node = it->second;
    }
  }
  terminal_[node] = index;
  can_start_[static_cast<unsigned char>(token.content[0])] = true;
}

namespace {

// Rust regex's Unicode \w (what Hugging Face tokenizers tests for single_word tokens).
bool IsWordChar(char32_t c) {
  if (c == '_' || u_hasBinaryProperty(c, UCHAR_ALPHABETIC) ||
      u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

bool WordBefore(std::string_view text, size_t pos) {
  if (pos == 0) return false;
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return IsWordChar(NextCodePoint(text, &start));
}

bool WordAfter(std::string_view text, size_t pos) {
  if (pos >= text.size()) return false;
  return IsWordChar(NextCodePoint(text, &pos));
}

}  // namespace

const AddedToken* AddedTokenSplitter::Find(std::string_view s) const {
  auto it = by_content_.find(AView(s));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

std::vector<AddedTokenSplitter::Section> AddedTokenSplitter::Split(std::string_view text) const {
  std::vector<Section> sections;
  size_t start = 0, i = 0, n = text.size();
  while (i < n) {
    if (!can_start_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int node = 0, match = -1;
    size_t match_end = i;
    for (size_t j = i; j < n; ++j) {
      auto it = children_[node].find(static_cast<unsigned char>(text[j]));
      if (it == children_[node].end()) break;
      node = it->second;
      int t = terminal_[node];
      if (t >= 0 &&
          (!tokens_[t].single_word || (!WordBefore(text, i) && !WordAfter(text, j + 1)))) {
        match = t;
        match_end = j + 1;
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    if (i > start) sections.push_back({text.substr(start, i - start), -1});
    sections.push_back({text.substr(i, match_end - i), match});
    i = start = match_end;
  }
  if (start < n) sections.push_back({text.substr(start), -1});
  for (size_t k = 0; k < sections.size(); ++k) {
    if (sections[k].token < 0) continue;
    const AddedToken& t = tokens_[sections[k].token];
    if (t.lstrip && k > 0) sections[k - 1].text = TrimJsWhitespaceEnd(sections[k - 1].text);
    if (t.rstrip && k + 1 < sections.size()) {
      sections[k + 1].text = TrimJsWhitespaceStart(sections[k + 1].text);
    }
  }
  return sections;
}

}  // namespace morserve
