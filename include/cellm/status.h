// Status and Result<T>: errors as values at module boundaries, plus the check
// macros that turn broken invariants (bugs) into an abort naming file:line.
//
// A Status is either ok or a code with a message that names what is wrong.
// Result<T> holds either a T or a non-ok Status. Neither throws.
// Thread-safety: plain values; safe to copy between threads.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace cellm {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // the caller passed something unusable
  kInvalidProgram,   // the model/program is malformed or unsupported in shape
  kNotSupported,     // a valid request this build or model cannot serve
  kNotFound,         // a named file, tensor or entity does not exist
  kOutOfResources,   // a budget or pool is exhausted
  kInvalidState,     // the call does not fit the object's current state
  kIoError,          // reading or writing a file failed
  kInternal,         // a failure of a dependency (CUDA, BLAS) or an unexpected path
};

const char* to_string(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: <message>", or "OK".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status InvalidProgram(std::string m) {
  return {StatusCode::kInvalidProgram, std::move(m)};
}
inline Status NotSupported(std::string m) {
  return {StatusCode::kNotSupported, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status OutOfResources(std::string m) {
  return {StatusCode::kOutOfResources, std::move(m)};
}
inline Status InvalidState(std::string m) {
  return {StatusCode::kInvalidState, std::move(m)};
}
inline Status IoError(std::string m) {
  return {StatusCode::kIoError, std::move(m)};
}
inline Status Internal(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);

// Result<T>: a T or a non-ok Status. Constructing from an ok Status is a bug.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) {
      check_failed(__FILE__, __LINE__, "!status.ok()", "Result built from an ok Status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }

 private:
  T& checked() {
    if (!ok()) check_failed(__FILE__, __LINE__, "ok()", "value() of " + status().to_string());
    return std::get<T>(v_);
  }
  std::variant<T, Status> v_;
};

}  // namespace cellm

#define CELLM_CONCAT_INNER_(a, b) a##b
#define CELLM_CONCAT_(a, b) CELLM_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not ok.
#define CELLM_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::cellm::Status cellm_status_ = (expr);        \
    if (!cellm_status_.ok()) return cellm_status_; \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define CELLM_ASSIGN_OR_RETURN(lhs, expr) \
  CELLM_ASSIGN_OR_RETURN_IMPL_(CELLM_CONCAT_(cellm_result_, __LINE__), lhs, expr)
#define CELLM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// A broken invariant is a bug: abort with file:line, the condition and a message.
#define CELLM_CHECK(cond) \
  ((cond) ? (void)0 : ::cellm::check_failed(__FILE__, __LINE__, #cond, std::string()))
#define CELLM_CHECK_MSG(cond, msg) \
  ((cond) ? (void)0 : ::cellm::check_failed(__FILE__, __LINE__, #cond, (msg)))
