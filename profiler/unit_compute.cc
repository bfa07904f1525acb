// Per-unit compute stage; see unit_compute.h. Layout: the stage's state (parameters and inputs on the
// devices, the timing loop over devices), the six timed operations (as the rank driver issues them),
// the cases for the run's rounds (stats.h run_rounds), fits, the SGEMM probe.
#include "profiler/unit_compute.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

#include "common/bf16.h"
#include "common/error.h"
#include "common/hash.h"
#include "kernels/cpu/transformer/blas.h"
#include "model/model_costs.h"

namespace slidedp::profiler {
namespace {

using exec::DeviceBuffer;
using exec::DType;
using exec::UnitOpArgs;

// splitmix64's sequence: the same values on every platform.
uint64_t next_random(uint64_t& s) {
  const uint64_t z = splitmix64(s);
  s += 0x9e3779b97f4a7c15ull;
  return z;
}
double uniform(uint64_t& s) { return static_cast<double>(next_random(s) >> 11) * 0x1.0p-53; }

// The longest a CUDA stream waits at a batch's gate (State::run) for the enqueuing thread to queue
// the batch. Queuing a batch that fits takes far less, but on CUDA the thread can be unable to finish
// at all: a stream holds a limited number of queued launches (of the order of a thousand), after which
// a launch blocks until the stream runs, and a context synchronization (a kernel's first load under
// lazy loading, a cudaFree) blocks it likewise. A gate that waited for the thread would then wait
// forever (the likely cause of the first GPU check's `slidedp-profile --smoke` hang). Past the bound
// the stream runs what is queued while the thread queues the rest, back to back wherever the thread
// keeps ahead. The CPU backend's streams queue without bound, so there the gate waits for the batch.
constexpr auto kGateMaxWait = std::chrono::milliseconds(50);

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

// A unit's parameters on one device, uploaded once and shared by every (T, B).
struct DeviceParams {
  exec::Device* dev = nullptr;
  DeviceBuffer emb, head;        // param dtype
  std::vector<DeviceBuffer> dec;  // per decoder kind (decoder_kinds)
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
  int dk = 0;           // decoder: the index in decoder_kinds
  const char* name;     // "fwd" | "recompute" | "bwd"
  int64_t alloc_bytes;  // allocated per use (caps back-to-back repetitions)
  std::function<void(int device)> enqueue;
};

// One untimed run of `op` on device 0 with tracing (and the backend's kernel activity) on: its kernels.
std::vector<exec::KernelTotal> traced_kernels(exec::Backend& backend, const Op& op) {
  backend.synchronize();
  backend.take_spans();  // nothing earlier counts
  backend.set_tracing(true);
  op.enqueue(0);
  backend.synchronize();
  backend.set_tracing(false);
  return exec::sum_kernels(backend.take_spans(), 0);
}

// One (T, B): its inputs on every device, produced once by an untimed forward chain, and its six
// operations as the rank driver issues them.
struct Chain {
  int64_t B = 0, T = 0, tokens = 0, hidden = 0;
  std::vector<UnitMemory> dm;  // per decoder kind
  UnitMemory hm;
  struct Inputs {
    DeviceBuffer tokens, targets;      // (B, T) int32
    DeviceBuffer x, dy;                // the embedding's output (every decoder's input), the head's dx
    std::vector<DeviceBuffer> y, saved;  // per decoder kind: its output (the last one feeds the head) and saved state
  };
  std::vector<Inputs> in;  // per device
  std::vector<Op> ops;
};

struct UnitComputeState {
  exec::Backend* backend = nullptr;
  int L = 0;
  bool tied = false;
  int64_t lm_offset = 0;
  std::vector<DecoderKind> kinds;
  int64_t emb_n = 0, head_n = 0;
  std::vector<int64_t> dec_n;                  // per decoder kind
  std::vector<DeviceParams> P;                 // per device
  std::vector<std::unique_ptr<Chain>> chains;  // per (T, B)
  ~UnitComputeState() {
    for (const auto& ch : chains)
      for (std::size_t d = 0; d < ch->in.size(); ++d) {
        const Chain::Inputs& in = ch->in[d];
        for (const DeviceBuffer& b : {in.tokens, in.targets, in.x, in.dy}) P[d].dev->release(b, nullptr);
        for (const std::vector<DeviceBuffer>* v : {&in.y, &in.saved})
          for (const DeviceBuffer& b : *v) P[d].dev->release(b, nullptr);
      }
    for (const DeviceParams& p : P) {
      for (const DeviceBuffer& b : {p.emb, p.head}) p.dev->release(b, nullptr);
      for (const DeviceBuffer& b : p.dec) p.dev->release(b, nullptr);
    }
  }

