#include "util/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace ember {

namespace {
std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}
// A whole decimal integer in int64 range.
bool ParseInt64(const std::string& v, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) return false;
  *out = x;
  return true;
}
}  // namespace

void FlagParser::Add(const std::string& names, const std::string& help, bool takes_value,
                     std::function<Status(const std::string&)> set) {
  flags_.push_back(Flag{SplitCommas(names), help, takes_value, std::move(set)});
}

void FlagParser::AddString(const std::string& names, std::string* dest, const std::string& help) {
  Add(names, help, true, [dest](const std::string& v) {
    *dest = v;
    return Status::Ok();
  });
}

void FlagParser::AddRepeated(const std::string& names, std::vector<std::string>* dest,
                             const std::string& help) {
  Add(names, help + " (repeatable)", true, [dest](const std::string& v) {
    dest->push_back(v);
    return Status::Ok();
  });
}

void FlagParser::AddInt(const std::string& names, int64_t* dest, const std::string& help) {
  std::string name = SplitCommas(names).back();
  Add(names, help, true, [dest, name](const std::string& v) {
    if (!ParseInt64(v, dest)) return Status::Error(name + ": expected an integer, got '" + v + "'");
    return Status::Ok();
  });
}

void FlagParser::AddIntList(const std::string& names, std::vector<int64_t>* dest,
                            const std::string& help) {
  std::string name = SplitCommas(names).back();
  Add(names, help, true, [dest, name](const std::string& v) {
    // (getline drops a trailing empty item, so a trailing comma is checked apart.)
    bool ok = !v.empty() && v.back() != ',';
    std::vector<int64_t> list;
    for (const std::string& item : SplitCommas(v))
      ok = ok && ParseInt64(item, &list.emplace_back());
    if (!ok) {
      return Status::Error(name + ": expected comma-separated integers, got '" + v + "'");
    }
    *dest = std::move(list);
    return Status::Ok();
  });
}

void FlagParser::AddDouble(const std::string& names, double* dest, const std::string& help) {
  std::string name = SplitCommas(names).back();
  Add(names, help, true, [dest, name](const std::string& v) {
    errno = 0;
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x))
      return Status::Error(name + ": expected a finite number, got '" + v + "'");
    *dest = x;
    return Status::Ok();
  });
}

void FlagParser::AddBool(const std::string& names, bool* dest, const std::string& help) {
  Add(names, help, false, [dest](const std::string&) {
    *dest = true;
    return Status::Ok();
  });
}

Status FlagParser::Parse(int argc, char** argv, int first, bool* help_requested) {
  *help_requested = false;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      *help_requested = true;
      continue;
    }
    std::string value;
    bool has_inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline_value = true;
      }
    }
    Flag* flag = nullptr;
    for (Flag& f : flags_)
      for (const std::string& n : f.names)
        if (n == arg) flag = &f;
    if (flag == nullptr) return Status::Error("unknown flag '" + arg + "' (see --help)");
    if (flag->takes_value && !has_inline_value) {
      if (i + 1 >= argc) return Status::Error(arg + ": missing value");
      value = argv[++i];
    }
    EMBER_RETURN_IF_ERROR(flag->set(value));
    set_.push_back(flag->names.back());
  }
  return Status::Ok();
}

bool FlagParser::WasSet(const std::string& long_name) const {
  for (const std::string& s : set_)
    if (s == long_name) return true;
  return false;
}

int FlagParser::ExitStatusAfterParse(const Status& parsed, bool help_requested) const {
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n%s\n", parsed.message().c_str(), Help().c_str());
    return 2;
  }
  if (help_requested) {
    std::printf("%s\n", Help().c_str());
    return 0;
  }
  return -1;
}

std::string FlagParser::Help() const {
  std::ostringstream out;
  out << usage_ << "\n\nflags:\n";
  for (const Flag& f : flags_) {
    std::string names;
    for (const std::string& n : f.names) names += (names.empty() ? "" : ", ") + n;
    out << "  " << names << (f.takes_value ? " VALUE" : "") << "\n      " << f.help << "\n";
  }
  return out.str();
}

}  // namespace ember
