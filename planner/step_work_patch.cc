// Plan variants by rewriting the fields that depend on the activation mix, depth and chunk size; see
// step_work_patch.h. Each rewrite mirrors one line of build_step_work (model/step_work.cc), named here.
#include "planner/step_work_patch.h"

#include "common/error.h"

namespace slidedp::planner {

WorkPatcher::WorkPatcher(const Workload& w, const Hardware& hw, const Plan& plan) : w_(w) {
  Plan p = plan;
  p.per_layer.clear();
  p.offload_layers = static_cast<int>(w.model.num_layers);
  p.recompute_layers = 0;
  p.keep_layers = Plan::kRest;
  base_ = build_step_work(w, hw, p, System::kSlideDP);
  tied_numel_ = 0;
  for (const UnitLayout& u : w.layout.units)
    if (u.reads_tied_embedding) tied_numel_ = w.layout.units.front().flat_numel;
  for (const UnitWork& u : base_.units) {
    all_compute_s_ += u.fwd_s + u.bwd_s + u.recompute_s;
    if (u.kind == UnitKind::kDecoder) recompute_s_ = u.recompute_s;
  }
}

void WorkPatcher::set_chunk(StepWork& sw, int64_t chunk_numel) const {
  // build_step_work: u.chunks = num_chunks(u.numel, chunk); the tied head's gradients add the
  // embedding's chunks.
  for (std::size_t i = 0; i < sw.units.size(); ++i) {
    UnitWork& u = sw.units[i];
    u.chunks = num_chunks(u.numel, chunk_numel);
    u.grad_chunks = u.chunks;
    if (w_.layout.units[i].reads_tied_embedding) u.grad_chunks += num_chunks(tied_numel_, chunk_numel);
  }
}

void WorkPatcher::set_activation(StepWork& sw, const Plan& plan) const {
  // build_step_work: policy by layer; recompute_s is zero only for keep (offloaded layers are
  // recomputed from their offloaded input); offloaded layers move their input both ways.
  const int L = static_cast<int>(w_.model.num_layers);
  for (std::size_t i = 0; i < sw.units.size(); ++i) {
    UnitWork& u = sw.units[i];
    if (u.kind != UnitKind::kDecoder) continue;
    const UnitWork& b = base_.units[i];
    u.policy = plan.layer_policy(w_.layout.units[i].layer, L);
    u.recompute_s = u.policy == ActivationPolicy::kKeep ? 0.0 : b.recompute_s;
    u.act_offload_bytes = u.policy == ActivationPolicy::kOffload ? b.act_offload_bytes : 0.0;
  }
}

void WorkPatcher::make(const Plan& plan, StepWork& out) const {
  SLIDEDP_CHECK(plan.ranks == base_.ranks && plan.accum_steps == base_.accum_steps,
                "WorkPatcher: the plan's ranks or shape differ from the one it was built for");
  out = base_;
  set_activation(out, plan);
  set_chunk(out, plan.chunk_numel);
  out.buffer_depth = plan.gpu_buffer_depth;  // build_step_work: sw.buffer_depth = p.gpu_buffer_depth
}

double WorkPatcher::compute_bound_s(int keep_layers) const {
  return base_.accum_steps * (all_compute_s_ - keep_layers * recompute_s_);
}

}  // namespace slidedp::planner
