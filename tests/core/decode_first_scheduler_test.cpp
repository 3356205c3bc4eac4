#include "cellm/decode_first_scheduler.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/scheduler_tasks.h"

namespace cellm {
namespace {

using test::AllCancelled;
using test::Backing;
using test::Chunk;
using test::Decode;
using test::Ids;
using test::Make;
using test::TaskIds;

constexpr SessionId kA = 1;
constexpr SessionId kB = 2;
constexpr SessionId kC = 3;
constexpr SessionId kD = 4;

bool Submit(DecodeFirstScheduler& scheduler, std::vector<Task> tasks) {
  const bool accepted = scheduler.submit(std::move(tasks));
  scheduler.check_invariants();
  return accepted;
}

std::vector<Task> Work(DecodeFirstScheduler& scheduler) {
  std::vector<Task> batch = scheduler.get_work();
  scheduler.check_invariants();
  return batch;
}

TaskIds Next(DecodeFirstScheduler& scheduler) {
  return Ids(Work(scheduler));
}

std::vector<Task> Cancel(DecodeFirstScheduler& scheduler, SessionId sid) {
  std::vector<Task> cancelled = scheduler.cancel(sid);
  scheduler.check_invariants();
  return cancelled;
}

bool Mentions(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

// ---- Creation ----

TEST(CreateTest, Defaults) {
  auto created = DecodeFirstScheduler::create();
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  EXPECT_EQ((*created)->max_batch_tokens(), 544u);
  EXPECT_EQ((*created)->max_decode_sequences(), 32u);
  EXPECT_EQ((*created)->max_prefill_chunk_size(), 256u);
  (*created)->check_invariants();
}

TEST(CreateTest, RejectsZeroLimits) {
  for (auto [b, d, c] :
       {std::tuple<size_t, size_t, size_t>{0, 32, 256}, {544, 0, 256}, {544, 32, 0}, {0, 0, 0}}) {
    auto created = DecodeFirstScheduler::create(b, d, c);
    ASSERT_FALSE(created.ok()) << b << "/" << d << "/" << c;
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(created.status(), "max_batch_tokens=" + std::to_string(b)));
    EXPECT_TRUE(Mentions(created.status(), "max_decode_sequences=" + std::to_string(d)));
    EXPECT_TRUE(Mentions(created.status(), "max_prefill_chunk_size=" + std::to_string(c)));
  }
}

TEST(CreateTest, RequiresRoomForDecodesPlusAFullChunk) {
  EXPECT_TRUE(DecodeFirstScheduler::create(288, 32, 256).ok());
  auto refused = DecodeFirstScheduler::create(287, 32, 256);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(refused.status(), "287"));
  EXPECT_TRUE(Mentions(refused.status(), "32"));
  EXPECT_TRUE(Mentions(refused.status(), "256"));
  EXPECT_TRUE(Mentions(refused.status(), "255"));  // the room that is left
}

TEST(CreateTest, RejectsDecodeCapThatLeavesNoRoomForPrefill) {
  for (auto [b, d] : {std::pair<size_t, size_t>{32, 32}, {16, 32}, {1, 1}}) {
    auto refused = DecodeFirstScheduler::create(b, d, 1);
    ASSERT_FALSE(refused.ok()) << b << "/" << d;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(refused.status(), "max_decode_sequences " + std::to_string(d)));
  }
  EXPECT_TRUE(DecodeFirstScheduler::create(33, 32, 1).ok());
}

TEST(CreateTest, RejectsChunkLargerThanTheBudget) {
  auto refused = DecodeFirstScheduler::create(100, 4, 101);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Mentions(refused.status(), "101"));
  EXPECT_FALSE(DecodeFirstScheduler::create(100, 4, 97).ok());
  EXPECT_TRUE(DecodeFirstScheduler::create(100, 4, 96).ok());

  // A huge budget is fine, and spending never wraps.
  const size_t huge = std::numeric_limits<size_t>::max();
  auto scheduler = Make(huge, 32, 256);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 256), Chunk(2, kA, 256), Decode(3, kB)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 1, 2}));
}

// ---- Classification and submit ----

