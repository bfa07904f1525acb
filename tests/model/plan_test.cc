// Plans: YAML round trip, activation policy expansion, strict errors.
#include <gtest/gtest.h>

#include "common/error.h"
#include "model/plan.h"

namespace slidedp {
namespace {

TEST(Plan, ActivationCountsExpandInLayerOrder) {
  Plan p;
  p.offload_layers = 2;
  p.recompute_layers = 3;
  p.keep_layers = Plan::kRest;
  EXPECT_EQ(p.layer_policy(0, 8), ActivationPolicy::kOffload);
  EXPECT_EQ(p.layer_policy(1, 8), ActivationPolicy::kOffload);
  EXPECT_EQ(p.layer_policy(2, 8), ActivationPolicy::kRecompute);
  EXPECT_EQ(p.layer_policy(4, 8), ActivationPolicy::kRecompute);
  EXPECT_EQ(p.layer_policy(5, 8), ActivationPolicy::kKeep);
  auto c = p.policy_counts(8);
  EXPECT_EQ(c.offload + c.recompute + c.keep, 8);
  EXPECT_EQ(c.keep, 3);
}

TEST(Plan, YamlRoundTrip) {
  PlanFile f;
  f.model = "qwen3-14b";
  f.hardware = "h100-sxm-x4";
  f.seq_len = 4096;
  f.plan.ranks = 4;
  f.plan.micro_batch = 2;
  f.plan.param_route = ParamRoute::kSharded;
  f.plan.grad_route = GradRoute::kGpu;
  f.plan.offload_layers = 4;
  f.plan.keep_layers = 6;
  std::string y = plan_file_to_yaml(f);
  PlanFile g = plan_file_from_yaml(y, "plan.yaml");
  EXPECT_EQ(plan_file_to_yaml(g), y);
  EXPECT_EQ(g.plan.layer_policy(39, 40), ActivationPolicy::kKeep);
  EXPECT_EQ(g.plan.layer_policy(33, 40), ActivationPolicy::kRecompute);
}

TEST(Plan, PerLayerListAndValidation) {
  PlanFile f = plan_file_from_yaml("activation:\n  per_layer: [offload, keep, recompute]\n", "p.yaml");
  EXPECT_EQ(f.plan.layer_policy(1, 3), ActivationPolicy::kKeep);
  EXPECT_NO_THROW(f.plan.validate(3, "p.yaml"));
  EXPECT_THROW(f.plan.validate(4, "p.yaml"), InputError);
}

TEST(Plan, BadValuesAreErrorsNamingTheKey) {
  try {
    plan_file_from_yaml("param_route: broadcast\n", "p.yaml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("p.yaml: param_route"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_file_from_yaml("ranks: 0\n", "p.yaml"), InputError);
  EXPECT_THROW(plan_file_from_yaml("chunk_numell: 5\n", "p.yaml"), InputError);
  EXPECT_THROW(plan_file_from_yaml("activation: {recompute: rest, keep: rest}\n", "p.yaml"), InputError);
  PlanFile f = plan_file_from_yaml("activation: {offload: 3, recompute: 3, keep: 3}\n", "p.yaml");
  EXPECT_THROW(f.plan.validate(8, "p.yaml"), InputError);
  EXPECT_EQ(plan_file_from_yaml("gpu_mem_budget_bytes: 70GiB\n", "p").plan.gpu_mem_budget_bytes,
            int64_t{70} << 30);
}

TEST(Plan, MlpTokenTileIsAStrictOptionalKey) {
  // Absent: 0 (untiled), and not written back, so existing plan files read and write as before.
  PlanFile f = plan_file_from_yaml("ranks: 2\n", "p.yaml");
  EXPECT_EQ(f.plan.mlp_token_tile, 0);
  EXPECT_EQ(plan_to_yaml(f.plan).find("mlp_token_tile"), std::string::npos);
  EXPECT_EQ(f.plan.summary(4).find("mlp tile"), std::string::npos);
  PlanFile g = plan_file_from_yaml("ranks: 2\nmlp_token_tile: 4096\n", "p.yaml");
  EXPECT_EQ(g.plan.mlp_token_tile, 4096);
  EXPECT_EQ(plan_file_from_yaml(plan_file_to_yaml(g), "again.yaml").plan.mlp_token_tile, 4096);
  EXPECT_NE(g.plan.summary(4).find("| mlp tile 4096"), std::string::npos) << g.plan.summary(4);
  try {
    plan_file_from_yaml("mlp_token_tile: -1\n", "p.yaml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("mlp_token_tile"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_file_from_yaml("mlp_token_tile: 1.5\n", "p.yaml"), InputError);
  EXPECT_THROW(plan_file_from_yaml("mlp_tile: 4096\n", "p.yaml"), InputError);
  Plan bad;
  bad.mlp_token_tile = -3;
  EXPECT_THROW(bad.validate(4, "p.yaml"), InputError);
}

}  // namespace
}  // namespace slidedp
