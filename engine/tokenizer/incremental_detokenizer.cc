#include "engine/tokenizer/incremental_detokenizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/bpe.h"

namespace morserve {

absl::StatusOr<IncrementalDetokenizer> IncrementalDetokenizer::Create(const Tokenizer& tokenizer,
                                                                      bool skip_special_tokens) {
  IncrementalDetokenizer d(tokenizer);
  d.skip_special_ = skip_special_tokens;
  d.clean_up_ = tokenizer.clean_up_tokenization_spaces();
  d.join_with_spaces_ = !tokenizer.has_decoder();
  enum { kTokens, kGrouped, kFused } state = kTokens;
  for (const DecoderStep& step : tokenizer.decoder_steps()) {
    using K = DecoderStep::Kind;
    bool ok = false;
    if (state == kTokens) {
      ok = true;
      if (step.kind == K::kByteLevel || step.kind == K::kByteFallback) {
        d.grouping_ = step.kind == K::kByteLevel ? Grouping::kByteLevel : Grouping::kByteFallback;
        state = kGrouped;
      } else if (step.kind == K::kFuse) {
        state = kFused;
      } else {
        d.token_steps_.push_back(step);
      }
    } else if (step.kind == K::kFuse) {
      ok = true;
      state = kFused;
    } else if (state == kFused && step.kind == K::kStrip) {
      ok = true;
      d.strips_.push_back({step.content, step.start, step.stop, "", false});
    }
    if (!ok) {
      return absl::UnimplementedError(
          "incremental detokenizer: this decoder chain has no streaming form");
    }
  }
  d.initial_strips_ = d.strips_;
  return d;
}

void IncrementalDetokenizer::EmitAfterStrips(std::string_view text, std::string* out) {
  if (text.empty()) return;
  if (!clean_up_) {
    out->append(text);
    return;
  }
  clean_pending_.append(text);
  // Emit up to the last boundary no clean-up pattern can cross.
  size_t p = clean_pending_.size();
  for (; p > 0; --p) {
    bool char_boundary = p == clean_pending_.size() ||
                         (static_cast<unsigned char>(clean_pending_[p]) & 0xC0) != 0x80;
    if (char_boundary && IsCleanUpSafeBoundary(clean_pending_[p - 1])) break;
  }
  if (p == 0) return;
  out->append(CleanUpTokenization(std::string_view(clean_pending_).substr(0, p)));
  clean_pending_.erase(0, p);
}

void IncrementalDetokenizer::EmitText(std::string_view text, std::string* out) {
  std::string current(text);
  for (StreamStrip& s : strips_) {
    std::string_view in = current;
    const size_t n = s.content.size();
    while (s.start_left > 0 && !in.empty()) {
      if (in.substr(0, n) == s.content) {
        in.remove_prefix(n);
        --s.start_left;
      } else {
        s.start_left = 0;
      }
    }
    if (in.empty()) {
      current.clear();
      continue;
    }
    std::string next;
    if (s.stop == 0) {
      next.assign(in);
    } else {
      // Trailing run of `content` in held + in; keep its last `stop` copies back.
      std::string all = absl::StrCat(s.held, AView(in));
      size_t run_start = all.size();
      while (run_start >= n && all.compare(run_start - n, n, s.content) == 0) run_start -= n;
      size_t keep = std::min((all.size() - run_start) / n, static_cast<size_t>(s.stop)) * n;
      next = all.substr(0, all.size() - keep);
      s.held = all.substr(all.size() - keep);
    }
    current = std::move(next);
  }
  EmitAfterStrips(current, out);
}

void IncrementalDetokenizer::FinishGroup(std::string* out) {
  if (!group_open_) return;
  std::string text;
  utf8_.Finish(&text);
  group_open_ = false;
  EmitText(text, out);
}

std::string IncrementalDetokenizer::Push(int id) {
  std::string out;
  std::string_view raw = tokenizer_->TokenText(id);
  if (skip_special_ && tokenizer_->IsSpecial(id)) return out;
  if (join_with_spaces_) {
    EmitText(tokens_seen_++ > 0 ? absl::StrCat(" ", AView(raw)) : std::string(raw), &out);
    return out;
  }
  std::string token(raw);
  for (const DecoderStep& step : token_steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kReplace:
        if (!step.pattern.empty())
          token = absl::StrReplaceAll(token, {{step.pattern, step.content}});
        break;
      case DecoderStep::Kind::kMetaspace:
        token = absl::StrReplaceAll(token, {{step.pattern, " "}});
        if (step.add_prefix_space && tokens_seen_ == 0 && !token.empty() && token[0] == ' ') {
          token.erase(0, 1);
        }
        break;
      case DecoderStep::Kind::kStrip: {
        std::string_view s = token;
        const std::string& c = step.content;
        for (int i = 0; i < step.start && s.substr(0, c.size()) == c; ++i)
          s.remove_prefix(c.size());
        for (int i = 0; i < step.stop && s.size() >= c.size() && s.substr(s.size() - c.size()) == c;
             ++i) {
          s.remove_suffix(c.size());
        }
        token = std::string(s);
        break;
      }
      default:
        break;
    }
  }
  ++tokens_seen_;
  std::string text;
  switch (grouping_) {
    case Grouping::kNone:
      EmitText(token, &out);
      break;
    case Grouping::kByteFallback: {
      int b = ParseByteToken(token);
      if (b >= 0) {
        if (!group_open_) utf8_ = Utf8StreamDecoder(/*strip_bom=*/true);
        group_open_ = true;
        utf8_.Feed(static_cast<unsigned char>(b), &text);
        EmitText(text, &out);
      } else {
        FinishGroup(&out);
        EmitText(token, &out);
      }
      break;
    }
    case Grouping::kByteLevel:
      if (tokenizer_->added_tokens().Find(token) != nullptr) {
        FinishGroup(&out);
        EmitText(token, &out);
      } else {
        if (!group_open_) utf8_ = Utf8StreamDecoder(/*strip_bom=*/false);
        group_open_ = true;
        for (size_t i = 0; i < token.size();) {
          int b = UnicodeToByte(NextCodePoint(token, &i));
          utf8_.Feed(static_cast<unsigned char>(b < 0 ? 0 : b), &text);
        }
        EmitText(text, &out);
      }
      break;
  }
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out;
  FinishGroup(&out);
  // Trailing characters held by Strip steps are the ones it removes: drop them, but pass what
  // an earlier strip held through the later ones.
  for (size_t i = 0; i < strips_.size(); ++i) strips_[i].held.clear();
  if (clean_up_) {
    out += CleanUpTokenization(clean_pending_);
    clean_pending_.clear();
  }
  strips_ = initial_strips_;
  tokens_seen_ = 0;
  return out;
}

}  // namespace morserve
