// A node's GPUs, NICs, NVLink and CPU locality, read with hwloc 2.x (live machine or an hwloc XML export),
// completed at run time by NVML (dlopen'ed, nothing links the driver) or by the declared node type.
//
// GPU indices are PCI bus order, which is nvidia-smi's order and CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID
// (the task environment sets it); Slurm's gres indices follow the same order with AutoDetect=nvml.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshrun/bounded_file.hpp"
#include "meshrun/layout.hpp"

namespace meshrun {

// A set of logical CPUs (Linux processor numbers = hwloc PU os_index), ascending, no duplicates.
struct CpuSet {
  std::vector<int> cpus;
  bool empty() const { return cpus.empty(); }
  int count() const { return static_cast<int>(cpus.size()); }
  std::string str() const;  // Linux list format "0-55,112-167"; "" when empty
  bool operator==(const CpuSet&) const = default;
};
// Parses the list format ("0-3,8,10-11"); nullopt on malformed text.
std::optional<CpuSet> parse_cpuset(const std::string& text);
CpuSet cpuset_intersect(const CpuSet& a, const CpuSet& b);

// nvidia-smi topo -m ladder, closest first. nvl is used only in the GPU x GPU view.
enum class PathLevel { self, nvl, pix, pxb, phb, node, sys };
const char* path_level_name(PathLevel l);  // "X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"

struct TopoGpu {
  int index = 0;          // PCI bus order on this node
  std::string pci;        // "0000:1b:00.0"
  std::string model;      // PCI device name from hwloc ("GH100 [H100 SXM5 80GB]") or "[10de:2330]"
  int numa = -1;          // os_index of the nearest NUMA node, -1 unknown
  CpuSet cpus;            // CPUs of the GPU's non-I/O ancestor
  std::vector<std::string> osdevs;  // "nvml0", "cuda0" where the site's hwloc has those components
  unsigned pci_device_id = 0;       // 0x2330 (H100 SXM5); 0 when unknown (hand-built topologies)
};

// CUDA compute capability major of an NVIDIA data-centre GPU: 7 Volta, 8 Ampere, 9 Hopper, 10 Blackwell; 0 when
// unknown. From the PCI device id (GV100 1db0-1dbf, GA100 20b0-20bf, GH100 2320-233f, GB100/GB200 2900-29ff),
// else the model name (V100, A100/A800/A30, H100/H200/H800/GH200, B100/B200/B300/GB200), else a node type's GPU
// key ("h100-sxm", "a100-80gb", "gb200").
int gpu_arch_major(unsigned pci_device_id, const std::string& model_or_key);

struct TopoNic {
  std::string name;       // RDMA device ("mlx5_3")
  std::string pci;        // "0000:40:00.0"
  std::string netdev;     // network interface on the same PCI function ("ibp64s0"), "" if none
  std::string link;       // "InfiniBand" / "Ethernet" (from the PCI class) or ""
  int port_state = -1;    // hwloc's Port1State (IB port state: 4 ACTIVE, 1 DOWN), -1 unknown
  int numa = -1;
  CpuSet cpus;
};

// NVLink facts: from hwloc's NVLinkBandwidth matrix, NVML, or the declared node type.
struct NvlinkInfo {
  std::string source = "none";       // "hwloc", "nvml", "node-type", "none"
  std::vector<std::vector<int>> links;  // [gpu][gpu] direct NVLink count (or 1 = "connected" when counts
                                        // are unknown, e.g. through NVSwitch from the node type); 0 = none
  int domain_gpus = 1;               // GPUs reachable over NVLink, this node and beyond (72 on GB200 NVL72)
  std::string fabric_cluster_uuid;   // NVML GPU fabric info (multi-node NVLink), "" if unknown
  int fabric_clique_id = -1;
  bool fabric_complete = false;      // NVML fabric state COMPLETED with success status
};

struct NodeTopology {
  std::string source;                // "live" or the XML path
  std::string hostname;              // hwloc's HostName info, "" if absent
  CpuSet machine_cpus;               // every CPU of the node
  int numa_nodes = 0;
  std::vector<TopoGpu> gpus;
  std::vector<TopoNic> nics;         // RDMA-capable NICs (InfiniBand/RoCE), PCI order
  std::vector<std::string> eth_netdevs;  // network interfaces not backing an RDMA NIC ("eno1"), PCI order
  std::vector<std::vector<PathLevel>> gpu_gpu;  // PCI path between GPUs (nvl where NVLink connects them)
  std::vector<std::vector<PathLevel>> gpu_nic;  // [gpu][nic]
  std::vector<int> nic_of_gpu;       // pairing: NIC index per GPU, -1 when the node has no NIC
  NvlinkInfo nvlink;
};

// Topology loading failed (unreadable XML, hwloc error). what() is one line naming the fix.
struct TopologyError : std::runtime_error {
  explicit TopologyError(const std::string& message) : std::runtime_error(cut_long_values(message)) {}
};

struct TopologyRequest {
  std::string xml_path;              // empty = the live machine (I/O discovery on)
  bool use_nvml = true;              // query NVML at run time when the live machine has NVIDIA GPUs
  const NodeType* node_type = nullptr;  // fallback for NVLink when neither hwloc nor NVML tell
};
NodeTopology load_topology(const TopologyRequest& request);

// Pure parts, exposed for tests.
// Pairs GPUs with NICs. cost[g][n] orders closeness (path_cost()); each GPU in index order takes its cheapest
// NIC, among equally cheap ones the least loaded, then the lowest index: one NIC per GPU where the hardware
// allows, shared fairly otherwise.
std::vector<int> pair_gpus_with_nics(const std::vector<std::vector<int>>& cost);
// Closeness of two devices: the ladder level first, then the depth of their common ancestor (deeper = closer;
// it separates "same socket" from "other socket" when both are SYS on sub-NUMA-clustered CPUs).
inline int path_cost(PathLevel level, int common_ancestor_depth) {
  return static_cast<int>(level) * 1000 + (999 - (common_ancestor_depth < 999 ? common_ancestor_depth : 999));
}
// The node-type fallback: every GPU of the node connected when the type has an NVLink domain.
NvlinkInfo nvlink_from_node_type(const NodeType& type, int gpus);

// One rank's view for `meshrun plan --topology`.
struct RankDescription {
  int gpu = -1;
  std::string gpu_pci;
  std::string nic;          // "" when none
  std::string nic_level;    // "PIX" ...
  std::string cpus;         // cpuset list
  int numa = -1;
};
RankDescription describe_rank(const NodeTopology& topo, int local_rank);

// The node's compute NICs: every NIC paired with one of its GPUs, each once in NIC order (storage and other
// unpaired ports excluded). NCCL_IB_HCA is "=" + this list, the same on every rank of the node by default.
std::vector<std::string> node_hca_list(const NodeTopology& topo);

// Rendering for `meshrun topo`.
std::string topology_table(const NodeTopology& topo);
std::string topology_json(const NodeTopology& topo);

}  // namespace meshrun