TEST(ClassificationTest, OneTokenPrefillIsNotADecode) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 1)}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(2, kB)}));
  std::vector<Task> batch = Work(*scheduler);
  ASSERT_EQ(Ids(batch), (TaskIds{2, 1}));  // the real decode is taken first
  EXPECT_TRUE(batch[0].is_decode);
  EXPECT_FALSE(batch[1].is_decode);
  EXPECT_EQ(batch[1].input.size, 1u);
}

TEST(ClassificationTest, RejectsDecodeWiderThanOneToken) {
  auto scheduler = Make();
  EXPECT_FALSE(Submit(*scheduler, {Decode(1, kA, 2)}));
  EXPECT_FALSE(Submit(*scheduler, {Decode(1, kA, 0)}));
  EXPECT_EQ(scheduler->num_queued(), 0u);
  EXPECT_TRUE(Submit(*scheduler, {Decode(1, kA, 1)}));
  EXPECT_EQ(scheduler->num_queued(), 1u);
}

TEST(SubmitTest, RejectsEmptyStep) {
  auto scheduler = Make();
  EXPECT_FALSE(Submit(*scheduler, {Chunk(1, kA, 0)}));
  EXPECT_FALSE(scheduler->has_work());
  EXPECT_TRUE(Next(*scheduler).empty());
}

TEST(SubmitTest, RejectsPrefillAboveChunkSize) {
  auto scheduler = Make();
  EXPECT_FALSE(Submit(*scheduler, {Chunk(1, kA, 257)}));
  EXPECT_EQ(scheduler->num_queued(), 0u);
  EXPECT_TRUE(Submit(*scheduler, {Chunk(1, kA, 256)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
}

TEST(SubmitTest, RejectsTaskAlreadyMarkedCancelled) {
  auto scheduler = Make();
  Task cancelled = Chunk(1, kA, 4);
  cancelled.cancelled = true;
  EXPECT_FALSE(Submit(*scheduler, {Chunk(2, kA, 4), std::move(cancelled)}));
  EXPECT_EQ(scheduler->num_queued(), 0u);
}

TEST(SubmitTest, RejectsDuplicateTaskIdAlreadyWaiting) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8)}));
  EXPECT_FALSE(Submit(*scheduler, {Chunk(1, kB, 8)}));
  EXPECT_FALSE(Submit(*scheduler, {Decode(1, kC)}));
  EXPECT_EQ(scheduler->num_queued(), 1u);
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
}

TEST(SubmitTest, RejectsTaskIdRepeatedWithinOneSubmit) {
  auto scheduler = Make();
  EXPECT_FALSE(Submit(*scheduler, {Chunk(1, kA, 8), Chunk(1, kA, 8)}));
  EXPECT_FALSE(Submit(*scheduler, {Chunk(1, kA, 8), Decode(1, kB)}));
  EXPECT_EQ(scheduler->num_queued(), 0u);
  EXPECT_FALSE(scheduler->has_work());
}

TEST(SubmitTest, RejectedGroupEntersNoQueue) {
  auto scheduler = Make();
  // The bad task comes last, after a decode and chunks that alone are fine.
  EXPECT_FALSE(
      Submit(*scheduler, {Decode(1, kC), Chunk(2, kA, 8), Chunk(3, kA, 8), Chunk(4, kA, 0)}));
  EXPECT_EQ(scheduler->num_queued(), 0u);
  EXPECT_TRUE(Next(*scheduler).empty());
  // Session A got no rotation slot: B, submitted first now, is served first.
  ASSERT_TRUE(Submit(*scheduler, {Chunk(5, kB, 8)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(2, kA, 8)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{5, 2}));
}

TEST(SubmitTest, DuplicatePendingIdRejectsTheWholeGroup) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(5, kA, 8)}));
  EXPECT_FALSE(Submit(*scheduler, {Chunk(6, kB, 8), Decode(7, kC), Chunk(5, kB, 8)}));
  EXPECT_EQ(scheduler->num_queued(), 1u);
  EXPECT_EQ(Next(*scheduler), (TaskIds{5}));
  EXPECT_TRUE(Submit(*scheduler, {Chunk(6, kB, 8), Decode(7, kC)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{7, 6}));
}

