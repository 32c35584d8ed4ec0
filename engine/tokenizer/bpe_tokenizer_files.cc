// Hugging Face tokenizer files for a trained byte-level BPE (see bpe_tokenizer_files.h).
#include "engine/tokenizer/bpe_tokenizer_files.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Llama 3's (and GPT-4's cl100k) split pattern, as Llama 3's tokenizer.json writes it.
constexpr char kLlama3SplitRegex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Llama 3 Instruct's chat template.
constexpr char kLlama3ChatTemplate[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

constexpr int kBos = 0, kEndOfText = 1, kEot = 4;  // indices into Llama3SpecialTokens()

// Raw bytes -> the vocabulary string (GPT-2's printable stand-in for each byte).
std::string ByteLevelString(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) AppendUtf8(ByteToUnicode(b), &s);
  return s;
}

ordered_json AddedToken(int id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

ordered_json PostProcessor(const std::string& bos, int bos_id) {
  auto special = [](const std::string& t) {
    return ordered_json{{"SpecialToken", {{"id", t}, {"type_id", 0}}}};
  };
  auto sequence = [](const char* id, int type) {
    return ordered_json{{"Sequence", {{"id", id}, {"type_id", type}}}};
  };
  ordered_json tmpl = {
      {"type", "TemplateProcessing"},
      {"single", {special(bos), sequence("A", 0)}},
      {"pair", {special(bos), sequence("A", 0), special(bos), sequence("B", 1)}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
  ordered_json byte_level = {{"type", "ByteLevel"},
                             {"add_prefix_space", true},
                             {"trim_offsets", false},
                             {"use_regex", true}};
  return {{"type", "Sequence"}, {"processors", {byte_level, tmpl}}};
}

ordered_json ModelJson(const TrainedBpe& bpe) {
  ordered_json vocab = ordered_json::object();
  std::vector<std::string> names;
  names.reserve(bpe.tokens.size());
  for (size_t id = 0; id < bpe.tokens.size(); ++id) {
    names.push_back(ByteLevelString(bpe.tokens[id]));
    vocab[names.back()] = id;
  }
  ordered_json merges = ordered_json::array();
  for (const TrainedBpe::Merge& m : bpe.merges) {
    merges.push_back(absl::StrCat(names[m.left], " ", names[m.right]));
  }
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

absl::Status WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

}  // namespace

json Llama3PreTokenizerJson() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", kLlama3SplitRegex}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

const std::vector<std::string>& Llama3SpecialTokens() {
  static const std::vector<std::string> tokens = {"<|begin_of_text|>", "<|end_of_text|>",
                                                  "<|start_header_id|>", "<|end_header_id|>",
                                                  "<|eot_id|>"};
  return tokens;
}

const std::vector<std::string>& ChatTemplateNames() {
  static const std::vector<std::string> names = {"llama3", "none"};
  return names;
}

absl::StatusOr<BpeTokenizerFiles> MakeBpeTokenizerFiles(const TrainedBpe& bpe,
                                                        const std::string& chat_template) {
  if (chat_template != "llama3" && chat_template != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown chat template '", chat_template,
                     "' (known: ", absl::StrJoin(ChatTemplateNames(), ", "), ")"));
  }
  const std::vector<std::string>& specials = Llama3SpecialTokens();
  const int first_special = static_cast<int>(bpe.tokens.size());
  auto special_id = [&](int i) { return first_special + i; };
  const bool chat = chat_template == "llama3";
  const int eos = chat ? kEot : kEndOfText;

  BpeTokenizerFiles f;
  ordered_json added = ordered_json::array();
  ordered_json added_decoder = ordered_json::object();
  for (size_t i = 0; i < specials.size(); ++i) {
    added.push_back(AddedToken(special_id(i), specials[i]));
    ordered_json entry = AddedToken(special_id(i), specials[i]);
    entry.erase("id");
    added_decoder[std::to_string(special_id(i))] = std::move(entry);
  }
  f.tokenizer = {{"version", "1.0"},
                 {"truncation", nullptr},
                 {"padding", nullptr},
                 {"added_tokens", std::move(added)},
                 {"normalizer", nullptr},
                 {"pre_tokenizer", ordered_json::parse(Llama3PreTokenizerJson().dump())},
                 {"post_processor", PostProcessor(specials[kBos], special_id(kBos))},
                 {"decoder",
                  {{"type", "ByteLevel"},
                   {"add_prefix_space", true},
                   {"trim_offsets", true},
                   {"use_regex", true}}},
                 {"model", ModelJson(bpe)}};

  f.tokenizer_config = {{"add_bos_token", true},
                        {"add_eos_token", false},
                        {"added_tokens_decoder", std::move(added_decoder)},
                        {"bos_token", specials[kBos]}};
  if (chat) f.tokenizer_config["chat_template"] = kLlama3ChatTemplate;
  f.tokenizer_config["clean_up_tokenization_spaces"] = false;
  f.tokenizer_config["eos_token"] = specials[eos];
  f.tokenizer_config["model_input_names"] = ordered_json::array({"input_ids", "attention_mask"});
  f.tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast";

  ordered_json eos_ids = ordered_json::array({special_id(kEndOfText)});
  if (chat) eos_ids.push_back(special_id(kEot));
  f.generation_config = {{"bos_token_id", special_id(kBos)}, {"eos_token_id", eos_ids}};
  return f;
}

absl::Status WriteBpeTokenizerFiles(const BpeTokenizerFiles& files, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::filesystem::path d(dir);
  for (const auto& [name, j] : {std::pair{"tokenizer.json", &files.tokenizer},
                                std::pair{"tokenizer_config.json", &files.tokenizer_config},
                                std::pair{"generation_config.json", &files.generation_config}}) {
    if (absl::Status s = WriteText(d / name, j->dump(2) + "\n"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace morserve
