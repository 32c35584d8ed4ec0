// TextStream: text deltas and stop strings over a small byte-level tokenizer (one token per
// byte, a few merged tokens, one special token). Exact deltas for hand-made cases (a stop
// string across tokens, one inside a multi-byte character, held-back text released), and a
// property over random streams: the output is the text before the first stop string found,
// token by token, and the stream stops at the token that completed it.
#include "server/text_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

using nlohmann::json;

std::string Cp(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::unique_ptr<Tokenizer> ByteTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Cp(ByteToUnicode(static_cast<unsigned char>(b)))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  json tj = {
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", "ab c"})}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array({{{"id", 258}, {"content", "<|end|>"}, {"special", true}}})},
  };
  auto tok = Tokenizer::FromJson(tj, {{"clean_up_tokenization_spaces", false}});
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int> Bytes(const std::string& s) {
  std::vector<int> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

struct Streamed {
  std::vector<std::string> deltas;
  std::string text;
  int stopped_at = -1;  // index of the token that completed a stop string
  std::string stop;
};

Streamed StreamText(const Tokenizer& tok, const std::vector<int>& ids,
                    std::vector<std::string> stop, bool skip = true, int min_tokens = 0) {
  auto ts = TextStream::Create(tok, skip, std::move(stop), min_tokens);
  EXPECT_TRUE(ts.ok()) << ts.status();
  Streamed out;
  for (size_t i = 0; i < ids.size(); ++i) {
    out.deltas.push_back(ts->Push(ids[i]));
    out.text += out.deltas.back();
    if (ts->stopped() && out.stopped_at < 0) out.stopped_at = static_cast<int>(i);
  }
  if (!ts->stopped()) {
    out.deltas.push_back(ts->Finish());
    out.text += out.deltas.back();
    if (ts->stopped()) out.stopped_at = static_cast<int>(ids.size());
  }
  out.stop = ts->stop_string();
  return out;
}

TEST(TextStream, NoStopEqualsDecode) {
  auto tok = ByteTokenizer();
  const std::string s = "h\xC3\xA9llo \xE4\xBD\xA0 abc";
  std::vector<int> ids = Bytes(s);
  ids.push_back(258);
  ids.push_back(257);
  for (bool skip : {true, false}) {
    Streamed got = StreamText(*tok, ids, {}, skip);
    EXPECT_EQ(got.text, tok->Decode(ids, skip));
    EXPECT_EQ(got.stopped_at, -1);
    EXPECT_EQ(got.stop, "");
  }
}

TEST(TextStream, StopAcrossTokensIsCutBeforeTheMatch) {
  auto tok = ByteTokenizer();
  Streamed got = StreamText(*tok, Bytes("Hello world, more"), {"o w"});
  EXPECT_EQ(got.text, "Hell");
  EXPECT_EQ(got.stop, "o w");
  EXPECT_EQ(got.stopped_at, 6);  // the 'w'
  // 'o' and ' ' were held back, never sent.
  EXPECT_EQ(got.deltas[4], "");
  EXPECT_EQ(got.deltas[5], "");
  for (size_t i = 6; i < got.deltas.size(); ++i) EXPECT_EQ(got.deltas[i], "");
}

TEST(TextStream, HeldBackTextIsReleasedOnMismatchAndAtTheEnd) {
  auto tok = ByteTokenizer();
  Streamed got = StreamText(*tok, Bytes("abxyq"), {"xyz"});
  EXPECT_EQ(got.deltas, (std::vector<std::string>{"a", "b", "", "", "xyq", ""}));
  EXPECT_EQ(got.stopped_at, -1);
  got = StreamText(*tok, Bytes("abx"), {"xy"});
  EXPECT_EQ(got.deltas, (std::vector<std::string>{"a", "b", "", "x"}));
  // Growing prefixes of "aaaa" are held ("a", "aa", "aaa") until the "b" releases them.
  got = StreamText(*tok, Bytes("aaab"), {"aaaa"});
  EXPECT_EQ(got.text, "aaab");
  EXPECT_EQ(got.deltas[3], "aaab");
}

TEST(TextStream, StopInsideMultiByteCharactersAndMergedTokens) {
  auto tok = ByteTokenizer();
  // "é" is two byte tokens; the stop completes on the second.
  Streamed got = StreamText(*tok, Bytes("caf\xC3\xA9 au lait"), {"\xC3\xA9"});
  EXPECT_EQ(got.text, "caf");
  EXPECT_EQ(got.stopped_at, 4);
  // The stop string ends inside a merged token ("abc" = 257): cut inside that token's text.
  got = StreamText(*tok, {'x', 257, 'y'}, {"xab"});
  EXPECT_EQ(got.text, "");
  EXPECT_EQ(got.stopped_at, 1);
  got = StreamText(*tok, {'x', 257, 'y'}, {"bc"});
  EXPECT_EQ(got.text, "xa");
}

TEST(TextStream, EarliestMatchWinsAndTheFirstListedOnATie) {
  auto tok = ByteTokenizer();
  Streamed got = StreamText(*tok, Bytes("abcd"), {"cd", "bc"});
  EXPECT_EQ(got.text, "a");
  EXPECT_EQ(got.stop, "bc");
  got = StreamText(*tok, {257}, {"bc", "b"});  // one token completes both at position 1
  EXPECT_EQ(got.text, "a");
  EXPECT_EQ(got.stop, "bc");
}

TEST(TextStream, SpecialTokenTextIsMatchedOnlyWhenNotSkipped) {
  auto tok = ByteTokenizer();
  std::vector<int> ids = Bytes("hi");
  ids.push_back(258);
  ids.push_back('!');
  Streamed kept = StreamText(*tok, ids, {"<|end|>"}, /*skip=*/false);
  EXPECT_EQ(kept.text, "hi");
  EXPECT_EQ(kept.stopped_at, 2);
  Streamed skipped = StreamText(*tok, ids, {"<|end|>"}, /*skip=*/true);
  EXPECT_EQ(skipped.text, "hi!");
  EXPECT_EQ(skipped.stopped_at, -1);
}

// Random streams over a small alphabet (so stop strings occur), merged tokens included.
TEST(TextStream, RandomStreamsMatchTheTokenByTokenReference) {
  auto tok = ByteTokenizer();
  std::mt19937 rng(7);
  const std::vector<int> alphabet = {'a', 'b', 'c', ' ', 256, 257};
  int stops_seen = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<int> ids(1 + rng() % 20);
    for (int& id : ids) id = alphabet[rng() % alphabet.size()];
    std::vector<std::string> stop(rng() % 3);
    for (std::string& s : stop) {
      s.resize(1 + rng() % 4);
      for (char& c : s) c = "abc "[rng() % 4];
    }
    // Reference: the first prefix of tokens whose text contains a stop string; the text up
    // to the earliest such occurrence (the first listed on a tie).
    std::string ref;
    int ref_at = -1;
    std::string ref_stop;
    for (size_t n = 1; n <= ids.size() && ref_at < 0; ++n) {
      const std::string text = tok->Decode(std::vector<int>(ids.begin(), ids.begin() + n), true);
      size_t best = std::string::npos;
      for (const std::string& s : stop) {
        const size_t at = text.find(s);
        if (at < best) {
          best = at;
          ref_stop = s;
        }
      }
      if (best != std::string::npos) {
        ref = text.substr(0, best);
        ref_at = static_cast<int>(n - 1);
      }
    }
    if (ref_at < 0) ref = tok->Decode(ids, true);
    Streamed got = StreamText(*tok, ids, stop);
    ASSERT_EQ(got.text, ref) << "iteration " << iter;
    ASSERT_EQ(got.stopped_at, ref_at) << "iteration " << iter;
    ASSERT_EQ(got.stop, ref_at >= 0 ? ref_stop : "") << "iteration " << iter;
    stops_seen += ref_at >= 0;
  }
  EXPECT_GT(stops_seen, 500);
}

// vLLM's min_tokens: the first min_tokens tokens' text is never matched on its own; a match
// may start inside it but must end in a later token's text.
TEST(TextStream, MinTokensProtectsTheFirstTokensText) {
  auto tok = ByteTokenizer();
  EXPECT_EQ(StreamText(*tok, Bytes("Hello world"), {"o"}).text, "Hell");
  Streamed got = StreamText(*tok, Bytes("Hello world"), {"o"}, true, 5);
  EXPECT_EQ(got.text, "Hello w");
  EXPECT_EQ(got.stopped_at, 7);
  // "bc" starting in the protected "ab" and ending in token 2's "c" matches...
  got = StreamText(*tok, Bytes("abcd"), {"bc"}, true, 2);
  EXPECT_EQ(got.text, "a");
  EXPECT_EQ(got.stopped_at, 2);
  // ...but not when it ends inside the protected "abc".
  got = StreamText(*tok, Bytes("abcd"), {"bc"}, true, 3);
  EXPECT_EQ(got.text, "abcd");
  EXPECT_EQ(got.stopped_at, -1);
  // Fewer tokens than min_tokens: nothing can match, the whole text comes out.
  got = StreamText(*tok, Bytes("xox"), {"o"}, true, 10);
  EXPECT_EQ(got.text, "xox");
  EXPECT_EQ(got.deltas, (std::vector<std::string>{"x", "o", "x", ""}));
}

// Random streams with min_tokens against vLLM's rule: after token n > min_tokens, a stop
// string matches where it ends past the text of the first min_tokens tokens.
TEST(TextStream, RandomStreamsWithMinTokensMatchTheReference) {
  auto tok = ByteTokenizer();
  std::mt19937 rng(11);
  const std::vector<int> alphabet = {'a', 'b', 'c', ' ', 256, 257};
  int stops_seen = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<int> ids(1 + rng() % 20);
    for (int& id : ids) id = alphabet[rng() % alphabet.size()];
    std::vector<std::string> stop(1 + rng() % 2);
    for (std::string& s : stop) {
      s.resize(1 + rng() % 3);
      for (char& c : s) c = "abc "[rng() % 4];
    }
    const int min_tokens = static_cast<int>(rng() % 8);
    const size_t first = std::min<size_t>(min_tokens, ids.size());
    const size_t kept =
        tok->Decode(std::vector<int>(ids.begin(), ids.begin() + first), true).size();
    std::string ref;
    int ref_at = -1;
    for (size_t n = min_tokens + 1; n <= ids.size() && ref_at < 0; ++n) {
      const std::string text = tok->Decode(std::vector<int>(ids.begin(), ids.begin() + n), true);
      size_t best = std::string::npos;
      for (const std::string& s : stop) {
        const size_t at = text.find(s, kept >= s.size() ? kept - s.size() + 1 : 0);
        best = std::min(best, at);
      }
      if (best != std::string::npos) {
        ref = text.substr(0, best);
        ref_at = static_cast<int>(n - 1);
      }
    }
    if (ref_at < 0) ref = tok->Decode(ids, true);
    Streamed got = StreamText(*tok, ids, stop, true, min_tokens);
    ASSERT_EQ(got.text, ref) << "iteration " << iter;
    ASSERT_EQ(got.stopped_at, ref_at) << "iteration " << iter;
    stops_seen += ref_at >= 0;
  }
  EXPECT_GT(stops_seen, 300);
}

}  // namespace
}  // namespace morserve
