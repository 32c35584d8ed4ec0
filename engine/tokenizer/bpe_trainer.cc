// BPE merge learning (see bpe_trainer.h).
#include "engine/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <optional>
#include <queue>

#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

// (left id, right id) packed so that comparing keys compares the pairs lexicographically.
using PairKey = uint64_t;
PairKey Key(int left, int right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int Left(PairKey k) { return static_cast<int>(k >> 32); }
int Right(PairKey k) { return static_cast<int>(k & 0xffffffffu); }

struct PairStats {
  int64_t count = 0;
  std::vector<int32_t> words;  // indices of words that held the pair (may be stale or repeated)
};

struct HeapEntry {
  int64_t count;
  PairKey pair;
};
// std::priority_queue keeps the "largest" on top: highest count, then the smallest pair.
struct HeapOrder {
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    if (a.count != b.count) return a.count < b.count;
    return a.pair > b.pair;
  }
};
using PairHeap = std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapOrder>;

// The state of one training run: the distinct words as symbol ids with their counts, and the
// pair statistics kept up to date as merges rewrite the words.
class MergeLearner {
 public:
  MergeLearner(const absl::flat_hash_map<std::string, int64_t>& word_counts) {
    std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
    std::sort(sorted.begin(), sorted.end());  // a fixed word order: runs are reproducible
    for (auto& [word, count] : sorted) {
      std::vector<int> symbols(word.begin(), word.end());
      for (int& s : symbols) s = static_cast<unsigned char>(s);
      symbols_.push_back(std::move(symbols));
      counts_.push_back(count);
    }
    for (int b = 0; b < 256; ++b) {
      result_.tokens.push_back(std::string(1, static_cast<char>(b)));
      token_ids_.emplace(result_.tokens.back(), b);
    }
    for (size_t w = 0; w < symbols_.size(); ++w) {
      const std::vector<int>& s = symbols_[w];
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        PairStats& p = stats_[Key(s[i], s[i + 1])];
        p.count += counts_[w];
        if (p.words.empty() || p.words.back() != static_cast<int32_t>(w)) p.words.push_back(w);
      }
    }
    for (const auto& [pair, st] : stats_) heap_.push({st.count, pair});
  }

  TrainedBpe Run(int max_tokens) {
    while (static_cast<int>(result_.tokens.size()) < max_tokens) {
      std::optional<PairKey> best = PopBest();
      if (!best) break;
      Merge(*best);
    }
    return std::move(result_);
  }

 private:
  // The most frequent pair (ties: smallest pair), skipping stale heap entries.
  std::optional<PairKey> PopBest() {
    while (!heap_.empty()) {
      const HeapEntry top = heap_.top();
      heap_.pop();
      const int64_t current = stats_[top.pair].count;
      if (current <= 0) continue;
      if (current != top.count) {
        heap_.push({current, top.pair});
        continue;
      }
      return top.pair;
    }
    return std::nullopt;
  }

  int TokenFor(const std::string& bytes) {
    auto [it, inserted] = token_ids_.emplace(bytes, static_cast<int>(result_.tokens.size()));
    if (inserted) result_.tokens.push_back(bytes);
    return it->second;
  }

  void Merge(PairKey pair) {
    const int left = Left(pair), right = Right(pair);
    const int id = TokenFor(result_.tokens[left] + result_.tokens[right]);
    result_.merges.push_back({left, right, id});

    std::vector<int32_t> words = std::move(stats_[pair].words);
    stats_[pair].words.clear();
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    absl::flat_hash_map<PairKey, int64_t> delta;
    for (int32_t w : words) RewriteWord(w, left, right, id, &delta);
    for (const auto& [p, d] : delta) {
      if (d == 0) continue;
      PairStats& st = stats_[p];
      st.count += d;
      if (d > 0) heap_.push({st.count, p});
    }
  }

  // Replaces each (left, right) in word w, left to right, by id; the word's old pairs leave
  // the counts and its new ones enter (pairs it keeps cancel out in *delta).
  void RewriteWord(int32_t w, int left, int right, int id,
                   absl::flat_hash_map<PairKey, int64_t>* delta) {
    std::vector<int>& s = symbols_[w];
    bool found = false;
    for (size_t i = 0; i + 1 < s.size() && !found; ++i) found = s[i] == left && s[i + 1] == right;
    if (!found) return;  // a stale entry of the pair's word list
    const int64_t count = counts_[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) (*delta)[Key(s[i], s[i + 1])] -= count;
    std::vector<int> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
        out.push_back(id);
        ++i;
      } else {
        out.push_back(s[i]);
      }
    }
    s = std::move(out);
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const PairKey p = Key(s[i], s[i + 1]);
      (*delta)[p] += count;
      // Only pairs with the new symbol can be new to this word.
      if (s[i] == id || s[i + 1] == id) stats_[p].words.push_back(w);
    }
  }

  std::vector<std::vector<int>> symbols_;
  std::vector<int64_t> counts_;
  absl::flat_hash_map<PairKey, PairStats> stats_;
  PairHeap heap_;
  absl::flat_hash_map<std::string, int> token_ids_;
  TrainedBpe result_;
};

}  // namespace

absl::StatusOr<BpeTrainer> BpeTrainer::Create(const PreTokenizer* pre_tokenizer) {
  if (pre_tokenizer == nullptr || !pre_tokenizer->byte_level()) {
    return absl::InvalidArgumentError(
        "BPE trainer: the pre-tokenizer must end in ByteLevel (words of raw bytes)");
  }
  return BpeTrainer(pre_tokenizer);
}

void BpeTrainer::AddText(std::string_view text) {
  std::vector<std::string> words;
  pre_tokenizer_->Split(text, 0, &words);
  for (const std::string& w : words) AddWord(w);
}

void BpeTrainer::AddWord(std::string_view word, int64_t count) {
  if (word.empty() || count <= 0) return;
  word_counts_[std::string(word)] += count;
  total_words_ += count;
}

absl::StatusOr<TrainedBpe> BpeTrainer::Train(int max_tokens) const {
  if (max_tokens < 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("BPE trainer: ", max_tokens, " tokens cannot hold the 256 single bytes"));
  }
  return MergeLearner(word_counts_).Run(max_tokens);
}

}  // namespace morserve