TEST(SubmitTest, DispatchFreesTheTaskIdForReuse) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Decode(1, kA)}));
  EXPECT_FALSE(Submit(*scheduler, {Decode(1, kB)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
  EXPECT_TRUE(Submit(*scheduler, {Decode(1, kB)}));
  std::vector<Task> batch = Work(*scheduler);
  ASSERT_EQ(Ids(batch), (TaskIds{1}));
  EXPECT_EQ(batch[0].input.sid, kB);
}

TEST(SubmitTest, CancelFreesTheTaskIdForReuse) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8)}));
  EXPECT_FALSE(Submit(*scheduler, {Chunk(1, kB, 8)}));
  EXPECT_EQ(Ids(Cancel(*scheduler, kA)), (TaskIds{1}));
  EXPECT_TRUE(Submit(*scheduler, {Chunk(1, kB, 8)}));
  std::vector<Task> batch = Work(*scheduler);
  ASSERT_EQ(Ids(batch), (TaskIds{1}));
  EXPECT_EQ(batch[0].input.sid, kB);
}

TEST(PayloadTest, CarriesPayloadUninspected) {
  auto scheduler = Make();
  auto tokens = std::make_shared<const std::vector<Token>>(std::vector<Token>{7, 8, 9, 10, 11});
  Task chunk;
  chunk.tid = 1;
  chunk.input.sid = kA;
  chunk.input.tokens = tokens;
  chunk.input.offset = 3;
  chunk.input.size = 2;
  chunk.input.position = 1000;
  chunk.input.produce_output = true;
  // The scheduler reads only the size: a slice past its backing and a missing
  // backing are the caller's business.
  Task past_the_end = Chunk(2, kB, 4);
  past_the_end.input.offset = 100;
  Task no_backing = Decode(3, kC);
  no_backing.input.tokens = nullptr;
  no_backing.input.position = -5;
  ASSERT_TRUE(Submit(*scheduler, {chunk, past_the_end, no_backing}));

  std::vector<Task> batch = Work(*scheduler);
  ASSERT_EQ(Ids(batch), (TaskIds{3, 1, 2}));
  EXPECT_EQ(batch[0].input.tokens, nullptr);
  EXPECT_EQ(batch[0].input.position, -5);
  EXPECT_EQ(batch[1].input.tokens.get(), tokens.get());  // the same buffer, not a copy
  EXPECT_EQ(batch[1].input.sid, kA);
  EXPECT_EQ(batch[1].input.offset, 3u);
  EXPECT_EQ(batch[1].input.size, 2u);
  EXPECT_EQ(batch[1].input.position, 1000);
  EXPECT_TRUE(batch[1].input.produce_output);
  EXPECT_EQ(batch[1].input.token(0), 10);
  EXPECT_EQ(batch[1].input.start(), 1003);
  EXPECT_EQ(batch[2].input.offset, 100u);
  for (const Task& task : batch) EXPECT_FALSE(task.cancelled);
}

TEST(PayloadTest, BatchInputKeepsTaskOrderAndSlices) {
  auto scheduler = Make();
  auto prompt = Backing(30);
  std::vector<Task> chunks;
  for (TaskId i = 0; i < 3; ++i) {
    Task task = Chunk(10 + i, kA, 10, i == 2);
    task.input.tokens = prompt;
    task.input.offset = static_cast<size_t>(i) * 10;
    task.input.position = 50;
    chunks.push_back(std::move(task));
  }
  ASSERT_TRUE(Submit(*scheduler, {Chunk(20, kB, 5)}));
  ASSERT_TRUE(Submit(*scheduler, std::move(chunks)));
  ASSERT_TRUE(Submit(*scheduler, {Decode(30, kC)}));

  std::vector<Task> batch = Work(*scheduler);
  ASSERT_EQ(Ids(batch), (TaskIds{30, 20, 10, 11, 12}));
  BatchInput input = to_batch_input(batch);
  ASSERT_EQ(input.inputs.size(), 5u);
  EXPECT_EQ(input.size(), 1u + 5u + 30u);
  EXPECT_EQ(input.inputs[0].sid, kC);
  EXPECT_EQ(input.inputs[1].sid, kB);
  for (size_t i = 0; i < 3; ++i) {
    const Input& slice = input.inputs[2 + i];
    EXPECT_EQ(slice.sid, kA);
    EXPECT_EQ(slice.tokens.get(), prompt.get());
    EXPECT_EQ(slice.offset, i * 10);
    EXPECT_EQ(slice.size, 10u);
    EXPECT_EQ(slice.start(), static_cast<Position>(50 + i * 10));
    EXPECT_EQ(slice.token(0), static_cast<Token>(i * 10));
    EXPECT_EQ(slice.produce_output, i == 2);
  }
}

