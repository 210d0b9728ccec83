// Pipeline schedules as data (after sail-sg/zero-bubble-pipeline-parallelism): a generator per schedule
// writes, for every pipeline rank, the ordered list of actions it performs in one optimizer step; a
// validator checks a table; a simulator turns a table and costs into timelines. The trainer's runtime
// executes a rank's list and nothing else decides the order; the planner and `meshrun plan --schedule`
// read the same generator and simulator.
//
// Chunks: the model is cut into pp·V chunks (mesh's chunk_layers gives their layer counts). Chunk c lives
// on pipeline rank chunk_rank(c) as its virtual stage c / pp: c mod pp for gpipe, 1f1b, zb and interleaved
// (Megatron's interleaving), a V for zbv and dualpipev (two chunks per rank: chunks 0..pp−1 down the ranks,
// pp..2pp−1 back up, so rank r holds chunks r and 2pp−1−r). Chunk 0 holds the embedding, chunk pp·V−1 the
// head and the loss (both on rank 0 in a V). Two consecutive chunks on one rank (pp−1 and pp in a V) hand
// their activation and gradient over in memory: no transfer is listed between them.
//
// Communication semantics (what the validator and the simulator assume, and what the runtime does): a
// send never blocks (the runtime posts a non-blocking send and completes it before the buffer is reused);
// a receive blocks until the matching send has been posted. Every activation send of (micro-batch m,
// chunk c) on rank chunk_rank(c) is matched by one receive of (m, c) on chunk_rank(c+1); every gradient
// send of (m, c) on chunk_rank(c) by one receive of (m, c) on chunk_rank(c−1), when those ranks differ. Transfers carry no tag (NCCL
// has none; MPI's is fixed): rank a's k-th send to rank b meets b's k-th receive from a (MPI's
// non-overtaking rule, NCCL's per-peer order), so on every ordered pair of ranks the sends and the receives
// must name the same tensors in the same order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshrun {

enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zero_bubble, zbv, dualpipev };
// "gpipe" | "1f1b" | "interleaved" | "zb" | "zbv" | "dualpipev"
std::optional<PipelineSchedule> parse_pipeline_schedule(std::string_view name);
const char* pipeline_schedule_name(PipelineSchedule s);
// Every name parse_pipeline_schedule accepts, in the order above, for messages and the config schema.
const std::vector<std::string>& pipeline_schedule_names();

// Where a schedule puts its chunks (see "Chunks" above).
enum class ChunkPlacement { looped, v };
ChunkPlacement chunk_placement(PipelineSchedule s);
// The placement of a parallel.pipeline_schedule name; an unknown name (refused elsewhere) is looped.
ChunkPlacement chunk_placement(std::string_view schedule_name);
// The chunks per rank a schedule runs for parallel.virtual_stages = requested: zbv and dualpipev always run
// two (they take 1, the default, or 2 and mean 2), the others what was asked. resolve_layout applies it, so
// a Layout's virtual_stages is what runs; check_schedule_spec refuses what cannot run.
int scheduled_virtual_stages(PipelineSchedule s, int requested);
// The fewest micro-batches per step a schedule runs at pp (1 without a pipeline; pp for the others, a
// multiple of it for interleaved; 2·pp for dualpipev, DeepSeek's DualPipeV asserting num_chunks ≥ 2·ranks).
int min_microbatches(PipelineSchedule s, int pp);

enum class ActionKind {
  F,          // forward of (micro-batch, chunk)
  B,          // backward for the input gradient only (what the previous chunk waits for)
  W,          // backward for the weight gradient (deferrable)
  BW,         // fused B and W
  send_act,   // output activation of F(mb, chunk), to the rank of chunk+1
  recv_act,   // output activation of F(mb, chunk) from its rank, for F(mb, chunk+1) here
  send_grad,  // input gradient from B(mb, chunk), to the rank of chunk−1
  recv_grad,  // input gradient from B(mb, chunk) on its rank, for B(mb, chunk−1) here
};
const char* action_name(ActionKind k);  // "F", "B", "W", "BW", "send_act", ...

// One entry of a rank's list. For sends and receives, `chunk` is always the chunk that produced the
// tensor (so a send and its receive carry the same (kind family, mb, chunk)), and `peer` the other rank.
struct Action {
  ActionKind kind;
  int microbatch = 0;
  int chunk = 0;
  int peer = -1;  // pipeline rank of the other side of a send/receive; -1 for compute
  bool operator==(const Action&) const = default;
};
std::string action_text(const Action& a);  // "F(mb=3, chunk=1)", "send_act(mb=3, chunk=1 -> rank 2)"

inline int chunk_rank(int chunk, int pp, ChunkPlacement placement) {
  return placement == ChunkPlacement::v && chunk >= pp ? 2 * pp - 1 - chunk : chunk % pp;
}
inline int chunk_virtual_stage(int chunk, int pp) { return chunk / pp; }

struct ScheduleSpec {
  PipelineSchedule kind = PipelineSchedule::one_f_one_b;
  int pp = 1;
  int virtual_stages = 1;  // V; >= 2 with interleaved, 2 with zbv and dualpipev, else 1
  int microbatches = 1;    // m per optimizer step
  int rank_of(int chunk) const { return chunk_rank(chunk, pp, chunk_placement(kind)); }
};

