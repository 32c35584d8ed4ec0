// Flag parsing (see flags.h).
#include "engine/tools/flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace morserve {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args,
                                   const std::set<std::string>& value_flags,
                                   const std::set<std::string>& switches) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
    name = name.substr(2);
    if (switches.count(name) && !inline_value) {
      f.values_[name] = "1";
      continue;
    }
    if (!value_flags.count(name)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!inline_value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    f.values_[name] = value;
  }
  return f;
}

std::string Flags::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int> Flags::GetInt(const std::string& name, int fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": not an integer: ", it->second));
  }
  return v;
}

absl::StatusOr<double> Flags::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": not a number: ", it->second));
  }
  return v;
}

std::vector<std::string> Flags::GetList(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) return {};
  return absl::StrSplit(it->second, ',');
}

}  // namespace morserve
