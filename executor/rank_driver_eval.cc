// One rank's share of an evaluation (executor/evaluation.h): the forward of each of its held-out
// micro-batches with the weights of `params_step`, delivered as that step's forward delivers them, and
// the head's loss reported to the tally. Each layer's saved state is dropped as soon as the next layer
// has its input, and the head's gradients never leave the device.
#include <initializer_list>

#include "executor/evaluation.h"
#include "executor/rank_driver.h"

namespace slidedp::exec {

void RankDriver::issue_eval(int64_t params_step, int64_t eval_id, const SequenceSampler& data,
                            EvalTally& tally) {
  invalidate_parameters();  // the slots hold the weights of an earlier step
  evaluating_ = true;
  const int ranks = config_.nodes * config_.ranks;
  const int64_t micro_batches = eval_micro_batches(data.sequences_with_tail(), ranks, B_);
  const int64_t hidden = mem_.decoder.hidden_bytes;
  Device& dev = device_;
  Stream& compute = dev.compute();
  const int step_tag = static_cast<int>(params_step);
  for (int64_t m = 0; m < micro_batches; ++m) {
    const int64_t first = eval_first_sequence(m, global_rank(), ranks, B_);
    const DeviceBatch batch =
        upload_batch(params_step, [&](std::span<int32_t> in, std::span<int32_t> tg, std::span<int32_t> pos) {
          data.fill_sequences(first, B_, in, tg, pos);
        });
    DeviceBuffer router_stats;
    if (mem_.router_stats_bytes > 0) {
      router_stats = alloc(mem_.router_stats_bytes, "router statistics");
      dev.zero(router_stats, 0, mem_.router_stats_bytes);
    }
    DeviceBuffer x;  // the current unit's input
    for (int u = 0; u + 1 < U_; ++u) {
      const Delivered p = acquire(params_step, u);
      compute.wait(p.ready);
      UnitOpArgs args;
      args.unit = u, args.step = step_tag, args.B = B_, args.T = config_.seq_len, args.params = p.buffer;
      args.eval = true;
      args.y = alloc(hidden, "hidden state");
      if (u == 0) {
        args.tokens = batch.ids;
      } else {
        const int l = u - 1;
        args.x = x;
        args.saved = alloc(mem_.layer_memory(l).saved_bytes, "saved activations");
        args.workspace = alloc(mem_.layer_memory(l).forward_workspace_bytes, "workspace");
        args.router_stats = router_stats;
        args.positions = batch.positions;
      }
      dev.forward(args);
      const EventPtr done = compute.record();
      mark_use(u, done);
      if (u > 0) {
        release(args.saved, done);
        release(args.workspace, done);
        release(x, done);
      }
      x = args.y;
    }
    const Delivered p = acquire(params_step, U_ - 1);
    compute.wait(p.ready);
    // No router statistics: the loss is the language-model loss alone (the load-balancing term is a
    // training objective). The gradients, at any scale, are dropped.
    const HeadCall head = run_head(params_step, p, x, batch.targets, 1.0, DeviceBuffer{}, 0.0);
    for (const DeviceBuffer* b : std::initializer_list<const DeviceBuffer*>{
             &head.args.dx, &head.args.grads, &head.tied_grads, &batch.ids, &batch.targets, &batch.positions,
             &router_stats})
      if (*b) release(*b, head.done);
    EvalTally* t = &tally;
    loss_to_host(batch.parity, params_step, head.args.loss, head.done,
                 [t, eval_id, rank = config_.rank, m](double sum, double count) {
                   t->report(eval_id, rank, m, sum, count);
                 });
  }
  evaluating_ = false;
}

}  // namespace slidedp::exec
