// Official MoR run config -> recursion object (see mor_yaml.h). yaml-cpp throws; every call
// into it stays inside this file behind a catch, so callers see absl::Status only.
#include "engine/convert/mor_yaml.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

// True when `v` is a whole number in [lo, hi], checked before any cast to int (a cast of a
// value out of int's range, 1e300 or NaN, is undefined; found by tests/fuzz/mor_yaml_fuzz.cc).
bool IsIntegerIn(double v, double lo, double hi) { return v >= lo && v <= hi && v == std::floor(v); }

using nlohmann::json;

// One mapping of the run config (`path` like "mor.expert"). Reads keys by name, remembers
// which it read, and reports the rest as unknown.
class Section {
 public:
  Section(const std::string& file, std::string path, YAML::Node node)
      : file_(file), path_(std::move(path)), node_(std::move(node)) {}

  bool present() const { return node_.IsDefined() && !node_.IsNull(); }
  std::string Where(const std::string& key) const { return absl::StrCat(file_, ": ", path_, ".", key); }
  absl::Status Error(const std::string& key, const std::string& problem) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(key), ": ", problem));
  }
  absl::Status CheckMapping() const {
    if (!present() || node_.IsMap()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", path_, ": must be a mapping"));
  }
  // The node of `key` (undefined/null when absent); marks it known.
  YAML::Node Get(const std::string& key) {
    known_.insert(key);
    const YAML::Node& n = node_;  // const lookup: never inserts the key
    return present() && n.IsMap() ? n[key] : YAML::Node();
  }
  Section Sub(const std::string& key) {
    return Section(file_, path_.empty() ? key : absl::StrCat(path_, ".", key), Get(key));
  }
  void Ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) known_.insert(k);
  }
  void IgnoreAll() { ignore_all_ = true; }

  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) {
    YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return fallback;
    bool v;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) return Error(key, "must be true or false");
    return v;
  }
  absl::StatusOr<std::optional<double>> Number(const std::string& key) {
    YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return std::optional<double>();
    double v;
    if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v)) {
      return Error(key, absl::StrCat("must be a number, got '", Dump(n), "'"));
    }
    return std::optional<double>(v);
  }
  absl::StatusOr<std::optional<std::string>> String(const std::string& key) {
    YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return std::optional<std::string>();
    if (!n.IsScalar()) return Error(key, "must be a string");
    return std::optional<std::string>(n.Scalar());
  }
  // A string that must be one of `allowed`; absent/null gives `fallback` (empty: required).
  absl::StatusOr<std::string> Choice(const std::string& key, const std::vector<std::string>& allowed,
                                     const std::string& fallback) {
    auto v = String(key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) {
      if (fallback.empty()) return Error(key, absl::StrCat("missing (one of ", absl::StrJoin(allowed, ", "), ")"));
      return fallback;
    }
    for (const std::string& a : allowed) {
      if (**v == a) return a;
    }
    return Error(key, absl::StrCat("'", **v, "' is not a value this server can serve (known: ",
                                   absl::StrJoin(allowed, ", "), ")"));
  }
  absl::Status CheckUnknown() const {
    if (ignore_all_ || !present() || !node_.IsMap()) return absl::OkStatus();
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      const std::string key = it->first.Scalar();
      if (!known_.count(key)) {
        return Error(key, absl::StrCat("unknown key (known: ", absl::StrJoin(known_, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

  static std::string Dump(const YAML::Node& n) {
    std::stringstream ss;
    ss << n;
    return ss.str();
  }

 private:
  std::string file_;
  std::string path_;
  YAML::Node node_;
  std::set<std::string> known_;
  bool ignore_all_ = false;
};

#define MORSERVE_ASSIGN(lhs, expr)      \
  auto lhs##_or = (expr);               \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *lhs##_or

absl::StatusOr<json> RecursiveSection(Section& rec, bool* enabled) {
  if (auto s = rec.CheckMapping(); !s.ok()) return s;
  MORSERVE_ASSIGN(enable, rec.Bool("enable", false));
  *enabled = enable;
  rec.Ignore({"ln_share", "initialization", "base_depth"});
  if (!enable) {
    rec.IgnoreAll();
    return json();
  }
  MORSERVE_ASSIGN(nr, rec.Number("num_recursion"));
  if (!nr.has_value()) return rec.Error("num_recursion", "missing");
  if (!IsIntegerIn(*nr, 2, 1 << 20)) {
    return rec.Error("num_recursion",
                     absl::StrCat("must be an integer >= 2, got ", *nr,
                                  " (num_recursion 1 with base_depth, which drops layers, is not "
                                  "a looped model this server serves)"));
  }
  MORSERVE_ASSIGN(sharing, rec.Choice("sharing", {"cycle", "sequence", "middle_cycle", "middle_sequence"}, ""));
  return json{{"num_recursions", static_cast<int>(*nr)}, {"sharing", sharing}, {"routing", "none"}};
}

absl::Status KvSharingSection(Section& kv, bool recursive, json* rec) {
  if (auto s = kv.CheckMapping(); !s.ok()) return s;
  MORSERVE_ASSIGN(enable, kv.Bool("enable", false));
  // The training code overwrites num_recursion and sharing with recursive's when both are on.
  kv.Ignore({"base_depth", "num_recursion", "sharing"});
  if (!enable) {
    kv.IgnoreAll();
    return absl::OkStatus();
  }
  if (!recursive) return kv.Error("enable", "KV sharing without recursive.enable is not supported");
  MORSERVE_ASSIGN(update, kv.Bool("update_cache", false));
  if (update) return kv.Error("update_cache", "true is not supported (only loop 1 writes K/V here)");
  (*rec)["kv"] = "shared";
  return absl::OkStatus();
}

absl::Status RelaxationSection(Section& rel, bool recursive, json* rec) {
  if (auto s = rel.CheckMapping(); !s.ok()) return s;
  MORSERVE_ASSIGN(enable, rel.Bool("enable", false));
  if (!enable) {
    rel.IgnoreAll();
    return absl::OkStatus();
  }
  if (!recursive) return rel.Error("enable", "relaxation needs recursive.enable");
  MORSERVE_ASSIGN(method, rel.Choice("method", {"lora"}, "lora"));
  MORSERVE_ASSIGN(skip_first, rel.Bool("skip_first_loop", false));
  if (skip_first) return rel.Error("skip_first_loop", "true is not supported (LoRA on every loop)");
  rel.Ignore({"prompt"});
  Section lora = rel.Sub("lora");
  if (auto s = lora.CheckMapping(); !s.ok()) return s;
  lora.Ignore({"dropout", "svd_init"});
  MORSERVE_ASSIGN(r, lora.Number("r"));
  if (!r.has_value() || !IsIntegerIn(*r, 1, 1 << 20)) {
    return lora.Error("r", "must be an integer >= 1");
  }
  if (lora.Get("rank_pattern").IsDefined() && !lora.Get("rank_pattern").IsNull()) {
    return lora.Error("rank_pattern", "per-module ranks are not supported (one rank per model)");
  }
  MORSERVE_ASSIGN(alpha, lora.Number("alpha"));
  MORSERVE_ASSIGN(pattern, lora.Number("alpha_pattern"));
  double a = alpha.value_or(*r);
  if (pattern.has_value()) a = *r * *pattern;  // the training code sets alpha = r * alpha_pattern
  json targets = json::array();
  YAML::Node t = lora.Get("target_modules");
  if (t.IsDefined() && !t.IsNull()) {
    if (!t.IsSequence()) return lora.Error("target_modules", "must be a list of projection names");
    for (const YAML::Node& n : t) targets.push_back(n.Scalar());
  } else {
    targets = {"q_proj", "v_proj"};  // the training code's default
  }
  (*rec)["lora"] = {{"rank", static_cast<int>(*r)}, {"alpha", a}, {"targets", targets}};
  return lora.CheckUnknown();
}

// "1.0,0.667,0.333" (as the training code stores it), a YAML list, or one number.
absl::StatusOr<json> Capacity(Section& mor, int nr) {
  YAML::Node n = mor.Get("capacity");
  if (!n.IsDefined() || n.IsNull()) return json();
  std::vector<std::string> parts;
  if (n.IsSequence()) {
    for (const YAML::Node& v : n) parts.push_back(v.Scalar());
  } else if (n.IsScalar()) {
    parts = absl::StrSplit(n.Scalar(), ',', absl::SkipWhitespace());
  }
  json cap = json::array();
  for (const std::string& p : parts) {
    double v;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(p), &v) || !(v > 0)) {
      return mor.Error("capacity", absl::StrCat("'", p, "' is not a fraction > 0"));
    }
    cap.push_back(v);
  }
  if (static_cast<int>(cap.size()) != nr) {
    return mor.Error("capacity", absl::StrCat("lists ", cap.size(), " fractions; recursive.num_recursion is ", nr));
  }
  return cap;
}

absl::Status MorSection(Section& mor, bool recursive, json* rec) {
  if (auto s = mor.CheckMapping(); !s.ok()) return s;
  MORSERVE_ASSIGN(enable, mor.Bool("enable", false));
  if (!enable) {
    mor.IgnoreAll();
    return absl::OkStatus();
  }
  if (!recursive) return mor.Error("enable", "MoR needs recursive.enable");
  mor.Ignore({"z_loss", "z_coeff"});
  MORSERVE_ASSIGN(type, mor.Choice("type", {"expert", "token"}, ""));
  MORSERVE_ASSIGN(rand, mor.Bool("rand_router", false));
  if (rand) return mor.Error("rand_router", "true (a random router) cannot be served");
  MORSERVE_ASSIGN(arch, mor.Choice("router_type", {"linear", "mlp"}, "linear"));
  MORSERVE_ASSIGN(temp, mor.Number("temp"));
  const int nr = (*rec)["num_recursions"].get<int>();
  MORSERVE_ASSIGN(capacity, Capacity(mor, nr));
  json router = {{"arch", arch}, {"temperature", temp.value_or(1.0)}};
  Section expert = mor.Sub("expert");
  Section token = mor.Sub("token");
  Section& used = type == "expert" ? expert : token;
  (type == "expert" ? token : expert).IgnoreAll();
  if (auto s = used.CheckMapping(); !s.ok()) return s;
  used.Ignore({"coeff", "cap_warmup_step", "bal_warmup_step", "u"});
  if (type == "expert") {
    (*rec)["routing"] = "expert_choice";
    MORSERVE_ASSIGN(func, used.Choice("router_func", {"sigmoid", "tanh"}, ""));
    MORSERVE_ASSIGN(sampling, used.Choice("sampling", {"aux_loss", "aux_router"}, "aux_loss"));
    MORSERVE_ASSIGN(include_first, used.Bool("include_first", true));
    if (!include_first) return used.Error("include_first", "false is not supported");
    router["activation"] = func;
    router["aux_router"] = sampling == "aux_router";
    if (!capacity.is_null()) router["capacity"] = capacity;
  } else {
    (*rec)["routing"] = "token_choice";
    MORSERVE_ASSIGN(func, used.Choice("router_func", {"softmax", "sigmoid"}, ""));
    // loss_free balancing trains a router_bias tensor, which the loader reads when present.
    MORSERVE_ASSIGN(balancing, used.Choice("balancing", {"loss", "loss_free"}, "loss"));
    (void)balancing;
    router["activation"] = func;
  }
  MORSERVE_ASSIGN(alpha, used.Number("alpha"));
  router["alpha"] = alpha.value_or(1.0);
  MORSERVE_ASSIGN(gating, used.Choice("gating", {"weighted", "additive"}, "weighted"));
  router["gating"] = gating;
  (*rec)["router"] = router;
  if (auto s = used.CheckUnknown(); !s.ok()) return s;
  return absl::OkStatus();
}

absl::StatusOr<json> Map(const YAML::Node& root, const std::string& file) {
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(file, ": not a YAML mapping"));
  Section top(file, "", root);
  Section rec_s = top.Sub("recursive");
  Section kv_s = top.Sub("kv_sharing");
  Section rel_s = top.Sub("relaxation");
  Section mor_s = top.Sub("mor");
  bool recursive = false;
  MORSERVE_ASSIGN(rec, RecursiveSection(rec_s, &recursive));
  json scratch = json::object();
  json* target = recursive ? &rec : &scratch;
  if (auto s = KvSharingSection(kv_s, recursive, target); !s.ok()) return s;
  if (auto s = RelaxationSection(rel_s, recursive, target); !s.ok()) return s;
  if (auto s = MorSection(mor_s, recursive, target); !s.ok()) return s;
  for (Section* s : {&rec_s, &kv_s, &rel_s, &mor_s}) {
    if (auto st = s->CheckUnknown(); !st.ok()) return st;
  }
  return rec;
}

}  // namespace

absl::StatusOr<json> MorRunConfigToRecursion(const std::string& yaml_text, const std::string& file) {
  // YAML is Unicode text; yaml-cpp does not check, and strings go on into JSON (config.json).
  if (!IsValidUtf8(yaml_text)) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not valid YAML: not UTF-8 text"));
  }
  try {
    return Map(YAML::Load(yaml_text), file);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not valid YAML: ", e.what()));
  }
}

absl::StatusOr<json> LoadMorRunConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return MorRunConfigToRecursion(ss.str(), path);
}

}  // namespace morserve
