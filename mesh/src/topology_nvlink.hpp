// NVLink connectivity from hwloc's NVLinkBandwidth matrix or from NVML answers. Private to mesh/src.
#pragma once
#include <hwloc.h>

#include <string>
#include <vector>

#include "meshrun/topology.hpp"
#include "nvml_query.hpp"

namespace meshrun {

// MB/s per link that hwloc's NVML backend writes for a GPU (PCI device id) and hwloc release; 0 = unknown.
double per_link_mbps(unsigned device_id, const std::string& hwloc_version);
// Fills info->links (and source "hwloc") when the topology has an NVLinkBandwidth matrix; else leaves it.
void nvlink_from_hwloc(hwloc_topology_t t, const std::vector<hwloc_obj_t>& gpu_objs,
                       const std::vector<unsigned>& device_ids, const std::string& version, NvlinkInfo* info);
// Links and fabric (multi-node NVLink) facts from NVML, matched to the topology's GPUs by PCI id.
void nvlink_from_nvml(const std::vector<NvmlGpu>& nv, const std::vector<TopoGpu>& gpus, NvlinkInfo* info);
// GPUs reachable over NVLink from the best-connected GPU, itself included (1 = no NVLink).
int local_domain(const NvlinkInfo& info);

}  // namespace meshrun
