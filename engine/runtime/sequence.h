// A request inside the engine: its tokens, how far each has gone through the model, its KV
// tables, and the rows it has in flight.
//
// Invariants (docs/design.md#one-engine-step; docs/models.md#kv-cache-modes):
//   - positions [0, num_entered) have entered the model; [0, num_done) have completed it
//     (every KV entry they write is written);
//   - rows advance exactly one loop of the shared block per pass, and rows enter in position
//     order, so a row at loop r always finds the entries of earlier positions at loop r;
//   - a row that leaves the loop waits in `pending_tail` until every earlier position has
//     left too: the unique layers after the loop then run in position order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "engine/runtime/kv_block_pool.h"
#include "engine/runtime/prefix_cache.h"
#include "engine/runtime/request.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/state_slots.h"

namespace morserve {

struct Sequence;

// A token inside the looped segment (or waiting for the tail), with its hidden state. Move-only:
// its states are slots of the runner's.
struct Row {
  Sequence* seq = nullptr;
  int position = 0;
  int loop = 0;          // next loop to run (0-based); loops run so far inside the segment
  StateSlot h;           // hidden state [H], held by the runner (state_slots.h)
  StateSlot x0;          // token_choice: the segment input
  float gate = 0.0f;     // expert_choice: g of the loop about to run
  float tc_gate = 0.0f;  // token_choice: p[d-1]
  int tc_depth = 0;      // token_choice: loops to run
  bool exited = false;   // set by a pass when the row leaves the loop
  // early_exit with exit_kv propagate: after its token left the loop, a K/V-only copy of the
  // row keeps riding the later loops with the frozen exit state, writing each later slot's
  // entry in the same pass a full row would have (so entries stay in position order).
  bool kv_only = false;
  // Ouro adaptive (docs/models.md#serving-looped-checkpoints): on a K/V-only row, the loop
  // whose entries it copies into each later loop's slot (copy on exit; -1: it computes them
  // from h as above). On a full row, the exit gate's cumulative probability and the
  // probability of not having exited so far.
  int kv_copy_loop = -1;
  double exit_cumulative = 0, exit_survive = 1;
  std::vector<float> logits;  // [vocab] when the row is the last known token (sampled next)
  // Instead of logits: the next token when the runner sampled it (ModelRunner::Sample).
  std::optional<SampleResult> sample;
  // Huginn (docs/models.md#huginn-0125): the prelude's output e, injected before every
  // recurrence. Adaptive mode: the runner's row keeping the last exit check's logits
  // (ModelRunner::HuginnExitKl; none yet: P uniform), held while the token is in the loop; once
  // the KL rule lets the token leave, h is its coda output, its coda entries are written, and
  // the tail only samples it (tail_done).
  StateSlot inject;
  StateSlot huginn_prev;
  bool tail_done = false;
  // With prompt logprobs, on rows of prompt positions p < num_prompt - 1: the score of
  // prompt token p + 1 from this row's final hidden state (set by the tail).
  std::optional<PromptTokenLogprob> prompt_logprob;
};

struct Sequence {
  uint64_t id = 0;  // arrival order; the scheduler's FIFO and preemption order
  GenerateRequest request;
  std::shared_ptr<EventChannel> channel;
  uint64_t seed = 0;
  std::vector<int> tokens;  // prompt, then generated
  int num_prompt = 0;
  int num_entered = 0;
  int num_done = 0;
  int rows_in_loop = 0;
  std::map<int, Row> pending_tail;  // position -> row that left the loop
  std::unique_ptr<RequestKv> kv;
  // Adaptive depth (a model with an exit rule, mode adaptive): generated tokens may exit at
  // the rule; prompt tokens run full depth (docs/models.md#serving-looped-checkpoints).
  bool adaptive_loops = false;
  // Huginn adaptive: a generated token's exit check runs the coda, which attends to the coda
  // entries of every earlier position, written when those leave the loop. So generated tokens
  // enter one at a time, each after every earlier position is done, also when a preempted
  // request recomputes them (DepthScheduler::Ready): the decode order the reference computes.
  bool serial_generated = false;
  std::string cache_key;      // prefix cache namespace: cache_salt and the exit threshold
  PrefixCursor cache_cursor;  // how far this request's blocks are cached
  bool cancelled = false;
  FinishReason cancel_reason = FinishReason::kCancelled;  // what the final event reports
  bool running = false;
  Usage usage;
  std::vector<int> token_loops;  // [num_done] loops of each position that left the loop
  // Prompt logprobs gathered so far (entry i: prompt token i + 1), kept across preemption
  // (a recomputed position rewrites its entry with the same value) until they are sent.
  std::vector<PromptTokenLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  double arrival_time = 0, first_token_time = 0, last_token_time = 0, admitted_time = 0;

  int num_generated() const { return static_cast<int>(tokens.size()) - num_prompt; }
};

}  // namespace morserve
