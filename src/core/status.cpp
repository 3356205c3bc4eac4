#include "cellm/status.h"

namespace cellm {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kInvalidProgram:
      return "InvalidProgram";
    case StatusCode::kNotSupported:
      return "NotSupported";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kOutOfResources:
      return "OutOfResources";
    case StatusCode::kInvalidState:
      return "InvalidState";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(cellm::to_string(code_)) + ": " + message_;
}

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "cellm: check failed at %s:%d: %s%s%s\n", file, line, condition,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace cellm