struct ScheduleTable {
  ScheduleSpec spec;
  std::vector<std::vector<Action>> ranks;  // [pp][i]: rank's actions in execution order
  int chunks() const { return spec.pp * spec.virtual_stages; }
};

// The size bound of every schedule meshrun generates or simulates outside the trainer: micro-batches per
// step × pipeline chunks (pp·virtual_stages). `meshrun plan --schedule` draws every slot's F, B, W and
// transfers; the planner (`--estimate`, `--search`) simulates the table. 65,536 slots is a 2 MB table and a
// 21 MB SVG (llama3-70b: 256 slots); a 2^30 batch would otherwise grow to gigabytes. Checked before
// anything is generated.
inline constexpr int64_t kMaxScheduleSlots = int64_t(1) << 16;
struct ScheduleSize {
  int64_t microbatches = 0;  // global_batch ÷ (dp · micro_batch_size)
  int64_t chunks = 0;        // pp · virtual_stages
  int64_t slots = 0;         // their product, saturating
  bool fits() const { return slots <= kMaxScheduleSlots; }
};
ScheduleSize schedule_size(int64_t global_batch, int64_t micro_batch_size, int64_t dp, int64_t pp,
                           int64_t virtual_stages);
// "" when the size is within kMaxScheduleSlots, else one line: "training.global_batch_size = N gives M
// micro-batches per step (÷ dp D × training.micro_batch_size B) over C pipeline chunks, S schedule slots;
// <who> at most 65536: lower training.global_batch_size or raise training.micro_batch_size". The one
// check --schedule and the planner share; callers add the key's origin and their context.
std::string schedule_size_problem(int64_t global_batch, int64_t micro_batch_size, int64_t dp, int64_t pp,
                                  int64_t virtual_stages, std::string_view who);

// One "<problem>; <fix>" line if the combination cannot be scheduled (e.g. virtual_stages > 1 without
// interleaved, interleaved with V < 2 or m not a multiple of pp, m < pp), else "".
std::string check_schedule_spec(const ScheduleSpec& spec);

// The table of a valid spec (check_schedule_spec(spec) == ""); throws std::invalid_argument otherwise.
ScheduleTable generate_schedule(const ScheduleSpec& spec);

// Every problem of a table, one line each naming the rank and the action: a compute action before its
// dependencies (F(m,c) needs F(m,c−1) on the same rank or a receive of it; B(m,c) needs F(m,c) and
// B(m,c+1) or its receive; W(m,c) needs B(m,c)), a missing or duplicated F/B/W (or BW), a send without its
// receive or the reverse, a peer that is not the producing/consuming rank, sends from a to b in another
// order than b's receives from a (the first differing message per pair, counted from 0), and deadlock
// under the semantics above (the message names the blocked actions). Empty = valid.
std::vector<std::string> validate_schedule(const ScheduleTable& table);

// When a rank may reuse a buffer it sent from without waiting on its peer (a blocking wait there could
// deadlock a schedule whose receiver takes the message late, e.g. DualPipeV): for every send of rank r (by its
// index in r's list), the first index of r's list from which r knows the transfer is done — its receiver
// finished the matching receive before posting a send that r has received by then (happens-before through
// the table's own messages) — or the list's size when r does not learn it within the step; −1 for actions
// that are not sends. forward_only: the same for the table's F and activation transfers alone (what
// evaluation runs). Needs a valid table (validate_schedule empty); throws std::invalid_argument otherwise.
std::vector<std::vector<int>> sends_known_received(const ScheduleTable& table, bool forward_only = false);

// Costs for the simulator, in any unit. Per chunk (index = chunk) or one value for all when size 1.
struct ScheduleCosts {
  std::vector<double> f{1.0}, b{1.0}, w{1.0};
  double transfer = 0.0;  // from a send's start to the moment the receive can complete
  // BW costs b + w.
};

struct TimedAction {
  int index = 0;        // into the rank's action list
  double start = 0, end = 0;
};

struct Timeline {
  std::vector<std::vector<TimedAction>> ranks;  // compute actions only, in execution order
  double makespan = 0;
  std::vector<double> idle;                     // per rank: makespan − busy compute time
  double bubble_fraction = 0;                   // Σ idle / (pp · makespan)
  // Live activation slots: (micro-batch, chunk) is live on its rank from its F until its W (or BW)
  // finishes. Peak over time per rank, and the maximum over ranks.
  std::vector<int> peak_live_per_rank;
  int peak_live_microbatches = 0;
};

// Requires a valid table (validate_schedule empty); throws std::invalid_argument otherwise.
Timeline simulate_schedule(const ScheduleTable& table, const ScheduleCosts& costs);

// simulate_schedule without its validation, for a caller that validated the table once and simulates it
// many times (the planner's cache). An invalid table gives a meaningless timeline (an index out of range
// still throws std::invalid_argument).
Timeline simulate_validated_schedule(const ScheduleTable& table, const ScheduleCosts& costs);

// simulate_validated_schedule's makespan and idle per rank without the rest of the timeline (no per-action
// times, no live slots): the same event loop, for a caller that only needs the bubble of many costings (the
// planner's search). Same requirements and exceptions.
struct ScheduleMakespan {
  double makespan = 0;
  std::vector<double> idle;  // per rank: makespan − busy compute time
};
ScheduleMakespan simulate_validated_makespan(const ScheduleTable& table, const ScheduleCosts& costs);

}  // namespace meshrun
