// The process-wide switch of programmatic dependent launch (kernels/launch.cuh says what
// it does): a host-only header for the executor, tests and benchmarks that turn it off
// to measure what it buys.
#pragma once

namespace cellm::cuda {

// Whether cellm's kernels are launched with programmatic dependent launch (default
// true; honoured only on devices of compute capability 9.0 or newer). Thread-safe.
void set_programmatic_launch(bool enabled);
bool programmatic_launch_enabled();

}  // namespace cellm::cuda
