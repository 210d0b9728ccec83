// The cost model's shared parts: layer placement, links per axis, the model constants, link bandwidth.
// Memory is in cost_memory.cpp, step time in cost_time.cpp; equations in docs/planner.md.
#include "cost.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "meshrun/config.hpp"

namespace meshrun::planner::detail {

std::optional<StageLayers> stage_layers(int layers, int pp, int virtual_stages, ChunkPlacement placement) {
  auto chunks = chunk_layers(layers, pp * virtual_stages);
  if (!chunks) return std::nullopt;
  StageLayers s;
  std::vector<int> on_rank(pp, 0);
  for (int c = 0; c < pp * virtual_stages; ++c) on_rank[chunk_rank(c, pp, placement)] += (*chunks)[c];
  for (int r = 0; r < pp; ++r) {
    const int sum = on_rank[r];
    if (r == 0) s.first = sum;
    if (r == pp - 1) s.last = sum;
    s.max = std::max(s.max, sum);
  }
  return s;
}

AxisLinks axis_links(const Layout& layout, const Cluster& cluster, int cp_group) {
  // Rank 0's group contains rank 0, so under block placement (rank r on slot r) the group stays inside one
  // NVLink domain / node exactly when its largest member does.
  RankGrid grid(layout);
  const int gpn = std::max(1, cluster.gpus_per_node);
  auto link = [&](int group_size, int64_t max_member) {
    return group_size <= 1 ? Link::self : link_between(cluster, 0, max_member);
  };
  auto span = [&](Axis a, int size) { return int64_t(size - 1) * grid.stride(a); };
  auto largest = [&](GroupKind kind) {  // expert groups fold into cp·dp: enumerate (they are small or ep = 1)
    std::vector<int> g = grid.group_of(0, kind);
    return int64_t(g.back());
  };
  // Islands (NVLink domains, else nodes: contiguous blocks of `unit` ranks) spanned by rank 0's group.
  // Members of a dense group are i·s_inner + j·s_outer; counted arithmetically where the strides allow
  // (a member at least `unit` above another is on a later island), else by enumerating the group.
  const int64_t unit = cluster.nvlink_domain_gpus > 1 ? cluster.nvlink_domain_gpus : gpn;
  auto enumerate = [&](GroupKind kind) {
    int count = 0;
    int64_t previous = -1;
    for (int r : grid.group_of(0, kind))
      if (r / unit != previous) ++count, previous = r / unit;
    return count;
  };
  auto islands = [&](GroupKind kind, int n_in, int64_t s_in, int n_out, int64_t s_out) {
    if (n_in * int64_t(n_out) <= 1) return 1;
    if (n_in == 1) n_in = n_out, s_in = s_out, n_out = 1, s_out = 0;
    if (n_out > 1 && s_out < s_in) std::swap(n_in, n_out), std::swap(s_in, s_out);
    if (s_in >= unit) return n_in * n_out;
    if (unit % s_in == 0 && (n_out == 1 || s_out % unit == 0)) return n_out * int(((n_in - 1) * s_in) / unit + 1);
    return enumerate(kind);
  };
  const int64_t s_tp = grid.stride(Axis::tp), s_cp = grid.stride(Axis::cp), s_dp = grid.stride(Axis::dp);
  AxisLinks l;
  l.tp_islands = islands(GroupKind::tp, layout.tp, s_tp, 1, 0);
  l.cp_islands = islands(GroupKind::cp, layout.cp, s_cp, 1, 0);
  l.dp_islands = islands(GroupKind::dp_cp, layout.cp, s_cp, layout.dp, s_dp);
  l.ep_islands = layout.ep > 1 ? enumerate(GroupKind::ep) : 1;  // expert groups fold into cp·dp
  l.edp_islands = layout.ep > 1 ? enumerate(GroupKind::edp) : l.dp_islands;
  l.tp = link(layout.tp, span(Axis::tp, layout.tp));
  l.cp = link(layout.cp, span(Axis::cp, layout.cp));
  l.cp_group = link(cp_group, span(Axis::cp, std::clamp(cp_group, 1, layout.cp)));  // consecutive CP ranks
  l.pp = link(layout.pp, span(Axis::pp, layout.pp));
  const int64_t dp_cp_max = span(Axis::cp, layout.cp) + span(Axis::dp, layout.dp);
  l.dp = link(layout.cp * layout.dp, dp_cp_max);
  l.ep = layout.ep > 1 ? link(layout.ep, largest(GroupKind::ep)) : Link::self;
  l.edp = layout.ep > 1 ? link(layout.cp * layout.dp / layout.ep, largest(GroupKind::edp)) : l.dp;
  return l;
}

namespace {
int bytes_of(const std::string& dtype, const char* key) {
  int b = dtype_bytes(dtype);
  if (b == 0)
    throw ConfigError(std::string("training.") + key + " = \"" + dtype +
                      "\" is not a dtype the planner knows; use bf16, fp16, fp32 or fp8");
  return b;
}
}  // namespace

bool gpu_run(const JobConfig& cfg) {
  if (cfg.training.device == "cuda") return true;
  if (!cfg.cluster.gpu.empty() || cfg.cluster.gpu_bf16_tflops > 0) return true;  // the template names its GPUs
  const NodeType* type = find_node_type(cfg.cluster.node_type);
  return type && type->gpu != "generic";  // a GPU node type: the run is planned for its GPUs, whatever trainer runs it
}

int activation_dtype_bytes(const JobConfig& cfg) {
  const TrainingSpec& t = cfg.training;
  if (gpu_run(cfg)) return bytes_of(t.param_dtype, "param_dtype");  // the CUDA backend stores param_dtype
  if (t.dtype == "fp32" || t.dtype == "fp64" || t.dtype == "bf16") return dtype_bytes(t.dtype);
  throw ConfigError("training.dtype = \"" + t.dtype + "\" is not a precision meshrun-train runs on " + t.device +
                    "; use fp32, fp64 or bf16");
}

int statistics_dtype_bytes(const JobConfig& cfg) { return !gpu_run(cfg) && cfg.training.dtype == "fp64" ? 8 : 4; }

namespace {
double checked_imbalance(const PlannerSpec& planner) {
  // The config layer refuses < 1 in a template; a JobConfig built in code reaches here unchecked.
  if (!(planner.expert_imbalance >= 1.0 && std::isfinite(planner.expert_imbalance))) {
    std::ostringstream what;
    what << "planner.expert_imbalance = " << planner.expert_imbalance
         << " is not a ratio of the busiest expert's tokens to the mean; use a number >= 1 (1 = balanced)";
    throw ConfigError(what.str());
  }
  return planner.expert_imbalance;
}
}  // namespace

CostModel::CostModel(const JobConfig& cfg, const Hardware& hw)
    : m_(cfg.model), hw_(hw), k_(hw.constants), seq_(cfg.training.seq_len),
      global_batch_(cfg.training.global_batch_size),
      cp_spec_(cfg.parallel),
      cp_ring_(cfg.parallel.cp_comm != "allgather"),
      pb_(bytes_of(cfg.training.param_dtype, "param_dtype")),
      gb_(bytes_of(cfg.training.grad_dtype, "grad_dtype")),
      ob_(bytes_of(cfg.training.optim_dtype, "optim_dtype")),
      act_(activation_dtype_bytes(cfg)),
      stat_(statistics_dtype_bytes(cfg)),
      imbalance_(checked_imbalance(cfg.planner)),
      fused_head_(cfg.planner.fused_head),
      p_(count_params(cfg.model)),
      params_total_(p_.total(cfg.model.layers)),
      capacity_(hw.memory_gib * double(1 << 30)),
      model_flops_step_(model_flops_per_token(cfg.model, seq_) * double(seq_) * global_batch_),
      pipeline_(cfg.model.layers) {}

double CostModel::ring_latency(int n, int islands, Link link) const {
  if (n <= 1 || link == Link::self) return 0.0;
  const double intra = hw_.nvlink_gbps > 0 ? k_.hop_latency_nvlink_s : k_.hop_latency_pcie_s;
  const double inside = link == Link::pcie ? k_.hop_latency_pcie_s : intra;
  islands = std::clamp(islands, 1, n);
  return k_.collective_base_latency_s + double(n - islands) * inside + double(islands - 1) * k_.hop_latency_network_s +
         (hw_.core_share > 1 ? k_.shared_core_latency_s : 0.0);
}

double CostModel::p2p_latency(Link link) const {
  if (link == Link::self) return 0.0;
  const double hop = link == Link::network ? k_.hop_latency_network_s
                     : link == Link::pcie  ? k_.hop_latency_pcie_s
                                           : k_.hop_latency_nvlink_s;
  return k_.collective_base_latency_s + hop + (hw_.core_share > 1 ? k_.shared_core_latency_s : 0.0);
}

double CostModel::bandwidth(Link link) const {
  double gbps = 0;
  switch (link) {
    case Link::self: return std::numeric_limits<double>::infinity();
    case Link::nvlink: gbps = hw_.nvlink_gbps > 0 ? hw_.nvlink_gbps : hw_.pcie_gbps; break;
    case Link::pcie: gbps = hw_.pcie_gbps; break;
    case Link::network: gbps = hw_.nic_gbps_per_gpu; break;
  }
  return std::max(gbps, 1e-3) * 1e9 * k_.network_efficiency;
}

double CostModel::collective_bandwidth(Link link) const { return bandwidth(link) * hw_.collective_link_ratio; }

}  // namespace meshrun::planner::detail
