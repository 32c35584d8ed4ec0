#include "engine/tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

using nlohmann::json;

// A token field of tokenizer_config.json: a string, an AddedToken object, or null.
std::optional<std::string> ConfigToken(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string() && !v.get<std::string>().empty()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<json> ParseJson(std::string_view text, std::string_view what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(AView(what), ": invalid JSON"));
  return j;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  absl::StatusOr<std::string> tj_text = ReadFile(dir + "/tokenizer.json");
  if (!tj_text.ok()) return tj_text.status();
  absl::StatusOr<json> tj = ParseJson(*tj_text, dir + "/tokenizer.json");
  if (!tj.ok()) return tj.status();
  json config = json::object();
  if (absl::StatusOr<std::string> text = ReadFile(dir + "/tokenizer_config.json"); text.ok()) {
    absl::StatusOr<json> parsed = ParseJson(*text, dir + "/tokenizer_config.json");
    if (!parsed.ok()) return parsed.status();
    config = *std::move(parsed);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = FromJson(*tj, config);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat(dir, "/tokenizer.json: ", tok.status().message()));
  }
  if (absl::StatusOr<std::string> text = ReadFile(dir + "/generation_config.json"); text.ok()) {
    absl::StatusOr<json> gen = ParseJson(*text, dir + "/generation_config.json");
    if (!gen.ok()) return gen.status();
    const json eos = gen->value("eos_token_id", json());
    std::vector<int>& ids = (*tok)->eos_ids_;
    auto add = [&](const json& v) {
      if (!v.is_number_integer()) return;
      int id = v;
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    };
    if (eos.is_array()) {
      for (const json& v : eos) add(v);
    } else {
      add(eos);
    }
  }
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonText(std::string_view tokenizer_json,
                                                                   std::string_view config) {
  absl::StatusOr<json> tj = ParseJson(tokenizer_json, "tokenizer.json");
  if (!tj.ok()) return tj.status();
  json cj = json::object();
  if (!config.empty()) {
    absl::StatusOr<json> parsed = ParseJson(config, "tokenizer_config.json");
    if (!parsed.ok()) return parsed.status();
    cj = *std::move(parsed);
  }
  return FromJson(*tj, cj);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const json& tokenizer_json,
                                                               const json& tokenizer_config) {
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  absl::Status s =
      tok->Load(tokenizer_json, tokenizer_config.is_object() ? tokenizer_config : json::object());
  if (!s.ok()) return s;
  return tok;
}

