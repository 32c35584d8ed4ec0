// The BPE model of tokenizer.json: a vocabulary, ranked merges, and the optional SentencePiece
// conventions (byte_fallback to <0xXX> tokens, unk fusing, ignore_merges).
//
// Merging follows the reference exactly: the pair with the lowest rank merges first, ties go
// to the leftmost pair; a priority queue over a linked list of symbols makes it O(n log n) per
// word, and a bounded cache of whole words makes repeated words a hash lookup.
//
// A byte-level model (GPT-2 family) starts from one symbol per byte. Its vocabulary strings use
// GPT-2's printable stand-ins for bytes; they are translated to raw bytes once at load so words
// are never remapped. Other models start from one symbol per code point.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace morserve {

class BpeModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model,
                                                            bool byte_level);
  // Added tokens join the lookup table (transformers.js does the same): a word or merge result
  // equal to an added token's content maps to its id.
  void AddToken(std::string_view content, int id);
  // Appends the ids of one pre-tokenized word (raw bytes for a byte-level model).
  void EncodeWord(std::string_view word, std::vector<int>* ids) const;

  // Id of a vocabulary or added token string as written in tokenizer.json.
  std::optional<int> Lookup(std::string_view token) const;
  int unk_id() const { return unk_id_; }
  bool fuse_unk() const { return fuse_unk_; }
  bool byte_level() const { return byte_level_; }
  // Vocabulary strings as written in tokenizer.json, indexed by id ("" for holes).
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  std::vector<std::string>& mutable_id_to_token() { return id_to_token_; }

 private:
  struct Merge {
    int rank;
    int result;
  };
  static uint64_t PairKey(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Key of a vocabulary string: raw bytes for byte-level models; false if not representable.
  bool VocabKey(std::string_view token, std::string* key) const;
  void EncodePiece(std::string_view piece, std::vector<int>* ids) const;
  void Merge_(std::string_view word, std::vector<int>* ids) const;
  void EmitUnknown(std::string_view piece, std::vector<int>* ids) const;
  void NoteMetaspaceJoins(std::string_view token);
  static constexpr char32_t kMetaspace = 0x2581;  // "▁"

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  int unk_id_ = -1;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<std::string, int> key_to_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // SentencePiece words are whole spans ("▁a▁b..."), too long for the cache and slow to merge.
  // A merge can only join a character c to a following "▁" if some vocabulary token contains
  // c + "▁"; every other such boundary is cut before merging, which gives the same tokens.
  absl::flat_hash_set<char32_t> joins_metaspace_;
  int byte_symbol_[256];       // byte-level: id of each single byte (-1 if none)
  int byte_fallback_id_[256];  // <0xXX> ids (-1 if none)

  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

// GPT-2's byte <-> printable code point table used by ByteLevel pre-tokenizers and decoders.
char32_t ByteToUnicode(unsigned char b);
// Returns -1 for code points outside the table.
int UnicodeToByte(char32_t cp);

}  // namespace morserve