// ---- Decode ----

TEST(DecodeTest, ServedInArrivalOrderUpToTheCap) {
  auto scheduler = Make(64, 4, 32);
  for (TaskId tid = 1; tid <= 6; ++tid) {
    ASSERT_TRUE(Submit(*scheduler, {Decode(tid, 100 - tid)}));
  }
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 2, 3, 4}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{5, 6}));
  EXPECT_TRUE(Next(*scheduler).empty());
}

TEST(DecodeTest, StaysFifoAcrossDrainAndRefill) {
  auto scheduler = Make(64, 4, 32);
  ASSERT_TRUE(Submit(*scheduler, {Decode(1, 11), Decode(2, 12), Decode(3, 13)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 2, 3}));
  EXPECT_TRUE(Next(*scheduler).empty());
  ASSERT_TRUE(Submit(*scheduler, {Decode(4, 11), Decode(5, 12)}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(6, 13), Decode(7, 14), Decode(8, 15)}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(9, 16)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{4, 5, 6, 7}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(10, 11)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{8, 9, 10}));
}

TEST(DecodeTest, BeatsPrefillAndStillLeavesRoomForAFullChunk) {
  auto scheduler = Make();  // 544 / 32 / 256
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1000, 100, 256)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1001, 101, 256)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1002, 102, 256)}));
  TaskIds decodes;
  for (TaskId tid = 1; tid <= 33; ++tid) {
    ASSERT_TRUE(Submit(*scheduler, {Decode(tid, tid)}));
    if (tid <= 32) decodes.push_back(tid);
  }
  std::vector<Task> batch = Work(*scheduler);
  TaskIds expected = decodes;
  expected.push_back(1000);
  expected.push_back(1001);
  EXPECT_EQ(Ids(batch), expected);
  EXPECT_EQ(to_batch_input(batch).size(), 544u);
  EXPECT_EQ(Next(*scheduler), (TaskIds{33, 1002}));
}

// ---- Prefill ----

TEST(PrefillTest, SubmittedPromptChunksStayInOrder) {
  auto scheduler = Make(250, 10, 100);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(4, kA, 100), Chunk(2, kA, 100), Chunk(9, kA, 100),
                                  Chunk(1, kA, 100, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{4, 2}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{9, 1}));
}

TEST(PrefillTest, LongPromptCannotHogTheBatch) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 256), Chunk(2, kA, 256), Chunk(3, kA, 256),
                                  Chunk(4, kA, 256, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(5, kB, 10, true)}));
  // A's second chunk comes only after B had its turn; the third does not fit.
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 5, 2}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 4}));
}

TEST(PrefillTest, LoneSessionFillsTheBatchAcrossPasses) {
  auto scheduler = Make();
  std::vector<Task> chunks;
  for (TaskId tid = 1; tid <= 7; ++tid) chunks.push_back(Chunk(tid, kA, 100, tid == 7));
  ASSERT_TRUE(Submit(*scheduler, std::move(chunks)));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 2, 3, 4, 5}));  // 500 of 544
  EXPECT_EQ(Next(*scheduler), (TaskIds{6, 7}));
}

TEST(PrefillTest, StopsWhenTheNextChunkDoesNotFit) {
  auto scheduler = Make(100, 4, 96);
  // The small third chunk fits the budget left, but must not overtake the second.
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 60), Chunk(2, kA, 60), Chunk(3, kA, 10, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2, 3}));
  EXPECT_FALSE(scheduler->has_work());
}

TEST(PrefillTest, DeferredSessionOutranksOneNeverReached) {
  auto scheduler = Make(100, 4, 96);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 50), Chunk(2, kA, 50)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(3, kB, 60)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(4, kC, 50), Chunk(5, kC, 50)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(6, kD, 30)}));
  // A takes 50, B's 60 is deferred, C takes the last 50, D is never reached.
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 4}));
  // B, deferred, outranks D; A and C, served, come last and no longer fit.
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 6}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2, 5}));
}