  // Sends a gradient: fp32 -> bf16 wire buffer on the compute stream, then both buffers go.
  static void send(exec::Device& dev, const DeviceBuffer& grads, int64_t numel) {
    DeviceBuffer wire = dev.alloc(numel * 2, "profile: gradient (wire)");
    dev.convert_fp32(grads, 0, wire, 0, DType::kBF16, numel);
    exec::EventPtr e = dev.compute().record();
    dev.release(grads, e);
    dev.release(wire, e);
  }
  // The head's arguments with its gradient buffers allocated and zeroed, as the rank driver does.
  struct HeadCall {
    UnitOpArgs a;
    DeviceBuffer tied_grads;
  };
  HeadCall head_call(const Chain& ch, int d, DeviceBuffer dx) const {
    const DeviceParams& p = P[static_cast<std::size_t>(d)];
    exec::Device& dev = *p.dev;
    HeadCall h;
    UnitOpArgs& a = h.a;
    a.unit = L + 1, a.B = ch.B, a.T = ch.T, a.params = p.head,
    a.x = ch.in[static_cast<std::size_t>(d)].y.back();
    a.targets = ch.in[static_cast<std::size_t>(d)].targets, a.dx = dx;
    a.lm_head_params = tied ? p.emb : p.head;
    a.lm_head_offset = lm_offset;
    a.grad_scale = 1.0 / static_cast<double>(ch.tokens);
    a.grads = dev.alloc(head_n * 4, "profile: head gradient");
    dev.zero(a.grads, 0, head_n * 4);
    if (tied) {
      h.tied_grads = dev.alloc(emb_n * 4, "profile: tied embedding gradient");
      dev.zero(h.tied_grads, 0, emb_n * 4);
      a.lm_head_grads = h.tied_grads;
    } else {
      a.lm_head_grads = a.grads;
    }
    a.lm_head_grad_offset = lm_offset;
    a.loss = dev.alloc(16, "profile: loss");
    a.workspace = dev.alloc(ch.hm.forward_workspace_bytes, "profile: workspace");
    return h;
  }

  // Each device's enqueuing thread issues every op K_op times between two stamps. Returns, per op,
  // the mean over the first ndev devices of (end - start) / K_op.
  std::vector<double> run(const Chain& ch, int ndev, const std::vector<int>& K) {
    const std::size_t nops = ch.ops.size();
    std::vector<std::vector<double>> start(static_cast<std::size_t>(ndev), std::vector<double>(nops)),
        end = start;
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ndev));
    const bool bounded = backend->name() == "cuda";  // see kGateMaxWait
    for (int d = 0; d < ndev; ++d) {
      threads.emplace_back([&, d] {
        try {
          exec::Stream& s = P[static_cast<std::size_t>(d)].dev->compute();
          for (std::size_t i = 0; i < nops; ++i) {
            double* s0 = &start[static_cast<std::size_t>(d)][i];
            double* s1 = &end[static_cast<std::size_t>(d)][i];
            // The stream waits at a gate until the whole batch is queued (on CUDA at most
            // kGateMaxWait), so a fast operation is timed running back to back, not waiting for
            // this thread to queue the next one. (Within a batch nothing is freed before the gate
            // opens: K_op x alloc_bytes is capped.)
            auto gate = std::make_shared<std::promise<void>>();
            std::shared_future<void> opened = gate->get_future().share();
            s.host_fn([opened, bounded] {
              if (bounded)
                opened.wait_for(kGateMaxWait);
              else
                opened.wait();
            });
            s.host_fn([s0] { *s0 = now_s(); });
            for (int k = 0; k < K[i]; ++k) ch.ops[i].enqueue(d);
            s.host_fn([s1] { *s1 = now_s(); });
            gate->set_value();
          }
        } catch (...) {
          errors[static_cast<std::size_t>(d)] =
              std::current_exception();  // an open gate is broken: streams go on
        }
      });
    }
    for (auto& t : threads) t.join();
    backend->synchronize();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    std::vector<double> per_op(nops, 0.0);
    for (std::size_t i = 0; i < nops; ++i) {
      for (int d = 0; d < ndev; ++d)
        per_op[i] += (end[static_cast<std::size_t>(d)][i] - start[static_cast<std::size_t>(d)][i]) / K[i];
      per_op[i] /= ndev;
    }
    return per_op;
  }

