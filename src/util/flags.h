// FlagParser: the command-line parser every `ember` subcommand uses. Flags are declared with a
// destination and help text; parsing rejects unknown flags, missing values and malformed numbers
// with a one-line message naming the flag. Not thread-safe (use from main only).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/status.h"

namespace ember {

class FlagParser {
 public:
  explicit FlagParser(std::string usage) : usage_(std::move(usage)) {}

  // `names` is "--long" or "-s,--long". Destinations keep their value when the flag is absent.
  void AddString(const std::string& names, std::string* dest, const std::string& help);
  void AddInt(const std::string& names, int64_t* dest, const std::string& help);
  // A comma-separated list of integers ("1,4,16"); a given flag replaces the whole list.
  void AddIntList(const std::string& names, std::vector<int64_t>* dest, const std::string& help);
  // A repeatable flag: each occurrence appends its value ("--lora a=DIR --lora b=DIR").
  void AddRepeated(const std::string& names, std::vector<std::string>* dest,
                   const std::string& help);
  void AddDouble(const std::string& names, double* dest, const std::string& help);
  void AddBool(const std::string& names, bool* dest, const std::string& help);  // no value

  // Parses argv[first..argc). Sets *help_requested when -h/--help is present.
  Status Parse(int argc, char** argv, int first, bool* help_requested);
  // Names of the flags that were given on the command line (as declared, long form).
  bool WasSet(const std::string& long_name) const;
  std::string Help() const;
  // For a program's main after Parse: -1 to go on; otherwise the exit status, after printing the
  // help on stdout (--help: 0) or the parse error and the help on stderr (2).
  int ExitStatusAfterParse(const Status& parsed, bool help_requested) const;

 private:
  struct Flag {
    std::vector<std::string> names;
    std::string help;
    bool takes_value = true;
    std::function<Status(const std::string&)> set;
  };
  void Add(const std::string& names, const std::string& help, bool takes_value,
           std::function<Status(const std::string&)> set);
  std::string usage_;
  std::vector<Flag> flags_;
  std::vector<std::string> set_;
};

}  // namespace ember