TEST(PrefillTest, DeferredSessionsKeepTheirOrder) {
  auto scheduler = Make(100, 4, 96);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 70), Chunk(2, kA, 20)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(3, kB, 40)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(4, kC, 35)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(5, kD, 20), Chunk(6, kD, 20)}));
  // B and C are deferred (in that order), D's 20 still fits.
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 5}));
  // B before C, both before the served A; D's 20 no longer fits.
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 4, 2}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{6}));
}

TEST(PrefillTest, RotationIsFairAcrossCalls) {
  auto scheduler = Make(100, 4, 96);
  TaskId tid = 0;
  for (SessionId sid : {kA, kB, kC}) {
    std::vector<Task> chunks;
    for (int i = 0; i < 8; ++i) chunks.push_back(Chunk(++tid, sid, 50, i == 7));
    ASSERT_TRUE(Submit(*scheduler, std::move(chunks)));
  }
  std::vector<SessionId> order;
  std::map<SessionId, int> chunks_served;
  for (int call = 0; call < 9; ++call) {
    std::vector<Task> batch = Work(*scheduler);
    ASSERT_EQ(batch.size(), 2u) << "call " << call;
    for (const Task& task : batch) {
      order.push_back(task.input.sid);
      ++chunks_served[task.input.sid];
    }
  }
  EXPECT_EQ(chunks_served[kA], 6);
  EXPECT_EQ(chunks_served[kB], 6);
  EXPECT_EQ(chunks_served[kC], 6);
  EXPECT_EQ(order, (std::vector<SessionId>{kA, kB, kC, kA, kB, kC, kA, kB, kC,  //
                                           kA, kB, kC, kA, kB, kC, kA, kB, kC}));
}

TEST(PrefillTest, SessionRejoinsTheRotationAfterDraining) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
  // A drained and left; it now joins behind B.
  ASSERT_TRUE(Submit(*scheduler, {Chunk(2, kB, 8), Chunk(3, kB, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(4, kA, 8), Chunk(5, kA, 8, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2, 4, 3, 5}));
}

// ---- Batch composition ----

TEST(BatchCompositionTest, OneDecodePerSessionPerBatch) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Decode(1, kA), Decode(2, kA), Decode(3, kB)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 3}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2}));
}

TEST(BatchCompositionTest, SecondDecodeForASessionRunsInTheNextBatch) {
  auto scheduler = Make(64, 4, 32);
  ASSERT_TRUE(Submit(*scheduler,
                     {Decode(1, kA), Decode(2, kA), Decode(3, kB), Decode(4, kB), Decode(5, kC)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 3, 5}));
  // The deferred decodes went back to the head, ahead of later arrivals.
  ASSERT_TRUE(Submit(*scheduler, {Decode(6, kD)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2, 4, 6}));
}

TEST(BatchCompositionTest, PrefillWaitsWhileTheSessionHasADecode) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(2, kA)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(3, kB, 8, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2, 3}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
}

TEST(BatchCompositionTest, ConsecutivePrefillChunksMaySharePlaces) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8), Chunk(2, kA, 8), Chunk(3, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(4, kB, 8), Chunk(5, kB, 8, true)}));
  std::vector<Task> batch = Work(*scheduler);
  // One batch holds all of both prompts, interleaved, each in order.
  EXPECT_EQ(Ids(batch), (TaskIds{1, 4, 2, 5, 3}));
}

TEST(BatchCompositionTest, AtMostOneOutputPerSessionPerBatch) {
  auto scheduler = Make();
  // Two prompts queued for one session: the second waits for the next batch.
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8), Chunk(2, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(3, kA, 8), Chunk(4, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(5, kB, 8), Chunk(6, kB, 8, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 5, 2, 6}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 4}));
}

// ---- Cancel and clear ----

