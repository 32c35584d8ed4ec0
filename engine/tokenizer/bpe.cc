#include "engine/tokenizer/bpe.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

using nlohmann::json;

struct ByteTables {
  char32_t to_unicode[256];
  absl::flat_hash_map<char32_t, int> to_byte;
  ByteTables() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_unicode[b] = printable ? b : 256 + n++;
      to_byte[to_unicode[b]] = b;
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables* tables = new ByteTables();
  return *tables;
}

}  // namespace

char32_t ByteToUnicode(unsigned char b) { return Tables().to_unicode[b]; }

int UnicodeToByte(char32_t cp) {
  auto it = Tables().to_byte.find(cp);
  return it == Tables().to_byte.end() ? -1 : it->second;
}

bool BpeModel::VocabKey(std::string_view token, std::string* key) const {
  if (!byte_level_) {
    key->assign(token);
    return true;
  }
  key->clear();
  for (size_t i = 0; i < token.size();) {
    int b = UnicodeToByte(NextCodePoint(token, &i));
    if (b < 0) return false;
    key->push_back(static_cast<char>(b));
  }
  return true;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& model, bool byte_level) {
  auto bpe = std::unique_ptr<BpeModel>(new BpeModel());
  bpe->byte_level_ = byte_level;
  try {
    if (model.value("type", std::string("BPE")) != "BPE") {
      return absl::UnimplementedError(absl::StrCat("model type '", model["type"].get<std::string>(),
                                                   "' is not supported (BPE only)"));
    }
    const json& vocab = model.at("vocab");
    if (!vocab.is_object()) return absl::InvalidArgumentError("model.vocab must be an object");
    for (const json& field : {model.value("end_of_word_suffix", json()),
                              model.value("continuing_subword_prefix", json())}) {
      if (field.is_string() && !field.get<std::string>().empty()) {
        return absl::UnimplementedError(
            "BPE end_of_word_suffix / continuing_subword_prefix are not supported");
      }
    }
    if (!model.value("dropout", json()).is_null()) {
      return absl::UnimplementedError("BPE dropout is not supported");
    }
    bpe->byte_fallback_ = model.value("byte_fallback", false);
    bpe->ignore_merges_ = model.value("ignore_merges", false);
    bpe->fuse_unk_ = model.value("fuse_unk", false);
    std::string key;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() > (1 << 30)) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.vocab: id of '", it.key(), "' is not a valid id"));
      }
      int id = it.value();
      if (static_cast<size_t>(id) >= bpe->id_to_token_.size()) bpe->id_to_token_.resize(id + 1);
      bpe->id_to_token_[id] = it.key();
      if (bpe->VocabKey(it.key(), &key)) bpe->key_to_id_.emplace(key, id);
      if (!byte_level) bpe->NoteMetaspaceJoins(it.key());
    }
    const json& merges = model.at("merges");
    if (!merges.is_array()) return absl::InvalidArgumentError("model.merges must be an array");
    bpe->merges_.reserve(merges.size());
    std::string left, right;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& m = merges[rank];
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        size_t space = s.find(' ');
        if (space == std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("model.merges[", rank, "] '", s, "' is not two tokens"));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0];
        right = m[1];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("model.merges[", rank, "] is malformed"));
      }
      std::string lk, rk, mk;
      auto find = [&](const std::string& token, std::string* k) -> int {
        if (!bpe->VocabKey(token, k)) return -1;
        auto f = bpe->key_to_id_.find(*k);
        return f == bpe->key_to_id_.end() ? -1 : f->second;
      };
      int a = find(left, &lk), b = find(right, &rk), r = find(left + right, &mk);
      if (a < 0 || b < 0 || r < 0) {
        return absl::InvalidArgumentError(absl::StrCat("model.merges[", rank, "] ('", left, "', '",
                                                       right, "') uses a token not in vocab"));
      }
      bpe->merges_.emplace(PairKey(a, b), Merge{static_cast<int>(rank), r});
    }
    std::string unk = model.value("unk_token", json()).is_string()
                          ? model["unk_token"].get<std::string>()
                          : std::string();
    if (!unk.empty()) {
      auto it = vocab.find(unk);
      if (it != vocab.end()) bpe->unk_id_ = *it;
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", e.what()));
  }
  for (int b = 0; b < 256; ++b) {
    std::string k(1, static_cast<char>(b));
    auto it = bpe->key_to_id_.find(k);
    bpe->byte_symbol_[b] = it == bpe->key_to_id_.end() ? -1 : it->second;
    auto fb = bpe->key_to_id_.find(absl::StrFormat("<0x%02X>", b));
    bpe->byte_fallback_id_[b] = fb == bpe->key_to_id_.end() ? -1 : fb->second;
  }
  return bpe;
}