absl::Status Tokenizer::Load(const json& tj, const json& config) {
  if (!tj.is_object()) return absl::InvalidArgumentError("tokenizer.json: not a JSON object");
  if (!tj.contains("model") || !tj["model"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: missing 'model' object");
  }
  auto get = [&](const char* key) { return tj.contains(key) ? tj[key] : json(); };
  absl::StatusOr<std::unique_ptr<Normalizer>> normalizer = Normalizer::FromJson(get("normalizer"));
  if (!normalizer.ok()) return normalizer.status();
  normalizer_ = *std::move(normalizer);
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre = PreTokenizer::FromJson(get("pre_tokenizer"));
  if (!pre.ok()) return pre.status();
  pre_tokenizer_ = *std::move(pre);
  absl::StatusOr<std::unique_ptr<BpeModel>> model =
      BpeModel::FromJson(tj["model"], pre_tokenizer_ && pre_tokenizer_->byte_level());
  if (!model.ok()) return model.status();
  model_ = *std::move(model);
  absl::StatusOr<std::vector<DecoderStep>> decoder = ParseDecoder(get("decoder"));
  if (!decoder.ok()) return decoder.status();
  decoder_steps_ = *std::move(decoder);
  has_decoder_ = !get("decoder").is_null();

  const json added = get("added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return absl::InvalidArgumentError("tokenizer.json: 'added_tokens' must be an array");
  }
  for (const json& a : added.is_array() ? added : json::array()) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() > (1 << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: malformed added token ", a.dump().substr(0, 200)));
    }
    AddedToken t;
    t.content = a["content"];
    t.id = a["id"];
    for (auto [key, flag] :
         {std::pair{"special", &t.special}, std::pair{"lstrip", &t.lstrip},
          std::pair{"rstrip", &t.rstrip}, std::pair{"single_word", &t.single_word},
          std::pair{"normalized", &t.normalized}}) {
      const json v = a.value(key, json(false));
      if (!v.is_boolean()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: added token ", t.id, ": '",
                                                       key, "' must be true or false"));
      }
      *flag = v.get<bool>();
    }
    model_->AddToken(t.content, t.id);
    if (t.special) special_strings_.insert(t.content);
    if (t.normalized) {
      AddedToken n = t;
      if (normalizer_) n.content = normalizer_->Normalize(n.content);
      normalized_added_.Add(std::move(n));
    } else {
      raw_added_.Add(t);
    }
    added_.Add(std::move(t));
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    for (const json& v : config["additional_special_tokens"]) {
      if (v.is_string()) special_strings_.insert(v.get<std::string>());
      if (v.is_object() && v.contains("content") && v["content"].is_string()) {
        special_strings_.insert(v["content"].get<std::string>());
      }
    }
  }

  const json& model_json = tj["model"];
  if (model_json.contains("unk_token") && model_json["unk_token"].is_string()) {
    unk_text_ = model_json["unk_token"];
  }
  clean_up_ = config.value("clean_up_tokenization_spaces", json(true)).is_boolean()
                  ? config.value("clean_up_tokenization_spaces", true)
                  : true;
  bos_token_ = ConfigToken(config, "bos_token");
  eos_token_ = ConfigToken(config, "eos_token");
  if (bos_token_) bos_id_ = TokenToId(*bos_token_);
  if (eos_token_) {
    if (std::optional<int> id = TokenToId(*eos_token_)) eos_ids_.push_back(*id);
  }

  std::string tokenizer_class = config.value("tokenizer_class", json("")).is_string()
                                    ? config.value("tokenizer_class", std::string())
                                    : std::string();
  if (tokenizer_class.size() > 4 && tokenizer_class.substr(tokenizer_class.size() - 4) == "Fast") {
    tokenizer_class.resize(tokenizer_class.size() - 4);
  }
  if (tokenizer_class == "LlamaTokenizer" && !config.value("legacy", json(true)).is_null() &&
      !config.value("legacy", true)) {
    // transformers.js replaces the normalizer and pre-tokenizer of non-legacy Llama tokenizers.
    llama_non_legacy_ = true;
    normalizer_.reset();
    pre_tokenizer_ = MakeMetaspacePreTokenizer("\xE2\x96\x81", true, "first");
    metaspace_id_ = TokenToId("\xE2\x96\x81").value_or(-1);
  }
  return LoadPostProcessor(get("post_processor"));
}

absl::Status Tokenizer::LoadPostProcessor(const json& pp) {
  if (pp.is_null()) return absl::OkStatus();
  if (!pp.is_object() || !pp.contains("type") || !pp["type"].is_string()) {
    return absl::InvalidArgumentError("post_processor: expected an object with a string 'type'");
  }
  const std::string type = pp["type"];
  try {
    if (type == "Sequence") {
      for (const json& p : pp.at("processors")) {
        absl::Status s = LoadPostProcessor(p);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }
    if (type == "ByteLevel") return absl::OkStatus();  // offsets only
    auto lookup = [&](const std::string& token) -> absl::StatusOr<int> {
      std::optional<int> id = TokenToId(token);
      if (!id) {
        return absl::InvalidArgumentError(
            absl::StrCat("post_processor: special token '", token, "' is not in the vocabulary"));
      }
      return *id;
    };
    if (type == "TemplateProcessing") {
      template_.clear();
      const json& specials = pp.value("special_tokens", json::object());
      for (const json& item : pp.at("single")) {
        if (item.contains("Sequence")) {
          if (item["Sequence"].at("id") != "A") {
            return absl::InvalidArgumentError("post_processor: single template uses sequence B");
          }
          template_.push_back(-1);
        } else if (item.contains("SpecialToken")) {
          std::string name = item["SpecialToken"].at("id");
          if (specials.contains(name) && specials[name].contains("ids")) {
            for (const json& id : specials[name]["ids"]) template_.push_back(id.get<int>());
          } else {
            absl::StatusOr<int> id = lookup(name);
            if (!id.ok()) return id.status();
            template_.push_back(*id);
          }
        } else {
          return absl::InvalidArgumentError("post_processor: unknown template item");
        }
      }
      return absl::OkStatus();
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      absl::StatusOr<int> cls = lookup(pp.at("cls").at(0));
      absl::StatusOr<int> sep = lookup(pp.at("sep").at(0));
      if (!cls.ok()) return cls.status();
      if (!sep.ok()) return sep.status();
      template_ = {*cls, -1, *sep};
      return absl::OkStatus();
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("post_processor ", type, ": ", e.what()));
  }
  return absl::UnimplementedError(
      absl::StrCat("post_processor type '", type, "' is not supported"));
}

std::optional<int> Tokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* t = added_.Find(token)) return t->id;
  return model_->Lookup(token);
}