TEST(CancelTest, DropsEveryQueuedTaskForTheSessionAndReturnsThem) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8), Chunk(2, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(3, kA), Chunk(4, kB, 8, true)}));
  std::vector<Task> cancelled = Cancel(*scheduler, kA);
  EXPECT_EQ(Ids(cancelled), (TaskIds{1, 2, 3}));
  EXPECT_TRUE(AllCancelled(cancelled));
  for (const Task& task : cancelled) EXPECT_EQ(task.input.sid, kA);
  EXPECT_EQ(scheduler->num_queued(), 1u);
  EXPECT_EQ(Next(*scheduler), (TaskIds{4}));
  EXPECT_FALSE(scheduler->has_work());
}

TEST(CancelTest, DropsEveryQueuedDecodeForTheSession) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Decode(1, kA), Decode(2, kB), Decode(3, kA)}));
  std::vector<Task> cancelled = Cancel(*scheduler, kA);
  EXPECT_EQ(Ids(cancelled), (TaskIds{1, 3}));
  EXPECT_TRUE(AllCancelled(cancelled));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2}));
  EXPECT_TRUE(Next(*scheduler).empty());
}

TEST(CancelTest, LeavesOtherSessionsRunnable) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(2, kB, 8, true), Decode(3, kB)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(4, kC, 8, true), Decode(5, kD)}));
  EXPECT_EQ(Ids(Cancel(*scheduler, kB)), (TaskIds{2, 3}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{5, 1, 4}));
}

TEST(CancelTest, UnknownSessionIsIgnored) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8, true), Decode(2, kB)}));
  EXPECT_TRUE(Cancel(*scheduler, 99).empty());
  EXPECT_EQ(scheduler->num_queued(), 2u);
  EXPECT_EQ(Next(*scheduler), (TaskIds{2, 1}));
}

TEST(CancelTest, DoubleCancelReportsEachTaskOnce) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8, true), Decode(2, kA)}));
  EXPECT_EQ(Ids(Cancel(*scheduler, kA)), (TaskIds{1, 2}));
  EXPECT_TRUE(Cancel(*scheduler, kA).empty());
  EXPECT_FALSE(scheduler->has_work());
}

TEST(CancelTest, DispatchedTaskIsNoLongerTracked) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
  EXPECT_TRUE(Cancel(*scheduler, kA).empty());
  EXPECT_EQ(scheduler->num_queued(), 0u);
}

TEST(CancelTest, CancellingDispatchedTaskDoesNotHideQueuedWork) {
  auto scheduler = Make(100, 4, 96);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 60), Chunk(2, kA, 60, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(3, kB, 60, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1}));
  // Task 1 is in flight; its id is reused by a queued decode of A.
  ASSERT_TRUE(Submit(*scheduler, {Decode(1, kA)}));
  std::vector<Task> cancelled = Cancel(*scheduler, kA);
  EXPECT_EQ(Ids(cancelled), (TaskIds{2, 1}));
  EXPECT_TRUE(cancelled[1].is_decode);
  EXPECT_TRUE(scheduler->has_work());
  EXPECT_EQ(Next(*scheduler), (TaskIds{3}));
}

TEST(CancelTest, CancelledDecodeInTheMiddleOfTheQueue) {
  auto scheduler = Make(64, 2, 32);
  ASSERT_TRUE(Submit(*scheduler, {Decode(1, kA), Decode(2, kB), Decode(3, kC), Decode(4, kD)}));
  EXPECT_EQ(Ids(Cancel(*scheduler, kB)), (TaskIds{2}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 3}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{4}));
}

TEST(CancelTest, CancelledPrefillSessionLeavesTheRotation) {
  auto scheduler = Make(100, 4, 96);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 60, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(2, kB, 60), Chunk(3, kB, 60, true)}));
  EXPECT_EQ(Ids(Cancel(*scheduler, kA)), (TaskIds{1}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{2}));  // A's empty slot retired in this pass
  // A returns as a newcomer behind B, not in its old place ahead of B.
  ASSERT_TRUE(Submit(*scheduler, {Chunk(4, kA, 60, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{3}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{4}));
}

TEST(CancelTest, SessionRejoinsAfterAnInterveningBatch) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8), Chunk(2, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(3, kB)}));
  EXPECT_EQ(Ids(Cancel(*scheduler, kA)), (TaskIds{1, 2}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{3}));
  EXPECT_TRUE(Next(*scheduler).empty());
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8), Chunk(2, kA, 8, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{1, 2}));
}

