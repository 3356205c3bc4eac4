// JobGroup: the jobs of one batched request (a /v1/completions prompt list) run at
// once. Each job runs on its own thread; their deltas reach one JobSink on the
// calling thread, with the choice index of job k's choice i made k * n + i, in
// the order they were produced. When the sink reports the client gone, every job
// is cancelled within a step.
#pragma once

#include <memory>
#include <vector>

#include "serve/http.h"

namespace cellm::cli {

// Runs every job to its end and returns their summaries, in job order. A single job
// runs on the calling thread.
std::vector<JobSummary> run_job_group(const std::vector<std::shared_ptr<Job>>& jobs, int32_t n,
                                      JobSink& sink);

// The usage of a whole batch: the sums of its jobs' counts.
JobSummary sum_summaries(const std::vector<JobSummary>& summaries);

}  // namespace cellm::cli
