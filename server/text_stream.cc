// Text deltas and stop strings of one stream (see text_stream.h).
#include "server/text_stream.h"

#include <algorithm>


namespace morserve {

absl::StatusOr<TextStream> TextStream::Create(const Tokenizer& tokenizer, bool skip_special_tokens,
                                              std::vector<std::string> stop, int min_tokens) {
  absl::StatusOr<IncrementalDetokenizer> d =
      IncrementalDetokenizer::Create(tokenizer, skip_special_tokens);
  if (!d.ok()) return d.status();
  return TextStream(*std::move(d), std::move(stop), min_tokens);
}

TextStream::TextStream(IncrementalDetokenizer detokenizer, std::vector<std::string> stop,
                       int min_tokens)
    : detokenizer_(std::move(detokenizer)), stop_(std::move(stop)), min_tokens_(min_tokens) {
  for (const std::string& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
}

const std::string& TextStream::stop_string() const {
  static const std::string kNone;
  return matched_ >= 0 ? stop_[matched_] : kNone;
}

std::string TextStream::Push(int id) {
  if (stopped()) return "";
  pending_ += detokenizer_.Push(id);
  if (++pushed_ <= min_tokens_) protected_ = pending_.size();
  return Release(/*at_end=*/false);
}

std::string TextStream::Finish() {
  if (stopped()) return "";
  pending_ += detokenizer_.Flush();  // the last token's text
  if (pushed_ <= min_tokens_) protected_ = pending_.size();
  return Release(/*at_end=*/true);
}

size_t TextStream::SearchFrom(const std::string& stop) const {
  return protected_ >= stop.size() ? protected_ - stop.size() + 1 : 0;
}

std::string TextStream::Release(bool at_end) {
  // Earliest match; the first listed wins a tie. Sent text never holds the start of a match
  // (it would have been held back), so searching pending_ alone is enough.
  size_t best = std::string::npos;
  for (size_t k = 0; k < stop_.size(); ++k) {
    const size_t at = pending_.find(stop_[k], SearchFrom(stop_[k]));
    if (at < best) {
      best = at;
      matched_ = static_cast<int>(k);
    }
  }
  std::string out;
  if (best != std::string::npos) {
    out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  if (!at_end) {
    for (size_t n = std::min(pending_.size(), longest_stop_ - (longest_stop_ > 0)); n > 0; --n) {
      const std::string_view tail = std::string_view(pending_).substr(pending_.size() - n);
      if (std::any_of(stop_.begin(), stop_.end(),
                      [&](const std::string& s) { return s.starts_with(tail); })) {
        hold = n;
        break;
      }
    }
  }
  out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  protected_ -= std::min(protected_, out.size());
  return out;
}

}  // namespace morserve