// Regression: a session cancelled and resubmitted before any batch keeps its
// one rotation slot instead of gaining a second.
TEST(CancelTest, RejoiningAfterCancelDoesNotTakeTwoTurnsPerPass) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 10), Chunk(2, kA, 10, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(11, kB, 10), Chunk(12, kB, 10), Chunk(13, kB, 10),
                                  Chunk(14, kB, 10, true)}));
  EXPECT_EQ(Ids(Cancel(*scheduler, kA)), (TaskIds{1, 2}));
  ASSERT_TRUE(Submit(*scheduler, {Chunk(21, kA, 10), Chunk(22, kA, 10), Chunk(23, kA, 10),
                                  Chunk(24, kA, 10, true)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{21, 11, 22, 12, 23, 13, 24, 14}));
}

TEST(ClearTest, ReturnsAndRemovesAllQueuedTasks) {
  auto scheduler = Make();
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 8), Chunk(2, kA, 8, true)}));
  ASSERT_TRUE(Submit(*scheduler, {Decode(3, kB), Decode(4, kB), Chunk(5, kC, 8, true)}));
  std::vector<Task> cleared = scheduler->clear();
  scheduler->check_invariants();
  EXPECT_EQ(Ids(cleared), (TaskIds{3, 4, 1, 2, 5}));
  EXPECT_TRUE(AllCancelled(cleared));
  EXPECT_EQ(scheduler->num_queued(), 0u);
  EXPECT_FALSE(scheduler->has_work());
  EXPECT_TRUE(Next(*scheduler).empty());
  EXPECT_TRUE(scheduler->clear().empty());
  // Every id is free again, and sessions start afresh.
  ASSERT_TRUE(Submit(*scheduler, {Chunk(5, kC, 8, true), Chunk(1, kA, 8, true), Decode(3, kB)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 5, 1}));
}

TEST(ClearTest, DoesNotClaimTasksAlreadyHandedToTheCaller) {
  auto scheduler = Make(100, 4, 96);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 60), Chunk(2, kA, 60, true), Decode(3, kB)}));
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 1}));
  std::vector<Task> cleared = scheduler->clear();
  scheduler->check_invariants();
  EXPECT_EQ(Ids(cleared), (TaskIds{2}));
  EXPECT_TRUE(AllCancelled(cleared));
}

// ---- has_work ----

TEST(HasWorkTest, EmptySchedulerHasNothingToDo) {
  auto scheduler = Make();
  EXPECT_FALSE(scheduler->has_work());
  EXPECT_EQ(scheduler->num_queued(), 0u);
  EXPECT_TRUE(Next(*scheduler).empty());
  EXPECT_TRUE(Submit(*scheduler, {}));  // an empty group queues nothing
  EXPECT_FALSE(scheduler->has_work());
}

TEST(HasWorkTest, TracksQueuedTasksOnly) {
  auto scheduler = Make(100, 4, 96);
  ASSERT_TRUE(Submit(*scheduler, {Chunk(1, kA, 60), Chunk(2, kA, 60, true), Decode(3, kB)}));
  EXPECT_TRUE(scheduler->has_work());
  EXPECT_EQ(scheduler->num_queued(), 3u);
  EXPECT_EQ(Next(*scheduler), (TaskIds{3, 1}));
  EXPECT_TRUE(scheduler->has_work());  // task 2 is still queued
  EXPECT_EQ(scheduler->num_queued(), 1u);
  EXPECT_FALSE(Submit(*scheduler, {Chunk(4, kC, 0)}));
  EXPECT_EQ(scheduler->num_queued(), 1u);
  EXPECT_EQ(Ids(Cancel(*scheduler, kA)), (TaskIds{2}));
  // A's empty queue still holds its rotation slot, but that is not work.
  EXPECT_FALSE(scheduler->has_work());
  EXPECT_EQ(scheduler->num_queued(), 0u);
  ASSERT_TRUE(Submit(*scheduler, {Decode(5, kA)}));
  EXPECT_TRUE(scheduler->has_work());
  EXPECT_EQ(Next(*scheduler), (TaskIds{5}));
  EXPECT_FALSE(scheduler->has_work());
}

}  // namespace
}  // namespace cellm
