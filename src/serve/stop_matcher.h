// StopStringMatcher: finds stop strings in text that arrives in arbitrary pieces (one detokenized
// token at a time) and releases only text that can no longer be part of a stop string. It holds
// back exactly the longest suffix of the pending text that is a proper prefix of some stop
// string, so a stop string split across pieces is still found and never leaks into the output.
// Invariants: stop strings are non-empty valid UTF-8; if every piece is whole UTF-8 characters,
// every released delta is too (a held suffix starts where a stop string starts: a lead byte).
// Not thread-safe: one matcher per generated sample, used by one thread at a time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ember::serve {

// Length of the longest suffix of `text` that is a proper prefix of `tag`: the text that must be
// held back because `tag` may still complete there (stop strings, tool-call and think tags).
size_t PartialTagLength(std::string_view text, std::string_view tag);

struct TextDelta {
  std::string text;      // newly released output text (may be empty)
  bool stopped = false;  // a stop string matched; `text` ends right before it
};

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  // Appends `piece`; returns the text now safe to release. After a match every call returns
  // {"", true} and the rest of the input is dropped.
  TextDelta Push(std::string_view piece);
  // End of generation: releases whatever is held back (no stop string can complete any more).
  std::string Finish();

  bool stopped() const { return stopped_; }
  // The stop string that matched ("" until one did; the earliest, the first listed on a tie).
  const std::string& matched() const { return matched_; }
  size_t num_held_bytes() const { return pending_.size(); }

 private:
  // Length of the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t HeldSuffixLength() const;

  std::vector<std::string> stop_strings_;
  std::string pending_;  // text received but not yet released
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace ember::serve
