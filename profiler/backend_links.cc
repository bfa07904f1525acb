// Copy and collective stage over the Backend interface; see backend_links.h. Every timed batch is
// queued behind a gate (a host_fn waiting on a future) and released at once, so the span measures the
// streams working, not this thread queueing work, and the devices of an "all" case start together.
// A copy's time is the span between stamps around its batch; a collective's is the sum of its spans
// as the backend's timeline records them (on the CPU backend from the rendezvous to the end of this
// rank's own copies or sums), the measure the executor's timeline gives the fabric: a profile and a
// measured run count a collective alike, and the waits for the other ranks are not fabric time.
// The cases run in the run's rounds (stats.h run_rounds), so they share the regions through state.
#include "profiler/backend_links.h"

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <string_view>

#include "common/error.h"

namespace slidedp::profiler {
namespace {

using exec::DeviceBuffer;
using exec::HostBuffer;

struct DeviceRegions {
  DeviceBuffer dev_in, dev_out;  // h2d destination; d2h source (and collective buffers)
  HostBuffer host_out, host_in;  // h2d source; d2h destination
};

// A batch: for every participant (device, stream kind), K operations between two stamps.
struct Participant {
  int device = 0;
  char kind = 'h';  // 'h' h2d, 'd' d2h, 'g' all_gather, 'r' reduce_scatter
  double start = 0, end = 0;
  double collective_s = 0;  // collectives: the sum of the batch's spans on this device
  bool collective() const { return kind == 'g' || kind == 'r'; }
  double seconds() const { return collective() ? collective_s : end - start; }
};

exec::SpanTag tag_for(char kind) {
  exec::SpanTag t;
  t.category = kind == 'h' ? "h2d" : kind == 'd' ? "d2h" : "fabric";
  t.what = "profile";
  return t;
}

}  // namespace

const LinkCurve* BackendLinkResult::find(const std::string& mode, const std::string& direction) const {
  for (const auto* list : {&links, &collectives})
    for (const LinkCurve& c : *list)
      if (c.mode == mode && c.direction == direction) return &c;
  return nullptr;
}

namespace {

// The regions every case copies through, held by the cases for the run's rounds and released on
// the devices when the last case goes (before the backend, which profile.cc destroys last).
struct LinksState {
  exec::Backend* backend = nullptr;
  int64_t region = 0;
  std::vector<DeviceRegions> R;  // per used device
  ~LinksState() {
    for (std::size_t d = 0; d < R.size(); ++d) {
      backend->device(static_cast<int>(d)).release(R[d].dev_in, nullptr);
      backend->device(static_cast<int>(d)).release(R[d].dev_out, nullptr);
    }
  }

