// The bounds on one render, and the Budget that enforces them: a template may
// loop, recurse and build strings only so far before it gets a TemplateError.
// The work bound caps bytes of strings built (and list items copied) in all, so
// that quadratic string building cannot run for minutes under the size caps.
// The Budget also owns the namespaces a render creates, and empties them when
// the render ends: a namespace may hold itself ({% set ns.me = ns %}), and
// emptying them frees such cycles.
// A Budget belongs to one render on one thread. Private to src/text.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja_value.h"

namespace cellm::jinja {

struct Limits {
  size_t max_output_bytes = size_t{1} << 20;
  size_t max_string_bytes = size_t{1} << 20;  // any one string or list (in items)
  size_t max_work_bytes = size_t{1} << 30;    // strings built and items copied, in all
  size_t max_loop_iterations = 100000;        // in all loops of the render together
  int max_call_depth = 100;                   // macro calls
  int max_nesting = 100;                      // blocks inside blocks (checked when parsing)
  int max_expression_depth = 256;             // expression tree height (checked when parsing)
  // Wall-clock bound on one render. The bounds above cap what a render builds,
  // not what it reads: each of 100k loop iterations may scan a list or string
  // of 1M items (`in`, comparisons), and `unique` compares every pair. Real chat
  // templates render in milliseconds.
  int64_t max_render_milliseconds = 10000;
};

class Budget {
 public:
  explicit Budget(const Limits& limits)
      : limits_(limits),
        deadline_(std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(limits.max_render_milliseconds)) {}
  ~Budget() {
    for (const auto& ns : namespaces_) ns->attrs.clear();
  }
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  const Limits& limits() const { return limits_; }

  // A string value of `s`, charged to the work budget; too long is an error.
  Value string(std::string s) {
    check_size(s.size(), "string");
    charge(s.size());
    return Value::string(std::move(s));
  }
  // Charges building a list or a string of `n` items/bytes.
  void charge_items(size_t n, const char* what) {
    check_size(n, what);
    charge(n);
  }
  // Charges building a list or dict of `n` items. An item costs far more than a
  // byte of string (a Value copied, often a string allocated for it), so each
  // counts as kItemWorkBytes: copying a long list over and over stops about as
  // soon as building strings would, not minutes later.
  static constexpr size_t kItemWorkBytes = 64;
  void charge_list_items(size_t n, const char* what) {
    check_size(n, what);
    charge(n * kItemWorkBytes);
  }
  // A new, empty namespace object, owned until the render ends.
  Value new_namespace() {
    charge_items(1, "namespace");
    namespaces_.push_back(std::make_shared<NamespaceData>());
    return Value::namespace_object(namespaces_.back());
  }
  void iteration() {
    if (++iterations_ > limits_.max_loop_iterations) {
      throw TemplateError("template exceeded " + std::to_string(limits_.max_loop_iterations) +
                          " loop iterations");
    }
    check_time();
  }
  // Throws once the render has run past its time bound.
  void check_time() const {
    if (std::chrono::steady_clock::now() > deadline_) {
      throw TemplateError("template exceeded its time budget (" +
                          std::to_string(limits_.max_render_milliseconds) + " ms)");
    }
  }

 private:
  void check_size(size_t n, const char* what) const {
    if (n > limits_.max_string_bytes) {
      throw TemplateError(std::string(what) + " longer than " +
                          std::to_string(limits_.max_string_bytes));
    }
  }
  void charge(size_t n) {
    check_time();
    work_ += n;
    if (work_ > limits_.max_work_bytes) {
      throw TemplateError("template exceeded its work budget (" +
                          std::to_string(limits_.max_work_bytes) + " bytes built)");
    }
  }

  Limits limits_;
  std::chrono::steady_clock::time_point deadline_;
  size_t iterations_ = 0;
  size_t work_ = 0;
  std::vector<std::shared_ptr<NamespaceData>> namespaces_;
};

}  // namespace cellm::jinja
