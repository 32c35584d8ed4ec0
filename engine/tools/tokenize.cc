// `morserve tokenize`: text -> token ids with a model's tokenizer.json, or ids -> text.
//
//   morserve tokenize --model DIR [--json] [--no-special] TEXT     (TEXT "-" reads stdin)
//   morserve tokenize --model DIR [--json] [--skip-special] --decode 1,2,3
#include <cstdio>
#include <iostream>
#include <iterator>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/commands.h"
#include "engine/tools/flags.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

constexpr char kUsage[] =
    "usage: morserve tokenize --model DIR [--json] [--no-special] TEXT   (TEXT '-' = stdin)\n"
    "       morserve tokenize --model DIR [--json] [--skip-special] --decode 1,2,3\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "morserve tokenize: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int TokenizeCommand(const Args& args) {
  const std::set<std::string> value_flags = {"model", "decode"};
  // Flags and one positional TEXT, in any order.
  Args flag_args;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional.push_back(a);
      continue;
    }
    flag_args.push_back(a);
    if (a.find('=') == std::string::npos && value_flags.count(a.substr(2)) && i + 1 < args.size()) {
      flag_args.push_back(args[++i]);
    }
  }
  absl::StatusOr<Flags> f =
      Flags::Parse(flag_args, value_flags, {"json", "no-special", "skip-special", "help"});
  if (!f.ok()) return Fail(std::string(f.status().message()));
  if (f->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!f->Has("model")) return Fail("--model DIR is required");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(f->Get("model"));
  if (!tok.ok()) {
    std::fprintf(stderr, "morserve tokenize: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  const bool json_out = f->Has("json");
  if (f->Has("decode")) {
    if (!positional.empty()) return Fail("--decode takes no TEXT");
    std::vector<int> ids;
    for (const std::string& s : f->GetList("decode")) {
      int v;
      if (!absl::SimpleAtoi(s, &v)) return Fail("--decode: not an integer: " + s);
      ids.push_back(v);
    }
    std::string text = (*tok)->Decode(ids, f->Has("skip-special"));
    if (json_out) {
      std::printf("%s\n", nlohmann::json({{"ids", ids}, {"text", text}})
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
    } else {
      std::printf("%s\n", text.c_str());
    }
    return 0;
  }
  if (positional.size() != 1) return Fail("exactly one TEXT argument is required");
  std::string text = positional[0];
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), {});
  std::vector<int> ids = (*tok)->Encode(text, !f->Has("no-special"));
  if (json_out) {
    nlohmann::json tokens = nlohmann::json::array();
    for (int id : ids) tokens.push_back((*tok)->IdToToken(id).value_or(""));
    std::printf("%s\n", nlohmann::json({{"ids", ids}, {"tokens", tokens}, {"count", ids.size()}})
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                            .c_str());
  } else {
    std::printf("%s\n", absl::StrJoin(ids, ",").c_str());
  }
  return 0;
}

}  // namespace morserve