void BpeModel::AddToken(std::string_view content, int id) {
  if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
  id_to_token_[id] = std::string(content);
  std::string key;
  if (VocabKey(content, &key)) key_to_id_[key] = id;
  if (!byte_level_) NoteMetaspaceJoins(content);
  if (key.size() == 1 && byte_level_) byte_symbol_[static_cast<unsigned char>(key[0])] = id;
}

std::optional<int> BpeModel::Lookup(std::string_view token) const {
  std::string key;
  if (!VocabKey(token, &key)) return std::nullopt;
  auto it = key_to_id_.find(key);
  if (it == key_to_id_.end() || id_to_token_[it->second] != token) return std::nullopt;
  return it->second;
}

void BpeModel::NoteMetaspaceJoins(std::string_view token) {
  char32_t prev = 0;
  for (size_t i = 0; i < token.size();) {
    char32_t c = NextCodePoint(token, &i);
    if (c == kMetaspace && prev != 0 && prev != kMetaspace) joins_metaspace_.insert(prev);
    prev = c;
  }
}

void BpeModel::EmitUnknown(std::string_view piece, std::vector<int>* ids) const {
  if (byte_fallback_) {
    bool all = true;
    for (unsigned char b : piece) all = all && byte_fallback_id_[b] >= 0;
    if (all) {
      for (unsigned char b : piece) ids->push_back(byte_fallback_id_[b]);
      return;
    }
  }
  if (unk_id_ >= 0) ids->push_back(unk_id_);
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = key_to_id_.find(AView(word));
    if (it != key_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (!byte_level_ && word.size() > 8) {
    size_t piece_start = 0;
    char32_t prev = 0;
    for (size_t i = 0; i < word.size();) {
      size_t at = i;
      char32_t c = NextCodePoint(word, &i);
      if (c == kMetaspace && prev != 0 && prev != kMetaspace && !joins_metaspace_.contains(prev)) {
        EncodePiece(word.substr(piece_start, at - piece_start), ids);
        piece_start = at;
      }
      prev = c;
    }
    EncodePiece(word.substr(piece_start), ids);
    return;
  }
  EncodePiece(word, ids);
}

void BpeModel::EncodePiece(std::string_view word, std::vector<int>* ids) const {
  if (word.size() <= kMaxCachedWordBytes) {
    absl::MutexLock lock(&cache_mu_);
    auto it = cache_.find(AView(word));
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = ids->size();
  Merge_(word, ids);
  if (word.size() <= kMaxCachedWordBytes) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(word, std::vector<int>(ids->begin() + first, ids->end()));
  }
}

void BpeModel::Merge_(std::string_view word, std::vector<int>* ids) const {
  struct Symbol {
    int id;  // -1: not in the vocabulary (never merges)
    uint32_t start, len;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  if (byte_level_) {
    for (size_t i = 0; i < word.size(); ++i) {
      symbols.push_back({byte_symbol_[static_cast<unsigned char>(word[i])],
                         static_cast<uint32_t>(i), 1, static_cast<int>(i) - 1,
                         static_cast<int>(i) + 1});
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      size_t start = i;
      i += Utf8SequenceLength(static_cast<unsigned char>(word[i]));
      auto it = key_to_id_.find(AView(word.substr(start, i - start)));
      int n = static_cast<int>(symbols.size());
      symbols.push_back({it == key_to_id_.end() ? -1 : it->second, static_cast<uint32_t>(start),
                         static_cast<uint32_t>(i - start), n - 1, n + 1});
    }
  }
  symbols.back().next = -1;

  // Queue entries: (rank, left position); equal ranks pop leftmost first.
  struct Entry {
    int rank;
    int pos;
    int result;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  auto consider = [&](int left) {
    int right = symbols[left].next;
    if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.result});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    Entry top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale entry: one side has changed since it was queued.
    auto it =
        left.id < 0 || right.id < 0 ? merges_.end() : merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.rank != top.rank) continue;
    left.id = top.result;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      EmitUnknown(word.substr(s.start, s.len), ids);
    }
  }
}

}  // namespace morserve
