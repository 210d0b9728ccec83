// Renders the dry run of `meshrun plan`: the resolved layout with each value's source, the checks, the
// per-node rank table, the group summary and warnings, as a table or as JSON (a contract other tools read).
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "meshrun/config.hpp"
#include "meshrun/json.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/schedule.hpp"

namespace meshrun::cli {

struct PlanView {
  const Config& config;
  const RankMap& map;
  std::string template_path;
  std::vector<std::string> checks;    // checks performed (all passed)
  std::vector<std::string> warnings;
  bool all_nodes = false;             // print every node instead of a summary
  RuleSet rules = RuleSet::trainer;   // the rules applied; RuleSet::layout: no template, so no model or batch
  // Optional extra per-rank columns (e.g. NIC and CPU set from a node topology): header names and a
  // function giving the cells of one local rank.
  std::vector<std::string> extra_columns;
  std::function<std::vector<std::string>(int local_rank)> extra_cells;
};

void render_plan_table(std::ostream& out, const PlanView& v);
// Writes the plan's keys into an object the caller has opened (so it can add sections such as "estimate").
// `flush` (optional) is called between ranks and between groups, where the writer's text so far may be
// written out and cleared: the caller streams a plan of a million GPUs instead of holding it whole.
void render_plan_json_body(JsonWriter& j, const PlanView& v, const std::function<void()>& flush = {});
// `meshrun plan --schedule`: the layout's pipeline schedule (mesh's generator) simulated with unit costs,
// F = B = W = 1 per chunk (a fused BW costs 2) and free transfers, so each column of the timeline is one
// time unit.
struct ScheduleView {
  ScheduleTable table;
  ScheduleCosts costs;
  Timeline timeline;
};
// "" or the one-line problem when the layout's schedule is larger than kMaxScheduleSlots (schedule.hpp:
// micro-batches per step × pp·virtual_stages; mesh's schedule_size_problem(), the check the planner shares),
// located at training.global_batch_size's origin. Checked before anything is generated.
std::string schedule_view_problem(const Config& cfg, const Layout& layout);
// `why` (a problem of training.global_batch_size) prefixed with that key's origin; "" stays "".
std::string at_batch_origin(const Config& cfg, const std::string& why);
// The layout must have passed validate() (which applies the schedule rule) and schedule_view_problem().
ScheduleView make_schedule_view(const JobConfig& job, const Layout& layout);
// "F3", "BW3"; with virtual stages the chunk too: "F3c5".
std::string action_label(const Action& a, int virtual_stages);
// max_width > 0 (--max-width): the timeline in panels of as many time columns as fit in that many characters,
// each headed by its time range; 0: one line per rank, however long. schedule_panel_columns says how many.
void render_schedule_table(std::ostream& out, const ScheduleView& v, int max_width = 0);
// Time columns per panel for max_width, or 0 when not even one fits (the message says the least width).
int schedule_panel_columns(const ScheduleView& v, int max_width, int* least_width = nullptr);
void render_schedule_json(JsonWriter& j, const ScheduleView& v);  // writes the "schedule" object's value

// The rank formula of a layout, e.g. "rank = tp + 8·(cp + 1·(dp + 128·pp))".
std::string rank_formula(const Layout& l);

// Non-default values, the layout keys, and where each came from.
struct ShownValue {
  std::string key, value, source;
};
std::vector<ShownValue> shown_values(const Config& cfg, const Layout& resolved);

}  // namespace meshrun::cli