  // Every unit's parameters on each device, random like a trained model's in scale.
  void upload_params(const ModelLayout& layout, const UnitComputeOptions& o, int devices);
  // One (T, B): its inputs on every device, produced by an untimed forward chain, and its operations.
  void add_chain(int64_t T, int64_t B, int64_t vocab, const UnitComputeOptions& o);
  // The six operations of `c`, as the rank driver issues them.
  void add_ops(Chain* c);
};

void UnitComputeState::upload_params(const ModelLayout& layout, const UnitComputeOptions& o, int devices) {
  const DType pdt = backend->device(0).param_dtype();
  const int64_t pbytes = exec::dtype_bytes(pdt);
  const UnitLayout& emb_l = layout.units.front();
  const UnitLayout& head_l = layout.units.back();
  const std::size_t nk = kinds.size();
  P.resize(static_cast<std::size_t>(devices));
  const std::vector<std::byte> emb_host = unit_params(emb_l, pdt, o.seed);
  const std::vector<std::byte> head_host = unit_params(head_l, pdt, o.seed + 2);
  std::vector<std::vector<std::byte>> dec_host;
  for (std::size_t k = 0; k < nk; ++k)
    dec_host.push_back(
        unit_params(layout.units[static_cast<std::size_t>(kinds[k].layer) + 1], pdt, o.seed + 1 + 3 * k));
  for (int d = 0; d < devices; ++d) {
    DeviceParams& p = P[static_cast<std::size_t>(d)];
    p.dev = &backend->device(d);
    p.emb = upload(*backend, *p.dev, emb_host.data(), emb_n * pbytes, "profile: embedding");
    for (std::size_t k = 0; k < nk; ++k)
      p.dec.push_back(upload(*backend, *p.dev, dec_host[k].data(), dec_n[k] * pbytes, "profile: decoder"));
    p.head = upload(*backend, *p.dev, head_host.data(), head_n * pbytes, "profile: head");
  }
}

