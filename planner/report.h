// What slidedp-plan prints and writes: the top K as a fixed-width table, one line on why the winner
// wins (which resource binds, what the runner-up changes and gives up), the search's counts (space,
// scored, pruned, infeasible per reason), one JSON object with stable keys, and the winner as a plan
// file that slidedp-run and slidedp-predict accept.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/plan.h"
#include "planner/search.h"

namespace slidedp::planner {

// One line per candidate: predicted step time (model and simulator), tokens/s, bottleneck, exposed
// time and GPU peak memory.
std::string render_top_table(const SearchResult& r);
// "why: ..." -- the binding resource of the winner and the runner-up's difference and cost.
std::string explain_choice(const SearchResult& r);
// The search's counts and times, a few lines.
std::string render_search_stats(const SearchResult& r);
// What differs between two plans, e.g. "chunk 32M -> 64M, depth 2 -> 3" ("" when equal).
std::string plan_difference(const Plan& from, const Plan& to, int num_layers);
// Plan::summary plus the update threads, which the summary leaves out.
std::string candidate_summary(const Plan& p, int num_layers);

nlohmann::json search_result_to_json(const SearchResult& r);

// The best plan as a plan file naming the model, hardware and sequence length.
PlanFile best_plan_file(const SearchResult& r, const std::string& model, const std::string& hardware,
                        int64_t seq_len);

}  // namespace slidedp::planner