  // The first `devices` devices' regions, zeroed (first touch outside the timed spans).
  void allocate(int devices);
  // Runs K operations of `bytes` for every participant; fills each participant's span.
  void run_batch(std::vector<Participant>& parts, int64_t bytes, int K) {
    const int D = backend->num_devices();
    std::promise<void> go;
    std::shared_future<void> gate = go.get_future().share();
    const int64_t slots = std::max<int64_t>(1, region / std::max<int64_t>(bytes, 1));
    const bool collectives =
        std::any_of(parts.begin(), parts.end(), [](const Participant& p) { return p.collective(); });
    if (collectives) {
      backend->take_spans();  // nothing earlier counts
      backend->set_tracing(true);
    }
    for (Participant& p : parts) {
      exec::Device& dev = backend->device(p.device);
      DeviceRegions& r = R[static_cast<std::size_t>(p.device)];
      exec::Stream& s = p.kind == 'h' ? dev.h2d() : p.kind == 'd' ? dev.d2h() : dev.comm();
      s.host_fn([gate] { gate.wait(); });
      s.host_fn([&p] { p.start = now_s(); });
      for (int k = 0; k < K; ++k) {
        const int64_t off = (k % slots) * bytes;
        switch (p.kind) {
          case 'h':
            s.copy_h2d(r.dev_in, off, r.host_out.ptr + off, bytes, tag_for('h'));
            break;
          case 'd':
            s.copy_d2h(r.host_in.ptr + off, r.dev_out, off, bytes, tag_for('d'));
            break;
          case 'g':
            backend->all_gather(p.device, r.dev_in, off / 2, bytes / 2, exec::DType::kBF16, tag_for('g'));
            break;
          default: {
            // bf16 input of bytes/2 elements; this rank's fp32 shard (at most 4 ceil(count / D)
            // bytes) lands in dev_out, rotated like the input.
            const int64_t shard_bytes = 4 * ((bytes / 2 + D - 1) / D) + 64;
            const int64_t out_slots = std::max<int64_t>(1, region / shard_bytes);
            const int64_t out_off = (k % out_slots) * (shard_bytes / 4);
            backend->reduce_scatter(p.device, r.dev_in, off / 2, exec::DType::kBF16, bytes / 2, r.dev_out,
                                    out_off, tag_for('r'));
          }
        }
      }
      s.host_fn([&p] { p.end = now_s(); });
    }
    go.set_value();
    backend->synchronize();
    if (collectives) {
      backend->set_tracing(false);
      for (const exec::MeasuredSpan& span : backend->take_spans()) {
        if (std::string_view(span.tag.category) != "fabric" || std::string_view(span.tag.what) != "profile")
          continue;
        for (Participant& p : parts)
          if (p.collective() && p.device == span.rank) p.collective_s += span.end_s - span.start_s;
      }
      for (const Participant& p : parts)
        SLIDEDP_CHECK(
            !p.collective() || p.collective_s > 0,
            "the backend recorded no span of a profiled collective on device " + std::to_string(p.device));
    }
  }
};
void LinksState::allocate(int devices) {
  for (int d = 0; d < devices; ++d) {
    exec::Device& dev = backend->device(d);
    DeviceRegions r;
    r.dev_in = dev.alloc(region, "profile: h2d destination");
    r.dev_out = dev.alloc(region, "profile: d2h source");
    dev.zero(r.dev_in, 0, region);
    dev.zero(r.dev_out, 0, region);
    r.host_out = backend->alloc_host(region, true);
    r.host_in = backend->alloc_host(region, true);
    R.push_back(r);
  }
  backend->synchronize();
}

// A way of using the links or the fabric: which devices take part, in which direction.
struct Mode {
  std::string name;
  std::vector<Participant> parts;
};
// One case: a mode at one size.
struct CasePlan {
  const Mode* mode;
  int64_t bytes;
  bool collective;
  std::vector<char> kinds;  // the curves of the mode (bidir has two)
};

std::vector<Mode> link_modes(const BackendLinkOptions& o, int D) {
  std::vector<Mode> modes;
  modes.push_back({"alone", {{0, 'h'}}});
  modes.push_back({"alone", {{0, 'd'}}});
  if (o.all_and_bidir && D > 1) {
    Mode ah{"all", {}}, ad{"all", {}}, bi{"bidir", {}};
    for (int d = 0; d < D; ++d) {
      ah.parts.push_back({d, 'h'});
      ad.parts.push_back({d, 'd'});
      bi.parts.push_back({d, 'h'});
      bi.parts.push_back({d, 'd'});
    }
    modes.push_back(ah);
    modes.push_back(ad);
    modes.push_back(bi);
  } else if (o.all_and_bidir) {
    // One device: "all" is "alone"; both directions at once is still a distinct case.
    modes.push_back({"bidir", {{0, 'h'}, {0, 'd'}}});
  }
  return modes;
}

std::vector<Mode> collective_modes(const BackendLinkOptions& o, int D) {
  std::vector<Mode> colls;
  if (D <= 1 || o.collective_sizes.empty()) return colls;
  Mode g{"all_gather", {}}, rs{"reduce_scatter", {}};
  for (int d = 0; d < D; ++d) {
    g.parts.push_back({d, 'g'});
    rs.parts.push_back({d, 'r'});
  }
  colls.push_back(g);
  colls.push_back(rs);
  return colls;
}

// K operations of the mode at `bytes`; the mean span per kind over its participants.
Case mode_case(const std::shared_ptr<LinksState>& st, const Mode& mode, const std::vector<char>& kinds,
               int64_t bytes, const RepeatPolicy& repeat) {
  return timed_case(fmt::format("{} {}", mode.name, bytes), repeat,
                    [st, kinds, bytes, parts0 = mode.parts](int inner) {
                      std::vector<Participant> parts = parts0;
                      st->run_batch(parts, bytes, inner);
                      std::vector<double> out;
                      for (char k : kinds) {
                        double sum = 0;
                        int cnt = 0;
                        for (const Participant& p : parts)
                          if (p.kind == k) sum += p.seconds(), ++cnt;
                        out.push_back(sum / cnt);
                      }
                      return out;
                    });
}

// Curves: for each mode and kind, the points over its sizes, then the fit.
BackendLinkResult backend_link_result(const std::vector<CasePlan>& plans, int D, const CaseSamples& vals,
                                      Measurements& out) {
  BackendLinkResult res;
  std::size_t i = 0;
  while (i < plans.size()) {
    const CasePlan& first = plans[i];
    std::vector<LinkCurve> curves;
    for (char k : first.kinds) {
      LinkCurve c;
      c.mode = first.mode->name;
      c.direction = first.collective ? "" : (k == 'h' ? "h2d" : "d2h");
      for (const Participant& p : first.mode->parts) c.devices += p.kind == k ? 1 : 0;
      curves.push_back(c);
    }
    for (; i < plans.size() && plans[i].mode == first.mode; ++i) {
      for (std::size_t k = 0; k < curves.size(); ++k) {
        LinkCurve& c = curves[k];
        nlohmann::json params = {{"bytes", plans[i].bytes}, {"mode", c.mode}, {"devices", c.devices}};
        if (!c.direction.empty()) params["direction"] = c.direction;
        const std::string name = first.collective ? c.mode + "_s" : c.direction + "_s";
        const Spread s =
            out.add({first.collective ? "fabric" : "links", name, params, "s", vals[i][k]}).spread();
        c.points.push_back({plans[i].bytes, s});
      }
    }
    for (LinkCurve& c : curves) {
      std::vector<XY> xy;
      for (const auto& p : c.points) {
        // Collectives: the bytes each port moves, S (N-1)/N (nccl-tests' bus bandwidth).
        const double x =
            first.collective ? static_cast<double>(p.bytes) * (D - 1) / D : static_cast<double>(p.bytes);
        xy.push_back({x, p.seconds.median});
      }
      c.fit = fit_latency_bandwidth(xy);
      (first.collective ? res.collectives : res.links).push_back(c);
    }
  }
  return res;
}

}  // namespace

PreparedStage<BackendLinkResult> prepare_backend_links(exec::Backend& backend, const BackendLinkOptions& o,
                                                       StageContext& ctx) {
  const int D = backend.num_devices();
  int64_t max_size = 0;
  for (int64_t s : o.sizes) max_size = std::max(max_size, s);
  for (int64_t s : o.collective_sizes) max_size = std::max(max_size, s);
  auto st = std::make_shared<LinksState>();
  st->backend = &backend;
  st->region = std::max(o.region_bytes, max_size);
  st->allocate(o.all_and_bidir || !o.collective_sizes.empty() ? D : 1);
  // Shared by the cases and finish(): the modes outlive this function.
  auto modes = std::make_shared<const std::vector<Mode>>(link_modes(o, D));
  auto colls = std::make_shared<const std::vector<Mode>>(collective_modes(o, D));
  std::vector<CasePlan> plans;
  PreparedStage<BackendLinkResult> stage;
  auto add = [&](const Mode& mode, const std::vector<int64_t>& sizes, bool collective) {
    std::vector<char> kinds;
    for (const Participant& p : mode.parts)
      if (std::find(kinds.begin(), kinds.end(), p.kind) == kinds.end()) kinds.push_back(p.kind);
    for (int64_t bytes : sizes) {
      plans.push_back({&mode, bytes, collective, kinds});
      stage.cases.push_back(mode_case(st, mode, kinds, bytes, ctx.repeat));
    }
  };
  for (const Mode& m : *modes) add(m, o.sizes, false);
  for (const Mode& m : *colls) add(m, o.collective_sizes, true);
  // finish() keeps the modes its plans point at.
  stage.finish = [plans, D, modes, colls, &out = ctx.out](const CaseSamples& vals) {
    return backend_link_result(plans, D, vals, out);
  };
  return stage;
}

double estimate_backend_links_s(const BackendLinkOptions& o, int devices, const RepeatPolicy& rp,
                                double copy_gbps) {
  double per_size = 0;
  for (int64_t s : o.sizes) per_size += std::max(rp.min_rep_s, static_cast<double>(s) / (copy_gbps * 1e9));
  double modes = 2 + (o.all_and_bidir ? (devices > 1 ? 3 * devices / 2.0 + 1 : 1) : 0);
  double coll = 0;
  for (int64_t s : o.collective_sizes)
    coll += std::max(rp.min_rep_s, static_cast<double>(s) / (copy_gbps * 1e9));
  const double setup = 4.0 * devices * static_cast<double>(o.region_bytes) / (copy_gbps * 1e9);
  return (rp.reps + 1) * (modes * per_size + (devices > 1 ? 2 * devices : 0) * coll) + setup;
}

}  // namespace slidedp::profiler