void UnitComputeState::add_chain(int64_t T, int64_t B, int64_t vocab, const UnitComputeOptions& o) {
  const int devices = static_cast<int>(P.size());
  const std::size_t nk = kinds.size();
  auto ch = std::make_unique<Chain>();
  Chain* c = ch.get();
  c->B = B, c->T = T, c->tokens = B * T;
  const RankMemorySpec mem = backend->device(0).memory_spec(B, T);
  for (const DecoderKind& k : kinds) c->dm.push_back(mem.layer_memory(k.layer));
  c->hm = mem.head;
  c->hidden = mem.decoder.hidden_bytes;
  std::vector<int32_t> ids(static_cast<std::size_t>(c->tokens)), tgt(ids.size());
  uint64_t seed = o.seed * 7919 + static_cast<uint64_t>(c->tokens);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(next_random(seed) % static_cast<uint64_t>(vocab));
    tgt[i] = static_cast<int32_t>(next_random(seed) % static_cast<uint64_t>(vocab));
  }
  for (int d = 0; d < devices; ++d) {
    exec::Device& dev = *P[static_cast<std::size_t>(d)].dev;
    Chain::Inputs in;
    in.tokens = upload(*backend, dev, ids.data(), c->tokens * 4, "profile: tokens");
    in.targets = upload(*backend, dev, tgt.data(), c->tokens * 4, "profile: targets");
    in.x = dev.alloc(c->hidden, "profile: x");
    in.dy = dev.alloc(c->hidden, "profile: dy");
    for (std::size_t k = 0; k < nk; ++k) {
      in.y.push_back(dev.alloc(c->hidden, "profile: y"));
      in.saved.push_back(dev.alloc(c->dm[k].saved_bytes, "profile: saved"));
    }
    c->in.push_back(in);
  }
  // The untimed chain: x = embedding(tokens); y_k, saved_k = decoder_k(x) for each decoder kind;
  // dy = the head's dx of the last y.
  for (int d = 0; d < devices; ++d) {
    const DeviceParams& p = P[static_cast<std::size_t>(d)];
    const Chain::Inputs& in = c->in[static_cast<std::size_t>(d)];
    exec::Device& dev = *p.dev;
    UnitOpArgs e;
    e.unit = 0, e.B = B, e.T = T, e.params = p.emb, e.tokens = in.tokens, e.y = in.x;
    dev.forward(e);
    for (std::size_t k = 0; k < nk; ++k) {
      UnitOpArgs f;
      f.unit = kinds[k].layer + 1, f.B = B, f.T = T, f.params = p.dec[k], f.x = in.x, f.y = in.y[k];
      f.saved = in.saved[k];
      f.workspace = dev.alloc(c->dm[k].forward_workspace_bytes, "profile: workspace");
      dev.forward(f);
      dev.release(f.workspace, dev.compute().record());
    }
    HeadCall h = head_call(*c, d, in.dy);
    dev.forward(h.a);
    exec::EventPtr ev = dev.compute().record();
    for (const DeviceBuffer& b : {h.a.grads, h.a.loss, h.a.workspace}) dev.release(b, ev);
    if (tied) dev.release(h.tied_grads, ev);
  }
  backend->synchronize();
  add_ops(c);
  chains.push_back(std::move(ch));
}

