// CHECK macros for invariants that only a bug can break (not for user errors: see status.h).
// A failed CHECK prints file:line, the condition and any streamed message, then aborts.
// Thread-safe.
#pragma once

#include <sstream>
#include <string>

namespace ember::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `CHECK(x) << msg` compile as a void expression in both branches of ?:.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace ember::internal

#define CHECK(cond)          \
  (cond) ? (void)0           \
         : ::ember::internal::Voidify() & ::ember::internal::CheckFailure(__FILE__, __LINE__, #cond)
#define CHECK_EQ(a, b) CHECK((a) == (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_NE(a, b) CHECK((a) != (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_LT(a, b) CHECK((a) < (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_LE(a, b) CHECK((a) <= (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_GT(a, b) CHECK((a) > (b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_GE(a, b) CHECK((a) >= (b)) << "(" << (a) << " vs " << (b) << ") "