std::optional<std::string> Tokenizer::IdToToken(int id) const {
  const std::vector<std::string>& vocab = model_->id_to_token();
  if (id < 0 || id >= static_cast<int>(vocab.size()) || vocab[id].empty()) return std::nullopt;
  return vocab[id];
}

std::string_view Tokenizer::TokenText(int id) const {
  const std::vector<std::string>& vocab = model_->id_to_token();
  if (id < 0 || id >= static_cast<int>(vocab.size()) || vocab[id].empty()) return unk_text_;
  return vocab[id];
}

bool Tokenizer::IsSpecial(int id) const { return special_strings_.contains(AView(TokenText(id))); }

void Tokenizer::EncodeText(std::string_view text, std::vector<int>* ids) const {
  std::vector<AddedTokenSplitter::Section> sections = raw_added_.Split(text);
  for (size_t k = 0; k < sections.size(); ++k) {
    const AddedTokenSplitter::Section& section = sections[k];
    if (section.text.empty()) continue;
    if (section.token >= 0) {
      ids->push_back(raw_added_.tokens()[section.token].id);
      continue;
    }
    if (!normalizer_) {
      EncodeNormalized(section.text, static_cast<int>(k), ids);
      continue;
    }
    std::string normalized = normalizer_->Normalize(section.text);
    EncodeNormalized(normalized, static_cast<int>(k), ids);
  }
}

void Tokenizer::EncodeNormalized(std::string_view text, int section_index,
                                 std::vector<int>* ids) const {
  if (text.empty()) return;
  std::vector<AddedTokenSplitter::Section> pieces;
  if (normalized_added_.tokens().empty()) {
    pieces.push_back({text, -1});
  } else {
    pieces = normalized_added_.Split(text);
  }
  std::vector<std::string> words;
  for (const AddedTokenSplitter::Section& piece : pieces) {
    if (piece.text.empty()) continue;
    if (piece.token >= 0) {
      ids->push_back(normalized_added_.tokens()[piece.token].id);
      continue;
    }
    size_t first = ids->size();
    if (pre_tokenizer_) {
      words.clear();
      pre_tokenizer_->Split(piece.text, section_index, &words);
      for (const std::string& w : words) model_->EncodeWord(w, ids);
    } else {
      model_->EncodeWord(piece.text, ids);
    }
    if (model_->fuse_unk() && model_->unk_id() >= 0) {
      // Runs of unknown tokens within a span collapse into one.
      int unk = model_->unk_id();
      size_t out = first;
      for (size_t i = first; i < ids->size(); ++i) {
        if ((*ids)[i] == unk && out > first && (*ids)[out - 1] == unk) continue;
        (*ids)[out++] = (*ids)[i];
      }
      ids->resize(out);
    }
  }
}

std::vector<int> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string sanitized;
  if (!IsValidUtf8(text)) {
    sanitized = SanitizeUtf8(text);
    text = sanitized;
  }
  std::vector<int> ids;
  if (llama_non_legacy_ && !text.empty()) {
    // transformers.js' LlamaTokenizer (legacy=false): encode "▁" + text with "▁" as spaces and
    // drop a lone leading "▁" before a special token.
    std::string t =
        absl::StrCat("\xE2\x96\x81", absl::StrReplaceAll(AView(text), {{"\xE2\x96\x81", " "}}));
    EncodeText(t, &ids);
    if (ids.size() > 1 && ids[0] == metaspace_id_ && IsSpecial(ids[1])) ids.erase(ids.begin());
  } else {
    EncodeText(text, &ids);
  }
  if (template_.empty()) return ids;
  std::vector<int> out;
  out.reserve(ids.size() + template_.size());
  for (int t : template_) {
    if (t == -1) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else if (add_special_tokens) {
      out.push_back(t);
    }
  }
  return out;
}

std::string Tokenizer::Decode(absl::Span<const int> ids, bool skip_special_tokens) const {
  std::vector<std::string_view> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    std::string_view t = TokenText(id);
    if (skip_special_tokens && special_strings_.contains(AView(t))) continue;
    tokens.push_back(t);
  }
  std::string text = RunDecoder(decoder_steps_, has_decoder_, tokens, added_);
  return clean_up_ ? CleanUpTokenization(text) : text;
}

}  // namespace morserve
