// Runs the model over the rows of one step, on any backend: embeds entering tokens and runs
// the segments before the loop, runs one pass of the shared block over rows at any loop,
// applies the routing of docs/models.md#depth-inside-the-looped-segment (who continues, who
// leaves), and runs the segments after the loop, the final norm and lm_head (the step:
// docs/design.md#one-engine-step). It builds each layer's KV plan from the requests'
// block tables without changing them (write first, then attend: a row sees every entry at a
// position <= its own in the slot of its loop); the entries a run writes are listed in its
// output for the scheduler to record.
#pragma once

#include <memory>
#include <vector>

#include "engine/model/weights.h"
#include "engine/runtime/kv_block_pool.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/step_plan.h"

namespace morserve {

class ModelExecutor {
 public:
  ModelExecutor(std::shared_ptr<const ModelWeights> weights, ModelRunner* runner,
                KvBlockPool* pool);

  // The plan's entering tokens enter (embedding, the segments before the loop, the entry
  // routing: rows that skip the loop come out in `skipped`); then one pass of the shared
  // block over the loop rows and the entered rows that joined them (`passed`: exited set on
  // rows that leave, the others advanced one loop; with exit_kv propagate, the K/V-only
  // rows of this pass's exits in `kv_only`).
  RunOutput Run(StepPlan&& plan);
  // Segments after the loop, final norm, and logits for rows whose position is the last
  // known token of their request (unless it asked for max_tokens 0); where the request needs
  // no logits on the host (RunnerSamples, no return_logits) the runner samples the next token
  // instead (Row::sample) and the logits stay where they are. Rows of prompt
  // positions whose request asked for prompt logprobs also get the score of the next prompt
  // token (Row::prompt_logprob); other requests' rows pay nothing for it. The entries these
  // layers write are already recorded (DepthScheduler::Update).
  void Tail(std::vector<Row>* rows);

 private:
  std::vector<Row> Enter(const std::vector<EnteringToken>& tokens, std::vector<KvWrite>* writes);
  void BlockPass(std::vector<Row>* rows, std::vector<Row>* kv_only, std::vector<KvWrite>* writes);
  void RunSegmentOn(int segment, std::vector<Row*>& rows, const std::vector<int32_t>& slots,
                    std::vector<KvWrite>* writes);
  void RunLayers(int segment, std::vector<Row*>& rows, const std::vector<int32_t>& slots,
                 std::vector<KvWrite>* writes);
  LayerKvPlan PlanLayer(int segment, int k, const std::vector<Row*>& rows,
                        std::vector<KvWrite>* writes) const;
  static std::vector<int32_t> RecurrentChunks(const std::vector<KvBlockTable*>& tables,
                                              const std::vector<int32_t>& write_slot);
  void EntryRouting(std::vector<Row*>& rows);
  void DecideExpert(std::vector<Row*>& rows);
  void ExitByConfidence(std::vector<Row*>& rows);
  bool AsksOuroGate(const Row& row) const;
  bool OuroGateExits(Row* row, double logit) const;
  void NormAfterLoop(const std::vector<Row*>& rows, std::vector<Row*>* exited);
  int LoopsOf(const Row& row) const;
  void StartHuginnState(std::vector<Row>* rows);
  void InjectInput(std::vector<Row*>& rows);
  void GatedResiduals(const std::vector<Row*>& rows, const std::vector<StateSlot>& h_in);
  void HuginnKlExits(std::vector<Row*>& rows, std::vector<Row*>* exited,
                     std::vector<KvWrite>* writes);
  void CopyOnExitEntries(int segment, int k, const std::vector<Row*>& rows, const LayerKvPlan& kv,
                         std::vector<KvCopy>* copies) const;
  void ScorePrompt(const std::vector<Row*>& rows);
  void SampleOnRunner(const std::vector<Row*>& rows, bool kept);
  void HostLogits(const std::vector<Row*>& rows, bool kept);
  static std::vector<int32_t> LogitIds(const std::vector<Row*>& rows, bool kept);
  static bool IsLastKnown(const Row& row);
  static std::vector<int32_t> Slots(const std::vector<Row*>& rows, StateSlot Row::*state = &Row::h);
  void Write(const std::vector<Row*>& rows, const std::vector<float>& h);
  void CopyState(const std::vector<Row*>& rows, StateSlot Row::*from, StateSlot Row::*state);

  std::shared_ptr<const ModelWeights> weights_;
  const ModelConfig& cfg_;
  const LayerPlan& plan_;
  ModelRunner* runner_;
  KvBlockPool* pool_;
  // Declared first of the executor's state and outliving every Row (the engine destroys the
  // scheduler, which holds rows, before the executor).
  StateSlots slots_;
  // Huginn adaptive: the runner's previous-logits rows (ModelRunner::HuginnExitKl), one per row
  // between its first exit check and its leaving the loop, so at most max_batch_rows.
  StateSlots huginn_rows_;
};

}  // namespace morserve