void UnitComputeState::add_ops(Chain* c) {
  UnitComputeState* S = this;  // the ops live inside *this
  const std::size_t nk = kinds.size();
  const int64_t hidden = c->hidden;
  c->ops.push_back({UnitKind::kEmbedding, 0, "fwd", hidden, [S, c](int d) {
                      const DeviceParams& p = S->P[static_cast<std::size_t>(d)];
                      exec::Device& dev = *p.dev;
                      UnitOpArgs a;
                      a.unit = 0, a.B = c->B, a.T = c->T, a.params = p.emb;
                      a.tokens = c->in[static_cast<std::size_t>(d)].tokens;
                      a.y = dev.alloc(c->hidden, "profile: hidden state");
                      dev.forward(a);
                      dev.release(a.y, dev.compute().record());
                    }});
  for (std::size_t k = 0; k < nk; ++k) {
    const UnitMemory& dm = c->dm[k];
    const int unit = S->kinds[k].layer + 1;
    c->ops.push_back({UnitKind::kDecoder, static_cast<int>(k), "fwd",
                      hidden + dm.saved_bytes + dm.forward_workspace_bytes, [S, c, k, unit](int d) {
                        const DeviceParams& p = S->P[static_cast<std::size_t>(d)];
                        exec::Device& dev = *p.dev;
                        UnitOpArgs a;
                        a.unit = unit, a.B = c->B, a.T = c->T, a.params = p.dec[k];
                        a.x = c->in[static_cast<std::size_t>(d)].x;
                        a.y = dev.alloc(c->hidden, "profile: hidden state");
                        a.saved = dev.alloc(c->dm[k].saved_bytes, "profile: saved activations");
                        a.workspace = dev.alloc(c->dm[k].forward_workspace_bytes, "profile: workspace");
                        dev.forward(a);
                        exec::EventPtr e = dev.compute().record();
                        for (const DeviceBuffer& b : {a.y, a.saved, a.workspace}) dev.release(b, e);
                      }});
    c->ops.push_back({UnitKind::kDecoder, static_cast<int>(k), "recompute",
                      dm.saved_bytes + dm.forward_workspace_bytes, [S, c, k, unit](int d) {
                        const DeviceParams& p = S->P[static_cast<std::size_t>(d)];
                        exec::Device& dev = *p.dev;
                        UnitOpArgs a;
                        a.unit = unit, a.B = c->B, a.T = c->T, a.params = p.dec[k];
                        a.x = c->in[static_cast<std::size_t>(d)].x;
                        a.saved = dev.alloc(c->dm[k].saved_bytes, "profile: saved activations (recomputed)");
                        a.workspace = dev.alloc(c->dm[k].forward_workspace_bytes, "profile: workspace");
                        dev.recompute(a);
                        exec::EventPtr e = dev.compute().record();
                        dev.release(a.saved, e);
                        dev.release(a.workspace, e);
                      }});
  }
  c->ops.push_back({UnitKind::kHead, 0, "fwd",
                    hidden + (head_n + (tied ? emb_n : 0)) * 6 + c->hm.forward_workspace_bytes,
                    [S, c](int d) {
                      exec::Device& dev = *S->P[static_cast<std::size_t>(d)].dev;
                      UnitComputeState::HeadCall h =
                          S->head_call(*c, d, dev.alloc(c->hidden, "profile: gradient of hidden state"));
                      dev.forward(h.a);
                      exec::EventPtr e = dev.compute().record();
                      for (const DeviceBuffer& b : {h.a.dx, h.a.loss, h.a.workspace}) dev.release(b, e);
                      UnitComputeState::send(dev, h.a.grads, S->head_n);
                      if (S->tied) UnitComputeState::send(dev, h.tied_grads, S->emb_n);
                    }});
  for (std::size_t k = 0; k < nk; ++k) {
    const int unit = S->kinds[k].layer + 1;
    c->ops.push_back({UnitKind::kDecoder, static_cast<int>(k), "bwd",
                      hidden + S->dec_n[k] * 6 + c->dm[k].backward_workspace_bytes, [S, c, k, unit](int d) {
                        const DeviceParams& p = S->P[static_cast<std::size_t>(d)];
                        const Chain::Inputs& in = c->in[static_cast<std::size_t>(d)];
                        exec::Device& dev = *p.dev;
                        const int64_t n = S->dec_n[k];
                        UnitOpArgs a;
                        a.unit = unit, a.B = c->B, a.T = c->T, a.params = p.dec[k], a.x = in.x;
                        a.saved = in.saved[k];
                        a.dy = in.dy;
                        a.grads = dev.alloc(n * 4, "profile: unit gradient");
                        dev.zero(a.grads, 0, n * 4);
                        a.dx = dev.alloc(c->hidden, "profile: gradient of hidden state");
                        a.workspace = dev.alloc(c->dm[k].backward_workspace_bytes, "profile: workspace");
                        dev.backward(a);
                        exec::EventPtr e = dev.compute().record();
                        dev.release(a.dx, e);
                        dev.release(a.workspace, e);
                        UnitComputeState::send(dev, a.grads, n);
                      }});
  }
  c->ops.push_back({UnitKind::kEmbedding, 0, "bwd", emb_n * 6, [S, c](int d) {
                      const DeviceParams& p = S->P[static_cast<std::size_t>(d)];
                      const Chain::Inputs& in = c->in[static_cast<std::size_t>(d)];
                      exec::Device& dev = *p.dev;
                      UnitOpArgs a;
                      a.unit = 0, a.B = c->B, a.T = c->T, a.params = p.emb, a.tokens = in.tokens,
                      a.dy = in.dy;
                      a.grads = dev.alloc(S->emb_n * 4, "profile: embedding gradient");
                      dev.zero(a.grads, 0, S->emb_n * 4);
                      dev.backward(a);
                      UnitComputeState::send(dev, a.grads, S->emb_n);
                    }});
}

// A case: one chain on ndev devices at once; the warm-up picks each op's K.
Case chain_case(const std::shared_ptr<UnitComputeState>& st, const Chain* ch, int ndev, int devices,
                const RepeatPolicy& policy) {
  auto K = std::make_shared<std::vector<int>>(ch->ops.size(), 1);
  Case c;
  c.label = fmt::format("T {} B {}{}", ch->T, ch->B, ndev == 1 && devices > 1 ? " alone" : "");
  c.warm = [st, ch, ndev, K, policy] {
    const std::vector<double> warm = st->run(*ch, ndev, *K);
    for (std::size_t i = 0; i < warm.size(); ++i) {
      // Back-to-back uses hold their allocations until the stream reaches them: keep that under
      // about 1 GiB per device.
      const int mem_cap = static_cast<int>(
          std::clamp<int64_t>((int64_t{1} << 30) / std::max<int64_t>(ch->ops[i].alloc_bytes, 1), 1, 1 << 14));
      (*K)[i] = std::min(inner_for(policy, warm[i]), mem_cap);
    }
  };
  c.rep = [st, ch, ndev, K] { return st->run(*ch, ndev, *K); };
  return c;
}

}  // namespace

