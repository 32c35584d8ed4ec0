// Runs the model over the rows of one step, on any backend: embeds entering tokens and runs
// the segments before the loop, runs one pass of the shared block over rows at any loop,
// applies the routing of docs/models.md#depth-inside-the-looped-segment (who continues, who
// leaves), and runs the segments after the loop, the final norm and lm_head (the step:
// docs/design.md#one-engine-step). It builds each layer's KV plan from
// the requests' block tables (write first, then attend: a row sees every entry at a
// position <= its own in the slot of its loop).
#pragma once

#include <memory>
#include <vector>

#include "engine/model/weights.h"
#include "engine/runtime/depth_scheduler.h"
#include "engine/runtime/model_runner.h"

namespace morserve {

class ModelExecutor {
 public:
  ModelExecutor(std::shared_ptr<const ModelWeights> weights, ModelRunner* runner,
                KvBlockPool* pool);

  // Rows for the entering tokens, after embedding, the segments before the loop and the
  // entry routing. Rows with `exited` set skip the loop (no looped segment, or routed out).
  std::vector<Row> Enter(const std::vector<EnteringToken>& tokens);
  // One pass of the shared block over `rows` (sorted here by loop). Sets `exited` on rows
  // that leave the loop; the others have advanced one loop. With exit_kv propagate, the
  // K/V-only rows of this pass's exits are appended after the rows that ran.
  void BlockPass(std::vector<Row>* rows);
  // Segments after the loop, final norm, and logits for rows whose position is the last
  // known token of their request (unless it asked for max_tokens 0). Rows of prompt
  // positions whose request asked for prompt logprobs also get the score of the next prompt
  // token (Row::prompt_logprob); other requests' rows pay nothing for it.
  void Tail(std::vector<Row>* rows);

 private:
  void RunSegment(int segment, std::vector<Row*>& rows);
  void RunLayer(int segment, int k, std::vector<Row*>& rows, std::vector<float>* h);
  LayerKvPlan PlanLayer(int segment, int k, const std::vector<Row*>& rows);
  static std::vector<int32_t> RecurrentChunks(const std::vector<KvBlockTable*>& tables,
                                              const std::vector<int32_t>& write_slot);
  void EntryRouting(std::vector<Row*>& rows);
  void DecideExpert(std::vector<Row*>& rows);
  void ExitByConfidence(std::vector<Row*>& rows);
  void ScorePrompt(const std::vector<Row*>& rows);
  std::vector<float> Gather(const std::vector<Row*>& rows) const;
  void Scatter(const std::vector<float>& h, std::vector<Row*>& rows) const;

  std::shared_ptr<const ModelWeights> weights_;
  const ModelConfig& cfg_;
  const LayerPlan& plan_;
  ModelRunner* runner_;
  KvBlockPool* pool_;
  std::vector<float> loop_norm_;  // model.norm as fp32 when the model norms between loops
};

}  // namespace morserve
