// Per-unit compute stage; see unit_compute.h. Layout: parameters and inputs, the six timed operations
// (as the rank driver issues them), the timing loop over devices, fits, the SGEMM probe.
#include "profiler/unit_compute.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

#include "common/bf16.h"
#include "common/error.h"
#include "kernels/cpu/transformer/blas.h"
#include "model/model_costs.h"

namespace slidedp::profiler {
namespace {

using exec::DeviceBuffer;
using exec::DType;
using exec::UnitOpArgs;

// splitmix64: the same values on every platform.
uint64_t next_random(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double uniform(uint64_t& s) { return static_cast<double>(next_random(s) >> 11) * 0x1.0p-53; }

// A unit's flat parameters like a trained model's in scale: norm weights 1, biases 0, matrices
// uniform with std 0.02 (padding stays 0), in the device's parameter dtype.
std::vector<std::byte> unit_params(const UnitLayout& u, DType dtype, uint64_t seed) {
  std::vector<float> f(static_cast<std::size_t>(u.flat_numel), 0.0f);
  uint64_t s = seed;
  for (const TensorSpec& t : u.tensors) {
    const bool norm = t.name.find("norm") != std::string::npos;
    const bool bias = t.name.size() >= 4 && t.name.compare(t.name.size() - 4, 4, "bias") == 0;
    for (int64_t i = 0; i < t.numel; ++i)
      f[static_cast<std::size_t>(t.offset + i)] =
          norm   ? 1.0f
          : bias ? 0.0f
                 : static_cast<float>((uniform(s) - 0.5) * 0.0693);  // std 0.02
  }
  std::vector<std::byte> out(static_cast<std::size_t>(u.flat_numel * exec::dtype_bytes(dtype)));
  if (dtype == DType::kBF16) {
    auto* b = reinterpret_cast<bf16_bits*>(out.data());
    for (std::size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
  } else {
    SLIDEDP_CHECK(dtype == DType::kF32, "parameter dtype");
    std::memcpy(out.data(), f.data(), out.size());
  }
  return out;
}

struct DeviceState {
  exec::Device* dev = nullptr;
  DeviceBuffer emb, dec, head;   // the units' parameters (param dtype)
  DeviceBuffer tokens, targets;  // (B, T) int32
  DeviceBuffer x, y, saved, dy;  // inputs of the timed operations, produced once by an untimed chain
};

// Copies host bytes into a fresh device buffer (through pinned staging and the h2d stream).
DeviceBuffer upload(exec::Backend& backend, exec::Device& dev, const void* src, int64_t bytes,
                    const char* what) {
  DeviceBuffer b = dev.alloc(bytes, what);
  exec::HostBuffer h = backend.alloc_host(bytes, true);
  std::memcpy(h.ptr, src, static_cast<std::size_t>(bytes));
  dev.h2d().copy_h2d(b, 0, h.ptr, bytes, exec::SpanTag{});
  dev.h2d().record()->wait_host();
  return b;
}

struct Op {
  UnitKind kind;
  const char* name;     // "fwd" | "recompute" | "bwd"
  int64_t alloc_bytes;  // allocated per use (caps back-to-back repetitions)
  std::function<void(DeviceState&)> enqueue;
};

}  // namespace

UnitComputeResult measure_unit_compute(exec::Backend& backend, const ModelCard& card,
                                       const ModelLayout& layout, const UnitComputeOptions& o,
                                       StageContext& ctx) {
  const int L = static_cast<int>(card.num_layers);
  SLIDEDP_CHECK(L >= 1 && layout.num_units() == L + 2);
  const int devices = std::clamp(o.concurrent_devices, 1, backend.num_devices());
  const UnitLayout& emb_l = layout.units.front();
  const UnitLayout& dec_l = layout.units[1];
  const UnitLayout& head_l = layout.units.back();
  const bool tied = head_l.reads_tied_embedding;
  const int64_t lm_offset =
      tied ? emb_l.find("model.embed_tokens.weight")->offset : head_l.find("lm_head.weight")->offset;
  const DType pdt = backend.device(0).param_dtype();
  const std::vector<std::byte> emb_host = unit_params(emb_l, pdt, o.seed);
  const std::vector<std::byte> dec_host = unit_params(dec_l, pdt, o.seed + 1);
  const std::vector<std::byte> head_host = unit_params(head_l, pdt, o.seed + 2);
  const int64_t pbytes = exec::dtype_bytes(pdt);
  const int64_t V = card.vocab_size;

  UnitComputeResult res;
  res.model = card.name;
  res.concurrent_devices = devices;
  const double total_cases = static_cast<double>(o.seq_lens.size() * o.micro_batches.size());
  double done_cases = 0;
  for (int64_t T : o.seq_lens) {
    for (int64_t B : o.micro_batches) {
      ctx.report(done_cases / total_cases, fmt::format("units, T {} B {}", T, B));
      const int64_t tokens = B * T;
      std::vector<int32_t> ids(static_cast<std::size_t>(tokens)), tgt(static_cast<std::size_t>(tokens));
      uint64_t s = o.seed * 7919 + static_cast<uint64_t>(tokens);
      for (int64_t i = 0; i < tokens; ++i) {
        ids[static_cast<std::size_t>(i)] = static_cast<int32_t>(next_random(s) % static_cast<uint64_t>(V));
        tgt[static_cast<std::size_t>(i)] = static_cast<int32_t>(next_random(s) % static_cast<uint64_t>(V));
      }
      const exec::UnitMemory dm = backend.device(0).unit_memory(UnitKind::kDecoder, B, T);
      const exec::UnitMemory hm = backend.device(0).unit_memory(UnitKind::kHead, B, T);
      const int64_t hidden = dm.hidden_bytes;

      // ---- per device: parameters, inputs, and the untimed chain that produces x, y, saved, dy ----
      std::vector<DeviceState> st(static_cast<std::size_t>(devices));
      for (int d = 0; d < devices; ++d) {
        DeviceState& ds = st[static_cast<std::size_t>(d)];
        exec::Device& dev = backend.device(d);
        ds.dev = &dev;
        ds.emb = upload(backend, dev, emb_host.data(), emb_l.flat_numel * pbytes, "profile: embedding");
        ds.dec = upload(backend, dev, dec_host.data(), dec_l.flat_numel * pbytes, "profile: decoder");
        ds.head = upload(backend, dev, head_host.data(), head_l.flat_numel * pbytes, "profile: head");
        ds.tokens = upload(backend, dev, ids.data(), tokens * 4, "profile: tokens");
        ds.targets = upload(backend, dev, tgt.data(), tokens * 4, "profile: targets");
        ds.x = dev.alloc(hidden, "profile: x");
        ds.y = dev.alloc(hidden, "profile: y");
        ds.dy = dev.alloc(hidden, "profile: dy");
        ds.saved = dev.alloc(dm.saved_bytes, "profile: saved");
      }

      // ---- the operations, each as the rank driver issues it (see executor/rank_driver.cc) ----
      auto head_args = [&](DeviceState& ds, DeviceBuffer dx) {
        UnitOpArgs a;
        a.unit = L + 1, a.B = B, a.T = T, a.params = ds.head, a.x = ds.y, a.targets = ds.targets, a.dx = dx;
        a.lm_head_params = tied ? ds.emb : ds.head;
        a.lm_head_offset = lm_offset;
        a.grad_scale = 1.0 / static_cast<double>(tokens);
        return a;
      };
      // Sends a gradient: fp32 -> bf16 wire buffer on the compute stream, then the buffers go.
      auto send = [](exec::Device& dev, const DeviceBuffer& grads, int64_t numel) {
        DeviceBuffer wire = dev.alloc(numel * 2, "profile: gradient (wire)");
        dev.convert_fp32(grads, 0, wire, 0, DType::kBF16, numel);
        exec::EventPtr e = dev.compute().record();
        dev.release(grads, e);
        dev.release(wire, e);
      };
      const int64_t emb_n = emb_l.flat_numel, dec_n = dec_l.flat_numel, head_n = head_l.flat_numel;
      std::vector<Op> ops;
      ops.push_back({UnitKind::kEmbedding, "fwd", hidden, [&](DeviceState& ds) {
                       exec::Device& dev = *ds.dev;
                       UnitOpArgs a;
                       a.unit = 0, a.B = B, a.T = T, a.params = ds.emb, a.tokens = ds.tokens;
                       a.y = dev.alloc(hidden, "profile: hidden state");
                       dev.forward(a);
                       dev.release(a.y, dev.compute().record());
                     }});
      ops.push_back({UnitKind::kDecoder, "fwd", hidden + dm.saved_bytes + dm.forward_workspace_bytes,
                     [&](DeviceState& ds) {
                       exec::Device& dev = *ds.dev;
                       UnitOpArgs a;
                       a.unit = 1, a.B = B, a.T = T, a.params = ds.dec, a.x = ds.x;
                       a.y = dev.alloc(hidden, "profile: hidden state");
                       a.saved = dev.alloc(dm.saved_bytes, "profile: saved activations");
                       a.workspace = dev.alloc(dm.forward_workspace_bytes, "profile: workspace");
                       dev.forward(a);
                       exec::EventPtr e = dev.compute().record();
                       for (const DeviceBuffer& b : {a.y, a.saved, a.workspace}) dev.release(b, e);
                     }});
      ops.push_back({UnitKind::kDecoder, "recompute", dm.saved_bytes + dm.forward_workspace_bytes,
                     [&](DeviceState& ds) {
                       exec::Device& dev = *ds.dev;
                       UnitOpArgs a;
                       a.unit = 1, a.B = B, a.T = T, a.params = ds.dec, a.x = ds.x;
                       a.saved = dev.alloc(dm.saved_bytes, "profile: saved activations (recomputed)");
                       a.workspace = dev.alloc(dm.forward_workspace_bytes, "profile: workspace");
                       dev.recompute(a);
                       exec::EventPtr e = dev.compute().record();
                       dev.release(a.saved, e);
                       dev.release(a.workspace, e);
                     }});
      ops.push_back({UnitKind::kHead, "fwd",
                     hidden + (head_n + (tied ? emb_n : 0)) * 6 + hm.forward_workspace_bytes,
                     [&](DeviceState& ds) {
                       exec::Device& dev = *ds.dev;
                       UnitOpArgs a = head_args(ds, dev.alloc(hidden, "profile: gradient of hidden state"));
                       a.grads = dev.alloc(head_n * 4, "profile: head gradient");
                       dev.zero(a.grads, 0, head_n * 4);
                       DeviceBuffer tied_grads;
                       if (tied) {
                         tied_grads = dev.alloc(emb_n * 4, "profile: tied embedding gradient");
                         dev.zero(tied_grads, 0, emb_n * 4);
                         a.lm_head_grads = tied_grads;
                       } else {
                         a.lm_head_grads = a.grads;
                       }
                       a.lm_head_grad_offset = lm_offset;
                       a.loss = dev.alloc(16, "profile: loss");
                       a.workspace = dev.alloc(hm.forward_workspace_bytes, "profile: workspace");
                       dev.forward(a);
                       exec::EventPtr e = dev.compute().record();
                       for (const DeviceBuffer& b : {a.dx, a.loss, a.workspace}) dev.release(b, e);
                       send(dev, a.grads, head_n);
                       if (tied) send(dev, tied_grads, emb_n);
                     }});
      ops.push_back(
          {UnitKind::kDecoder, "bwd", hidden + dec_n * 6 + dm.backward_workspace_bytes, [&](DeviceState& ds) {
             exec::Device& dev = *ds.dev;
             UnitOpArgs a;
             a.unit = 1, a.B = B, a.T = T, a.params = ds.dec, a.x = ds.x, a.saved = ds.saved, a.dy = ds.dy;
             a.grads = dev.alloc(dec_n * 4, "profile: unit gradient");
             dev.zero(a.grads, 0, dec_n * 4);
             a.dx = dev.alloc(hidden, "profile: gradient of hidden state");
             a.workspace = dev.alloc(dm.backward_workspace_bytes, "profile: workspace");
             dev.backward(a);
             exec::EventPtr e = dev.compute().record();
             dev.release(a.dx, e);
             dev.release(a.workspace, e);
             send(dev, a.grads, dec_n);
           }});
      ops.push_back({UnitKind::kEmbedding, "bwd", emb_n * 6, [&](DeviceState& ds) {
                       exec::Device& dev = *ds.dev;
                       UnitOpArgs a;
                       a.unit = 0, a.B = B, a.T = T, a.params = ds.emb, a.tokens = ds.tokens, a.dy = ds.dy;
                       a.grads = dev.alloc(emb_n * 4, "profile: embedding gradient");
                       dev.zero(a.grads, 0, emb_n * 4);
                       dev.backward(a);
                       send(dev, a.grads, emb_n);
                     }});

      // The untimed chain: x = embedding(tokens); y, saved = decoder(x); dy = head's dx.
      for (DeviceState& ds : st) {
        exec::Device& dev = *ds.dev;
        UnitOpArgs e;
        e.unit = 0, e.B = B, e.T = T, e.params = ds.emb, e.tokens = ds.tokens, e.y = ds.x;
        dev.forward(e);
        UnitOpArgs f;
        f.unit = 1, f.B = B, f.T = T, f.params = ds.dec, f.x = ds.x, f.y = ds.y, f.saved = ds.saved;
        f.workspace = dev.alloc(dm.forward_workspace_bytes, "profile: workspace");
        dev.forward(f);
        dev.release(f.workspace, dev.compute().record());
        UnitOpArgs h = head_args(ds, ds.dy);
        h.grads = dev.alloc(head_n * 4, "profile: head gradient");
        dev.zero(h.grads, 0, head_n * 4);
        DeviceBuffer tg;
        if (tied) {
          tg = dev.alloc(emb_n * 4, "profile: tied embedding gradient");
          dev.zero(tg, 0, emb_n * 4);
        }
        h.lm_head_grads = tied ? tg : h.grads;
        h.lm_head_grad_offset = lm_offset;
        h.loss = dev.alloc(16, "profile: loss");
        h.workspace = dev.alloc(hm.forward_workspace_bytes, "profile: workspace");
        dev.forward(h);
        exec::EventPtr ev = dev.compute().record();
        for (const DeviceBuffer& b : {h.grads, h.loss, h.workspace}) dev.release(b, ev);
        if (tied) dev.release(tg, ev);
      }
      backend.synchronize();

      // ---- timing: each device's enqueuing thread issues every op K_op times between two stamps ----
      const std::size_t nops = ops.size();
      // Returns, per op, the mean over the devices of (end - start) / K_op.
      auto run = [&](int ndev, const std::vector<int>& K) {
        std::vector<std::vector<double>> start(static_cast<std::size_t>(ndev), std::vector<double>(nops)),
            end = start;
        std::vector<std::thread> threads;
        std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ndev));
        for (int d = 0; d < ndev; ++d) {
          threads.emplace_back([&, d] {
            try {
              DeviceState& ds = st[static_cast<std::size_t>(d)];
              exec::Stream& c = ds.dev->compute();
              for (std::size_t i = 0; i < nops; ++i) {
                double* s0 = &start[static_cast<std::size_t>(d)][i];
                double* s1 = &end[static_cast<std::size_t>(d)][i];
                // The stream waits at a gate until the whole batch is queued, so a fast operation is
                // timed running back to back, not waiting for this thread to queue the next one.
                // (Within a batch nothing is freed before the gate opens: K_op x alloc_bytes is capped.)
                auto gate = std::make_shared<std::promise<void>>();
                std::shared_future<void> opened = gate->get_future().share();
                c.host_fn([opened] { opened.wait(); });
                c.host_fn([s0] { *s0 = now_s(); });
                for (int k = 0; k < K[i]; ++k) ops[i].enqueue(ds);
                c.host_fn([s1] { *s1 = now_s(); });
                gate->set_value();
              }
            } catch (...) {
              errors[static_cast<std::size_t>(d)] =
                  std::current_exception();  // an open gate is broken, so streams go on
            }
          });
        }
        for (auto& t : threads) t.join();
        backend.synchronize();
        for (const auto& e : errors)
          if (e) std::rethrow_exception(e);
        std::vector<double> per_op(nops, 0.0);
        for (std::size_t i = 0; i < nops; ++i) {
          for (int d = 0; d < ndev; ++d)
            per_op[i] += (end[static_cast<std::size_t>(d)][i] - start[static_cast<std::size_t>(d)][i]) / K[i];
          per_op[i] /= ndev;
        }
        return per_op;
      };
      auto measure = [&](int ndev) {
        const std::vector<double> warm = run(ndev, std::vector<int>(nops, 1));
        std::vector<int> K(nops);
        for (std::size_t i = 0; i < nops; ++i) {
          // Back-to-back uses hold their allocations until the stream reaches them: keep that under
          // about 1 GiB per device.
          const int mem_cap = static_cast<int>(
              std::clamp<int64_t>((int64_t{1} << 30) / std::max<int64_t>(ops[i].alloc_bytes, 1), 1, 1 << 14));
          K[i] = std::min(inner_for(ctx.repeat, warm[i]), mem_cap);
        }
        std::vector<std::vector<double>> reps(nops);
        for (int r = 0; r < ctx.repeat.reps; ++r) {
          const std::vector<double> v = run(ndev, K);
          for (std::size_t i = 0; i < nops; ++i) reps[i].push_back(v[i]);
        }
        return reps;
      };
      const std::vector<std::vector<double>> conc = measure(devices);
      std::vector<std::vector<double>> alone;
      if (devices > 1 && o.also_alone) alone = measure(1);
      for (std::size_t i = 0; i < nops; ++i) {
        UnitCase c;
        c.kind = ops[i].kind;
        c.op = ops[i].name;
        c.B = B;
        c.T = T;
        nlohmann::json p = {{"model", card.name}, {"unit", unit_kind_name(c.kind)},
                            {"op", c.op},         {"micro_batch", B},
                            {"seq_len", T},       {"devices", devices}};
        c.seconds = ctx.out.add({"units", std::string(c.op) + "_s", p, "s", conc[i]}).spread();
        if (!alone.empty()) {
          p["devices"] = 1;
          c.has_alone = true;
          c.alone_seconds = ctx.out.add({"units", std::string(c.op) + "_s", p, "s", alone[i]}).spread();
        }
        res.cases.push_back(c);
      }
      for (DeviceState& ds : st)
        for (const DeviceBuffer& b :
             {ds.emb, ds.dec, ds.head, ds.tokens, ds.targets, ds.x, ds.y, ds.dy, ds.saved})
          ds.dev->release(b, nullptr);
      ++done_cases;
    }
  }

