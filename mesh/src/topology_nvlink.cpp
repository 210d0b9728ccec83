// NVLink connectivity and link counts (topology-nccl.md section 5): the matrix gives connectivity and counts,
// never bandwidth (hwloc 2.9.0 doubled NVLink3/4).
#include "topology_nvlink.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace meshrun {

// MB/s per NVLink that hwloc's NVML backend writes, by GPU generation (PCI device id) and hwloc release:
// 2.9.0 wrote NVLink3/4 at the bidirectional 50000 (topology-nccl.md section 5). 0 = unknown generation.
double per_link_mbps(unsigned device_id, const std::string& hwloc_version) {
  const bool doubled = hwloc_version.rfind("2.9.0", 0) == 0;
  switch (device_id >> 8) {
    case 0x15: return 20000;                       // P100, NVLink1
    case 0x1d: return 25000;                       // V100, NVLink2
    case 0x20: case 0x23: return doubled ? 50000 : 25000;  // A100 NVLink3, H100/H200 NVLink4
    case 0x29: return 50000;                       // B200/GB200, NVLink5
    default: return 0;
  }
}

namespace {

int links_from_value(double value, double per_link) {
  if (value <= 0) return 0;
  if (per_link <= 0) return 1;  // connected, count unknown
  return std::max(1, static_cast<int>(std::lround(value / per_link)));
}

}  // namespace

// Connectivity from a (possibly heterogeneous) NVLinkBandwidth matrix: direct GPU-GPU links plus, through
// NVSwitches, the smaller of the two GPUs' link counts to each switch.
void nvlink_from_hwloc(hwloc_topology_t t, const std::vector<hwloc_obj_t>& gpu_objs,
                       const std::vector<unsigned>& device_ids, const std::string& version, NvlinkInfo* info) {
  unsigned nr = 1;
  hwloc_distances_s* d = nullptr;
  if (hwloc_distances_get_by_name(t, "NVLinkBandwidth", &nr, &d, 0) != 0 || nr == 0 || !d) return;
  const size_t g = gpu_objs.size();
  std::vector<int> gpu_at(d->nbobjs, -1);
  std::vector<bool> is_switch(d->nbobjs, false);
  for (unsigned i = 0; i < d->nbobjs; ++i) {
    hwloc_obj_t o = d->objs[i];
    hwloc_obj_t pci = o->type == HWLOC_OBJ_OS_DEVICE ? o->parent : o;
    auto it = std::find(gpu_objs.begin(), gpu_objs.end(), pci);
    if (it != gpu_objs.end()) gpu_at[i] = static_cast<int>(it - gpu_objs.begin());
    else is_switch[i] = pci && pci->type == HWLOC_OBJ_PCI_DEVICE;  // NVSwitch; Packages (POWER) are not
  }
  info->links.assign(g, std::vector<int>(g, 0));
  std::map<unsigned, std::vector<int>> to_switch;  // switch matrix index -> links per GPU
  for (unsigned i = 0; i < d->nbobjs; ++i) {
    if (gpu_at[i] < 0) continue;
    const double per = per_link_mbps(device_ids[gpu_at[i]], version);
    for (unsigned j = 0; j < d->nbobjs; ++j) {
      if (i == j) continue;
      const double v = static_cast<double>(d->values[i * d->nbobjs + j]);
      if (gpu_at[j] >= 0) info->links[gpu_at[i]][gpu_at[j]] = links_from_value(v, per);
      else if (is_switch[j]) {
        auto& row = to_switch[j];
        row.resize(g, 0);
        row[gpu_at[i]] = links_from_value(v, per);
      }
    }
  }
  hwloc_distances_release(t, d);
  for (auto& [sw, row] : to_switch)
    for (size_t a = 0; a < g; ++a)
      for (size_t b = 0; b < g; ++b)
        if (a != b) info->links[a][b] += std::min(row[a], row[b]);
  info->source = "hwloc";
}

void nvlink_from_nvml(const std::vector<NvmlGpu>& nv, const std::vector<TopoGpu>& gpus, NvlinkInfo* info) {
  const size_t g = gpus.size();
  std::vector<int> of(nv.size(), -1);
  for (size_t i = 0; i < nv.size(); ++i)
    for (size_t k = 0; k < g; ++k)
      if (gpus[k].pci == nv[i].pci) of[i] = static_cast<int>(k);
  info->links.assign(g, std::vector<int>(g, 0));
  std::vector<int> switch_links(g, 0);
  for (size_t i = 0; i < nv.size(); ++i) {
    if (of[i] < 0) continue;
    for (const auto& l : nv[i].links) {
      if (l.remote_is_switch) {
        ++switch_links[of[i]];
        continue;
      }
      for (size_t k = 0; k < g; ++k)
        if (gpus[k].pci == l.remote_pci && static_cast<int>(k) != of[i]) ++info->links[of[i]][k];
    }
    if (nv[i].fabric_known && !info->fabric_complete) {
      info->fabric_cluster_uuid = nv[i].cluster_uuid;
      info->fabric_clique_id = nv[i].clique_id;
      info->fabric_complete = nv[i].fabric_complete && !nv[i].cluster_uuid.empty();
    }
  }
  for (size_t a = 0; a < g; ++a)
    for (size_t b = 0; b < g; ++b)
      if (a != b) info->links[a][b] += std::min(switch_links[a], switch_links[b]);
  info->source = "nvml";
}

int local_domain(const NvlinkInfo& info) {
  int best = 1;
  for (const auto& row : info.links)
    best = std::max(best, 1 + static_cast<int>(std::count_if(row.begin(), row.end(), [](int v) { return v > 0; })));
  return best;
}

}  // namespace meshrun
