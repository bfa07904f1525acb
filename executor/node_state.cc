// Start-up agreement and state gathering across nodes; see node_state.h.
#include "executor/node_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/hash.h"

namespace slidedp::exec {

void check_nodes_agree(NodeLink& link, const std::vector<std::pair<std::string, std::string>>& fields) {
  // Fixed-size digests keep the exchange one all-gather: a 64-bit FNV-1a hash per field; the texts of
  // the first field that differs follow, so that every node's message names both values.
  std::vector<uint64_t> mine;
  for (const auto& [name, value] : fields) mine.push_back(fnv1a(value));
  const int64_t bytes = static_cast<int64_t>(mine.size() * 8);
  std::vector<std::byte> all = link.all_gather(reinterpret_cast<const std::byte*>(mine.data()), bytes, "the start-up check");
  for (size_t f = 0; f < fields.size(); ++f)
    for (int p = 0; p < link.nodes(); ++p) {
      uint64_t theirs;
      std::memcpy(&theirs, all.data() + p * bytes + static_cast<int64_t>(f * 8), 8);
      if (theirs == mine[f]) continue;
      // Every node sees the same digests, so every node comes here for the same field: one exchange.
      const std::vector<std::string> values = all_gather_text(link, fields[f].second, "the start-up check's values");
      int first = 0, other = 0;
      for (int q = 0; q < link.nodes(); ++q)
        if (values[static_cast<size_t>(q)] != values[0]) other = q;
      throw InputError(fields[f].first,
                       fmt::format("node {} has '{}' and node {} has '{}': every node must be started with the same "
                                   "options, binary, model, plan, data and checkpoint",
                                   first, values[static_cast<size_t>(first)], other, values[static_cast<size_t>(other)]));
    }
}

std::vector<std::pair<std::string, std::string>> options_to_agree(const CLI::App& app,
                                                                  const std::set<std::string>& per_node) {
  std::vector<std::pair<std::string, std::string>> fields;
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (name == "--help" || name == "-h" || per_node.count(name)) continue;
    std::string value = opt->count() == 0 ? "(not given)" : "";
    for (const std::string& r : opt->results()) value += (value.empty() ? "" : " ") + r;
    fields.emplace_back(name, value);
  }
  return fields;
}

std::vector<std::string> gather_text(NodeLink& link, const std::string& mine, int to) {
  const int64_t n = static_cast<int64_t>(mine.size());
  const std::vector<std::byte> sizes = link.all_gather(reinterpret_cast<const std::byte*>(&n), 8, "text sizes");
  std::vector<std::string> out;
  TransferCount done;
  int posted = 0;
  if (link.node() == to) {
    out.resize(static_cast<size_t>(link.nodes()));
    for (int p = 0; p < link.nodes(); ++p) {
      int64_t len;
      std::memcpy(&len, sizes.data() + 8 * p, 8);
      out[static_cast<size_t>(p)].resize(static_cast<size_t>(len));
      if (p == to) out[static_cast<size_t>(p)] = mine;
      else if (len > 0) {
        link.recv(p, link.reserved_tag(2), reinterpret_cast<std::byte*>(out[static_cast<size_t>(p)].data()), len,
                  fmt::format("node {}'s step record", p), done.one());
        ++posted;
      }
    }
  } else if (n > 0) {
    link.send(to, link.reserved_tag(2), reinterpret_cast<const std::byte*>(mine.data()), n, "this node's step record",
              done.one());
    ++posted;
  }
  done.wait(link, posted);
  return out;
}

std::vector<std::string> all_gather_text(NodeLink& link, const std::string& mine, const std::string& what) {
  // Two all-gathers: the lengths, then every text padded to the longest.
  const int64_t n = static_cast<int64_t>(mine.size());
  const std::vector<std::byte> sizes = link.all_gather(reinterpret_cast<const std::byte*>(&n), 8, what + " (sizes)");
  std::vector<int64_t> len(static_cast<size_t>(link.nodes()));
  std::memcpy(len.data(), sizes.data(), len.size() * 8);
  const int64_t longest = std::max<int64_t>(1, *std::max_element(len.begin(), len.end()));
  std::string padded = mine;
  padded.resize(static_cast<size_t>(longest));
  const std::vector<std::byte> all = link.all_gather(reinterpret_cast<const std::byte*>(padded.data()), longest, what);
  std::vector<std::string> out;
  for (int p = 0; p < link.nodes(); ++p)
    out.emplace_back(reinterpret_cast<const char*>(all.data()) + p * longest, static_cast<size_t>(len[static_cast<size_t>(p)]));
  return out;
}

void throw_if_any_node_failed(NodeLink& link, std::exception_ptr mine, const std::string& what) {
  // A status is "" (worked) or the error kind's number, a newline and the message.
  std::string status;
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const Error& e) {
      status = fmt::format("{}\n{}", static_cast<int>(e.kind()), e.what());
    } catch (const std::exception& e) {
      status = fmt::format("{}\n{}", static_cast<int>(ErrorKind::kRuntime), e.what());
    }
  }
  const std::vector<std::string> all = all_gather_text(link, status, what);
  if (mine) std::rethrow_exception(mine);
  for (int p = 0; p < link.nodes(); ++p) {
    const std::string& s = all[static_cast<size_t>(p)];
    if (s.empty()) continue;
    const size_t nl = s.find('\n');
    throw Error(static_cast<ErrorKind>(std::stoi(s.substr(0, nl))),
                fmt::format("{} failed on node {}: {}", what, p, s.substr(nl + 1)));
  }
}

bool any_node(NodeLink& link, bool mine) {
  const std::byte b{static_cast<unsigned char>(mine ? 1 : 0)};
  for (std::byte x : link.all_gather(&b, 1, "the stop check"))
    if (x != std::byte{0}) return true;
  return false;
}

}  // namespace slidedp::exec
