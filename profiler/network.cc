// Ping-pong latency and one-way streaming bandwidth between node 0 and node 1; see network.h.
#include "profiler/network.h"

#include <fmt/format.h>

#include <memory>

#include "common/error.h"

namespace slidedp::profiler {
namespace {

constexpr int64_t kPingTag = 1, kStreamTag = 2, kAckTag = 3;

}  // namespace

NetworkResult measure_network(exec::NodeLink& link, const NetworkPlan& plan) {
  NetworkResult r;
  r.nodes = link.nodes();
  const int me = link.node();
  if (link.nodes() < 2) throw InputError("--network", "needs two processes or more (mpirun -np 2)");
  if (me <= 1) {
    const int peer = 1 - me;
    // Latency: 8-byte round trips, node 0 first.
    auto ping = std::make_shared<std::vector<std::byte>>(8);
    std::vector<double> half_rtt_us;
    for (int rep = 0; rep <= plan.reps; ++rep) {  // rep 0: warm-up
      const double t0 = now_s();
      for (int i = 0; i < plan.latency_round_trips; ++i) {
        exec::TransferCount d;
        if (me == 0) {
          link.send(peer, kPingTag, ping->data(), 8, "a latency probe", d.one());
          link.recv(peer, kPingTag, ping->data(), 8, "a latency probe", d.one());
          d.wait(link, 2);
        } else {
          link.recv(peer, kPingTag, ping->data(), 8, "a latency probe", d.one());
          d.wait(link, 1);
          exec::TransferCount back;
          link.send(peer, kPingTag, ping->data(), 8, "a latency probe", back.one());
          back.wait(link, 1);
        }
      }
      if (rep > 0) half_rtt_us.push_back((now_s() - t0) / plan.latency_round_trips / 2 * 1e6);
    }
    if (me == 0) r.latency_us = summarize(half_rtt_us);
    // Bandwidth: node 0 streams `messages` messages to node 1, which acknowledges the last.
    for (int64_t bytes : plan.sizes) {
      auto buf = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(bytes * plan.messages), std::byte{1});
      std::vector<double> gbps;
      for (int rep = 0; rep <= plan.reps; ++rep) {
        const double t0 = now_s();
        exec::TransferCount d;
        for (int m = 0; m < plan.messages; ++m) {
          std::byte* p = buf->data() + m * bytes;
          if (me == 0) link.send(peer, kStreamTag, p, bytes, "a bandwidth probe", d.one());
          else link.recv(peer, kStreamTag, p, bytes, "a bandwidth probe", d.one());
        }
        d.wait(link, plan.messages);
        exec::TransferCount ack;
        if (me == 0) link.recv(peer, kAckTag, buf->data(), 8, "a bandwidth probe's acknowledgement", ack.one());
        else link.send(peer, kAckTag, buf->data(), 8, "a bandwidth probe's acknowledgement", ack.one());
        ack.wait(link, 1);
        if (rep > 0) gbps.push_back(static_cast<double>(bytes * plan.messages) / (now_s() - t0) / 1e9);
      }
      if (me == 0) {
        r.by_size.push_back({bytes, summarize(gbps)});
        r.best_gbps = r.by_size.back().gbps.median;
      }
    }
  }
  link.barrier("the end of the network stage");
  return r;
}

}  // namespace slidedp::profiler