std::vector<DecoderKind> decoder_kinds(const ModelCard& card) {
  if (card.uniform_layers()) return {DecoderKind{}};
  std::vector<DecoderKind> kinds;
  for (int l = 0; l < static_cast<int>(card.num_layers); ++l) {
    const AttentionKind t = card.layer(l).attention;
    if (std::none_of(kinds.begin(), kinds.end(), [&](const DecoderKind& k) { return k.layer_type == t; }))
      kinds.push_back({l, t});
  }
  return kinds;
}

std::string unit_label(UnitKind kind, const std::optional<AttentionKind>& layer_type) {
  std::string s = unit_kind_name(kind);
  if (layer_type) s += std::string(":") + attention_kind_name(*layer_type);
  return s;
}

namespace {

// One fit per (unit kind, decoder kind, op) over every (B, T), and the profiles built from them.
void add_fits(UnitComputeResult& res, const ModelCard& card, const std::vector<DecoderKind>& kinds) {
  auto fit_of = [&](UnitKind kind, const std::string& op, const DecoderKind& dk = {}) {
    std::vector<UnitSample> s;
    for (const UnitCase& c : res.cases)
      if (c.kind == kind && c.op == op && c.layer == dk.layer)
        s.push_back({static_cast<double>(c.B * c.T), static_cast<double>(c.T), c.seconds.median});
    UnitFit f = fit_unit_time(s);
    res.fits.push_back({kind, dk.layer, dk.layer_type, op, f});
    return f.fit;
  };
  UnitTimeProfile e{card.name,
                    UnitKind::kEmbedding,
                    fit_of(UnitKind::kEmbedding, "fwd"),
                    fit_of(UnitKind::kEmbedding, "bwd"),
                    {}};
  e.recompute = e.forward;  // never recomputed; the schema wants a value
  res.profiles = {e};
  for (const DecoderKind& k : kinds) {
    UnitTimeProfile d{card.name, UnitKind::kDecoder, fit_of(UnitKind::kDecoder, "fwd", k),
                      fit_of(UnitKind::kDecoder, "bwd", k), fit_of(UnitKind::kDecoder, "recompute", k)};
    d.layer_type = k.layer_type;
    res.profiles.push_back(d);
  }
  UnitTimeProfile h{card.name, UnitKind::kHead, fit_of(UnitKind::kHead, "fwd"), TimeFit{}, {}};
  h.recompute = h.forward;
  res.profiles.push_back(h);
}

// The measured cases of every chain (concurrent, and alone when measured), their fits and profiles.
UnitComputeResult unit_compute_result(const UnitComputeState& st, const CaseSamples& vals,
                                      const ModelCard& card, int devices, bool also_alone, bool kernels,
                                      exec::Backend& backend, Measurements& out) {
  const bool alone_too = devices > 1 && also_alone;
  UnitComputeResult res;
  res.model = card.name;
  res.concurrent_devices = devices;
  std::size_t ci = 0;
  for (const auto& ch : st.chains) {
    const auto& conc = vals[ci++];
    const std::vector<std::vector<double>>* alone = alone_too ? &vals[ci++] : nullptr;
    for (std::size_t i = 0; i < ch->ops.size(); ++i) {
      UnitCase u;
      u.kind = ch->ops[i].kind;
      if (u.kind == UnitKind::kDecoder) {
        const DecoderKind& k = st.kinds[static_cast<std::size_t>(ch->ops[i].dk)];
        u.layer = k.layer;
        u.layer_type = k.layer_type;
      }
      u.op = ch->ops[i].name;
      u.B = ch->B;
      u.T = ch->T;
      nlohmann::json p = {{"model", card.name}, {"unit", unit_kind_name(u.kind)},
                          {"op", u.op},         {"micro_batch", u.B},
                          {"seq_len", u.T},     {"devices", devices}};
      if (u.layer_type) p["layer_type"] = attention_kind_name(*u.layer_type);
      u.seconds = out.add({"units", u.op + "_s", p, "s", conc[i]}).spread();
      if (alone) {
        p["devices"] = 1;
        u.has_alone = true;
        u.alone_seconds = out.add({"units", u.op + "_s", p, "s", (*alone)[i]}).spread();
      }
      if (kernels) {
        u.kernels = traced_kernels(backend, ch->ops[i]);
        for (const exec::KernelTotal& k : u.kernels) {
          nlohmann::json kp = p;
          kp["devices"] = 1;
          kp["kernel"] = k.kernel;
          kp["calls"] = k.calls;
          out.add({"units", u.op + "_kernel_s", kp, "s", {k.seconds}});
        }
      }
      res.cases.push_back(u);
    }
  }
  add_fits(res, card, st.kinds);
  return res;
}

}  // namespace

