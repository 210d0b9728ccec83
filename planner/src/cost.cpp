// The cost model's shared parts: layer placement, links per axis, the model constants, link bandwidth.
// Memory is in cost_memory.cpp, step time in cost_time.cpp; equations in docs/planner.md.
#include "cost.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshrun/config.hpp"

namespace meshrun::planner::detail {

std::optional<StageLayers> stage_layers(int layers, int pp, int virtual_stages) {
  auto chunks = chunk_layers(layers, pp * virtual_stages);
  if (!chunks) return std::nullopt;
  StageLayers s;
  for (int r = 0; r < pp; ++r) {
    int sum = 0;
    for (int k = 0; k < virtual_stages; ++k) sum += (*chunks)[r + k * pp];
    if (r == 0) s.first = sum;
    if (r == pp - 1) s.last = sum;
    s.max = std::max(s.max, sum);
  }
  return s;
}

AxisLinks axis_links(const Layout& layout, const Cluster& cluster) {
  // Rank 0's group contains rank 0, so under block placement (rank r on slot r) the group stays inside one
  // NVLink domain / node exactly when its largest member does.
  RankGrid grid(layout);
  const int gpn = std::max(1, cluster.gpus_per_node);
  auto link = [&](int group_size, int64_t max_member) {
    if (group_size <= 1) return Link::self;
    const int node = int(max_member / gpn), local = int(max_member % gpn);
    if (cluster.nvlink_domain_gpus > 1 && cluster.nvlink_domain_of(node, local) == cluster.nvlink_domain_of(0, 0))
      return Link::nvlink;
    return node == 0 ? Link::pcie : Link::network;
  };
  auto span = [&](Axis a, int size) { return int64_t(size - 1) * grid.stride(a); };
  auto largest = [&](GroupKind kind) {  // expert groups fold into cp·dp: enumerate (they are small or ep = 1)
    std::vector<int> g = grid.group_of(0, kind);
    return int64_t(g.back());
  };
  AxisLinks l;
  l.tp = link(layout.tp, span(Axis::tp, layout.tp));
  l.cp = link(layout.cp, span(Axis::cp, layout.cp));
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

CostModel::CostModel(const JobConfig& cfg, const Hardware& hw)
    : m_(cfg.model), hw_(hw), k_(cost_constants()), seq_(cfg.training.seq_len),
      global_batch_(cfg.training.global_batch_size),
      pb_(bytes_of(cfg.training.param_dtype, "param_dtype")),
      gb_(bytes_of(cfg.training.grad_dtype, "grad_dtype")),
      ob_(bytes_of(cfg.training.optim_dtype, "optim_dtype")),
      p_(count_params(cfg.model)),
      params_total_(p_.total(cfg.model.layers)),
      capacity_(hw.memory_gib * double(1 << 30)),
      model_flops_step_(model_flops_per_token(cfg.model, seq_) * double(seq_) * global_batch_) {}

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

}  // namespace meshrun::planner::detail
