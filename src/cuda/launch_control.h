// The process-wide switch of programmatic dependent launch and the per-thread choice of
// early triggers (kernels/launch.cuh says what they do): a host-only header for the executor, tests
// and benchmarks that turn it off to measure what it buys.
#pragma once

namespace cellm::cuda {

// Whether cellm's kernels are launched with programmatic dependent launch (default
// true; honoured only on devices of compute capability 9.0 or newer). Thread-safe.
void set_programmatic_launch(bool enabled);
bool programmatic_launch_enabled();

// Whether the small kernels and the attention launched by this thread let the next kernel
// launch before their own wait (kernels/launch.cuh; default false). Per thread, so an
// executor can capture a decode graph both ways while another thread launches.
void set_early_triggers(bool early);

}  // namespace cellm::cuda
