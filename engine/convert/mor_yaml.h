// The official Mixture-of-Recursions training code's Hydra run config (conf/pretrain/<run>.yaml)
// mapped to the "recursion" object of docs/checkpoints.md#the-recursion-object.
//
//   recursive.enable/num_recursion/sharing   -> num_recursions, sharing
//   kv_sharing.enable                         -> kv: shared (else recursion_wise)
//   mor.enable + mor.type expert|token        -> routing expert_choice|token_choice
//   mor.router_type linear|mlp, mor.temp      -> router.arch, router.temperature
//   mor.capacity "1.0,0.67,0.33" (or list)    -> router.capacity (expert)
//   mor.{expert,token}.router_func/alpha/gating -> router.activation/alpha/gating
//   mor.expert.sampling aux_router            -> router.aux_router true (aux_loss, null: false)
//   relaxation.enable + method lora           -> lora {rank: lora.r, alpha, targets:
//                                                 lora.target_modules}; alpha = r * alpha_pattern
//                                                 when alpha_pattern is set (as the code does)
// Keys that only steer training (initialisation, losses and their coefficients, warmups,
// dropout, svd_init, ln_share: the loader compares norm copies itself) are accepted and
// ignored. Inside the mapped sections an unknown key, or a value whose inference behaviour
// this server does not know (mor.type, router_type wide_mlp, rand_router true,
// relaxation.method other than lora, rank_pattern, skip_first_loop, kv_sharing.update_cache,
// expert.include_first false...), is an error naming the key. Keys outside these sections
// (wandb, dataset, optimiser...) are ignored.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace morserve {

// The recursion object (config.json form), or null JSON when the run is not recursive.
// `file` names the source in errors ("RUN.yaml: mor.type: ...").
absl::StatusOr<nlohmann::json> MorRunConfigToRecursion(const std::string& yaml_text,
                                                       const std::string& file);
absl::StatusOr<nlohmann::json> LoadMorRunConfig(const std::string& path);

}  // namespace morserve
