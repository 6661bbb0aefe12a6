// Status and Result<T>: how errors a user can cause (bad file, bad request, unsupported model)
// travel up to the caller. A Status is ok or carries a message that names the file/field and what
// was expected. Broken invariants are CHECKs (check.h), not Statuses. Value types; thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "util/check.h"

namespace ember {

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !message_.has_value(); }
  const std::string& message() const {
    static const std::string kOk = "ok";
    return message_ ? *message_ : kOk;
  }
  // Returns a copy whose message is "context: message" (no-op when ok).
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(context + ": " + *message_);
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT
    CHECK(!std::get<Status>(data_).ok()) << "Result constructed from an ok Status";
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(data_); }
  const std::string& message() const { return std::get<Status>(data_).message(); }

  T& value() & {
    CHECK(ok()) << "Result::value() on error: " << message();
    return std::get<T>(data_);
  }
  const T& value() const& {
    CHECK(ok()) << "Result::value() on error: " << message();
    return std::get<T>(data_);
  }
  T&& value() && {
    CHECK(ok()) << "Result::value() on error: " << message();
    return std::get<T>(std::move(data_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

namespace internal {
inline Status ToStatus(const Status& s) { return s; }
template <typename T>
Status ToStatus(const Result<T>& r) { return r.status(); }
}  // namespace internal

}  // namespace ember

// Propagates an error Status (or the Status of an error Result) to the caller.
#define EMBER_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    auto _ember_st = (expr);                         \
    if (!_ember_st.ok()) return ::ember::internal::ToStatus(_ember_st); \
  } while (0)

#define EMBER_CONCAT_INNER(a, b) a##b
#define EMBER_CONCAT(a, b) EMBER_CONCAT_INNER(a, b)
// EMBER_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its Status.
#define EMBER_ASSIGN_OR_RETURN(lhs, expr) \
  EMBER_ASSIGN_OR_RETURN_IMPL(EMBER_CONCAT(_ember_res_, __LINE__), lhs, expr)
#define EMBER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