PreparedStage<UnitComputeResult> prepare_unit_compute(exec::Backend& backend, const ModelCard& card,
                                                      const ModelLayout& layout, const UnitComputeOptions& o,
                                                      StageContext& ctx) {
  const int L = static_cast<int>(card.num_layers);
  SLIDEDP_CHECK(L >= 1 && layout.num_units() == L + 2);
  const int devices = std::clamp(o.concurrent_devices, 1, backend.num_devices());
  const UnitLayout& head_l = layout.units.back();
  // Everything the cases touch: the parameters and every (T, B)'s inputs on each device, held for the
  // run's rounds and released on the devices when the last case goes (before the backend, which
  // profile.cc destroys last).
  auto st = std::make_shared<UnitComputeState>();
  st->backend = &backend;
  st->L = L;
  st->tied = head_l.reads_tied_embedding;
  st->lm_offset = st->tied ? layout.embedding_weight().offset : head_l.find("lm_head.weight")->offset;
  st->kinds = decoder_kinds(card);
  st->emb_n = layout.units.front().flat_numel, st->head_n = head_l.flat_numel;
  for (const DecoderKind& k : st->kinds)
    st->dec_n.push_back(layout.units[static_cast<std::size_t>(k.layer) + 1].flat_numel);
  st->upload_params(layout, o, devices);
  for (int64_t T : o.seq_lens)
    for (int64_t B : o.micro_batches) st->add_chain(T, B, card.vocab_size, o);

  PreparedStage<UnitComputeResult> stage;
  for (const auto& ch : st->chains) {
    stage.cases.push_back(chain_case(st, ch.get(), devices, devices, ctx.repeat));
    if (devices > 1 && o.also_alone) stage.cases.push_back(chain_case(st, ch.get(), 1, devices, ctx.repeat));
  }
  // finish() keeps the chains (their shapes) through st; the buffers go when the cases and it do.
  stage.finish = [st, devices, also_alone = o.also_alone, kernels = o.kernel_breakdown, &backend, card,
                  &out = ctx.out](const CaseSamples& vals) {
    return unit_compute_result(*st, vals, card, devices, also_alone, kernels, backend, out);
  };
  return stage;
}

double estimate_unit_compute_s(const ModelCard& card, const UnitComputeOptions& o, const RepeatPolicy& rp,
                               double gflops) {
  // FLOPs at about half the SGEMM rate (the units' small GEMMs, attention and elementwise work).
  const double rate = gflops * 1e9 * 0.5;
  double total = 0;
  for (int64_t T : o.seq_lens) {
    for (int64_t B : o.micro_batches) {
      double case_s = 2 * rp.min_rep_s;  // the embedding
      for (const DecoderKind& k : decoder_kinds(card)) {
        const UnitFlops f = unit_flops(card, UnitKind::kDecoder, k.layer, B, T);
        case_s += 2 * std::max(rp.min_rep_s, f.forward() / rate) + std::max(rp.min_rep_s, f.backward() / rate);
      }
      const UnitFlops h = unit_flops(card, UnitKind::kHead, 0, B, T);
      case_s += std::max(rp.min_rep_s, (h.forward() + h.backward()) / rate);
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