  // ---- fits: one per (unit kind, op) over every (B, T) ----
  auto fit_of = [&](UnitKind kind, const std::string& op) {
    std::vector<UnitSample> s;
    for (const UnitCase& c : res.cases)
      if (c.kind == kind && c.op == op)
        s.push_back({static_cast<double>(c.B * c.T), static_cast<double>(c.T), c.seconds.median});
    UnitFit f = fit_unit_time(s);
    res.fits.push_back({kind, op, f});
    return f.fit;
  };
  UnitTimeProfile e{card.name,
                    UnitKind::kEmbedding,
                    fit_of(UnitKind::kEmbedding, "fwd"),
                    fit_of(UnitKind::kEmbedding, "bwd"),
                    {}};
  e.recompute = e.forward;  // never recomputed; the schema wants a value
  UnitTimeProfile d{card.name, UnitKind::kDecoder, fit_of(UnitKind::kDecoder, "fwd"),
                    fit_of(UnitKind::kDecoder, "bwd"), fit_of(UnitKind::kDecoder, "recompute")};
  UnitTimeProfile h{card.name, UnitKind::kHead, fit_of(UnitKind::kHead, "fwd"), TimeFit{}, {}};
  h.recompute = h.forward;
  res.profiles = {e, d, h};
  ctx.report(1.0, "");
  return res;
}

double estimate_unit_compute_s(const ModelCard& card, const UnitComputeOptions& o, const RepeatPolicy& rp,
                               double gflops) {
  // FLOPs at about half the SGEMM rate (the units' small GEMMs, attention and elementwise work).
  const double rate = gflops * 1e9 * 0.5;
  double total = 0;
  for (int64_t T : o.seq_lens) {
    for (int64_t B : o.micro_batches) {
      double case_s = 0;
      for (UnitKind k : {UnitKind::kEmbedding, UnitKind::kDecoder, UnitKind::kHead}) {
        const UnitFlops f = unit_flops(card, k, B, T);
        const double fwd = f.forward() / rate, bwd = f.backward() / rate;
        if (k == UnitKind::kDecoder)
          case_s += 2 * std::max(rp.min_rep_s, fwd) + std::max(rp.min_rep_s, bwd);
        else if (k == UnitKind::kHead)
          case_s += std::max(rp.min_rep_s, fwd + bwd);
        else
          case_s += 2 * rp.min_rep_s;
      }
      const double runs = (rp.reps + 1) * (o.concurrent_devices > 1 && o.also_alone ? 2 : 1);
      total += runs * case_s * 1.3;  // + the untimed chain and allocation
    }
  }
  return total;
}

Spread measure_sgemm_gflops(int64_t n, StageContext& ctx) {
  std::vector<float> A(static_cast<std::size_t>(n * n)), Bm(A.size()), C(A.size());
  uint64_t s = 5;
  for (std::size_t i = 0; i < A.size(); ++i) {
    A[i] = static_cast<float>(uniform(s) - 0.5);
    Bm[i] = static_cast<float>(uniform(s) - 0.5);
  }
  std::vector<double> t = repeat_timed(ctx.repeat, [&](int inner) {
    const double t0 = now_s();
    for (int i = 0; i < inner; ++i)
      kernels::gemm<float>(false, false, n, n, n, 1.0f, A.data(), n, Bm.data(), n, 0.0f, C.data(), n);
    return now_s() - t0;
  });
  for (double& x : t) x = 2.0 * static_cast<double>(n) * n * n / x / 1e9;
  return ctx.out
      .add({"units", "sgemm_gflops", {{"n", n}, {"blas_threads", kernels::blas_threads()}}, "GFLOP/s", t})
      .spread();
}

}  // namespace slidedp::profiler
