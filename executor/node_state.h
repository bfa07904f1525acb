// What the nodes of a multi-node run agree on and share outside the step's pipeline: a start-up
// check that every node runs the same binary, model, plan and data, texts gathered, and the outcome
// of a step every node takes part in.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <set>
#include <string>
#include <vector>

#include "executor/node_link.h"

namespace slidedp::exec {

// Every node passes the same (name, value) list; throws InputError on every node naming the first
// field that differs and the nodes' values (mismatched binaries, models, plans or data).
void check_nodes_agree(NodeLink& link, const std::vector<std::pair<std::string, std::string>>& fields);

// Every option of `app` as given on this node's command line ("(not given)" when absent), for
// check_nodes_agree: derived from the options table, so a new option is agreed without anyone listing
// it. `per_node`: the long names of options that may differ (what only node 0 prints or writes).
std::vector<std::pair<std::string, std::string>> options_to_agree(const CLI::App& app,
                                                                  const std::set<std::string>& per_node);

// Every node's `mine` (any length) on node `to`, in node order; the other nodes get an empty list.
std::vector<std::string> gather_text(NodeLink& link, const std::string& mine, int to);

// Every node's `mine` (any length) on every node, in node order.
std::vector<std::string> all_gather_text(NodeLink& link, const std::string& mine, const std::string& what);

// Every node passes its outcome of one step (null: it worked). When any node failed, every node
// throws: the failing node its own error, the others the first failing node's error kind and message
// naming that node. `what` names the step ("writing checkpoint 12").
void throw_if_any_node_failed(NodeLink& link, std::exception_ptr mine, const std::string& what);

// True on every node when any node passes true (a stop request seen by one node stops all alike).
bool any_node(NodeLink& link, bool mine);

}  // namespace slidedp::exec
