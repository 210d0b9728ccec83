// Human and JSON views of a node topology (`meshrun topo`, `meshrun plan --topology`).
#include <cstdio>

#include "meshrun/json.hpp"
#include "meshrun/topology.hpp"

namespace meshrun {
namespace {

std::string pad(std::string s, size_t w) {
  s.append(s.size() < w ? w - s.size() : 1, ' ');  // always at least one space between columns
  return s;
}

// One cell of the GPU x GPU matrix: X, NV# (link count; plain NV when only "connected" is known), or the PCI level.
std::string gpu_cell(const NodeTopology& t, size_t a, size_t b) {
  if (a == b) return "X";
  if (!t.nvlink.links.empty() && t.nvlink.links[a][b] > 0)
    return t.nvlink.source == "node-type" ? "NV" : "NV" + std::to_string(t.nvlink.links[a][b]);
  return path_level_name(t.gpu_gpu[a][b]);
}

std::string nic_of(const NodeTopology& t, size_t g) {
  return t.nic_of_gpu.empty() || t.nic_of_gpu[g] < 0 ? "" : t.nics[t.nic_of_gpu[g]].name;
}
std::string nic_level(const NodeTopology& t, size_t g) {
  return t.nic_of_gpu.empty() || t.nic_of_gpu[g] < 0 ? "" : path_level_name(t.gpu_nic[g][t.nic_of_gpu[g]]);
}

}  // namespace

RankDescription describe_rank(const NodeTopology& topo, int local_rank) {
  RankDescription d;
  if (local_rank < 0 || local_rank >= static_cast<int>(topo.gpus.size())) return d;
  const TopoGpu& g = topo.gpus[local_rank];
  d.gpu = g.index;
  d.gpu_pci = g.pci;
  d.nic = nic_of(topo, local_rank);
  d.nic_level = nic_level(topo, local_rank);
  d.cpus = g.cpus.str();
  d.numa = g.numa;
  return d;
}

std::string topology_table(const NodeTopology& t) {
  std::string out = "Topology: " + t.source + (t.hostname.empty() ? "" : " (host " + t.hostname + ")") + ", " +
                    std::to_string(t.machine_cpus.count()) + " CPUs, " + std::to_string(t.numa_nodes) +
                    " NUMA nodes\n";
  if (t.gpus.empty()) {
    out += "No NVIDIA GPU found (PCI class 0300/0302, vendor 10de).\n";
  } else {
    out += "\nGPUs\n  " + pad("idx", 5) + pad("pci", 14) + pad("numa", 6) + pad("cpus", 22) + pad("nic", 10) +
           pad("path", 6) + "model\n";
    for (size_t g = 0; g < t.gpus.size(); ++g) {
      const auto& x = t.gpus[g];
      out += "  " + pad(std::to_string(x.index), 5) + pad(x.pci, 14) + pad(std::to_string(x.numa), 6) +
             pad(x.cpus.str(), 22) + pad(nic_of(t, g), 10) + pad(nic_level(t, g), 6) + x.model + "\n";
    }
  }
  if (!t.nics.empty()) {
    out += "\nNICs (RDMA)\n  " + pad("idx", 5) + pad("name", 10) + pad("pci", 14) + pad("netdev", 12) +
           pad("link", 12) + pad("numa", 6) + "port\n";
    for (size_t n = 0; n < t.nics.size(); ++n) {
      const auto& x = t.nics[n];
      out += "  " + pad("NIC" + std::to_string(n), 5) + pad(x.name, 10) + pad(x.pci, 14) +
             pad(x.netdev.empty() ? "-" : x.netdev, 12) + pad(x.link, 12) + pad(std::to_string(x.numa), 6) +
             (x.port_state < 0 ? "-" : x.port_state == 4 ? "ACTIVE" : x.port_state == 1 ? "DOWN"
                                                                                    : std::to_string(x.port_state)) +
             "\n";
    }
  } else {
    out += "\nNo InfiniBand/RoCE NIC";
    out += t.eth_netdevs.empty() ? ".\n" : "; Ethernet interfaces: " + [&] {
      std::string s;
      for (const auto& e : t.eth_netdevs) s += (s.empty() ? "" : ",") + e;
      return s;
    }() + "\n";
  }
  if (t.gpus.empty()) return out;

  out += "\nMatrix (nvidia-smi topo -m legend: X self, NV# NVLinks, PIX one PCIe switch, PXB several switches,\n"
         "        PHB host bridge, NODE across host bridges in a NUMA node, SYS across NUMA nodes)\n       ";
  for (size_t g = 0; g < t.gpus.size(); ++g) out += pad("GPU" + std::to_string(g), 6);
  for (size_t n = 0; n < t.nics.size(); ++n) out += pad("NIC" + std::to_string(n), 6);
  out += "CPU Affinity          NUMA\n";
  for (size_t a = 0; a < t.gpus.size(); ++a) {
    out += "  " + pad("GPU" + std::to_string(a), 5);
    for (size_t b = 0; b < t.gpus.size(); ++b) out += pad(gpu_cell(t, a, b), 6);
    for (size_t n = 0; n < t.nics.size(); ++n) out += pad(path_level_name(t.gpu_nic[a][n]), 6);
    out += pad(t.gpus[a].cpus.str(), 22) + std::to_string(t.gpus[a].numa) + "\n";
  }
  out += "\nNVLink: " + t.nvlink.source + ", domain of " + std::to_string(t.nvlink.domain_gpus) + " GPU(s)";
  if (!t.nvlink.fabric_cluster_uuid.empty())
    out += ", fabric cluster " + t.nvlink.fabric_cluster_uuid + " clique " + std::to_string(t.nvlink.fabric_clique_id) +
           (t.nvlink.fabric_complete ? " (ready)" : " (not ready)");
  out += "\nPairing:";
  for (size_t g = 0; g < t.gpus.size(); ++g)
    out += " GPU" + std::to_string(g) + "->" + (nic_of(t, g).empty() ? "-" : nic_of(t, g));
  const std::vector<std::string> hcas = node_hca_list(t);
  if (!hcas.empty()) {
    out += "\nNCCL_IB_HCA (every rank of this node): =";
    for (size_t i = 0; i < hcas.size(); ++i) out += (i ? "," : "") + hcas[i];
  }
  return out + "\n";
}

std::string topology_json(const NodeTopology& t) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  w.field("source", t.source).field("hostname", t.hostname).field("cpus", t.machine_cpus.str());
  w.field("numa_nodes", t.numa_nodes);
  w.key("gpus").begin_array();
  for (size_t g = 0; g < t.gpus.size(); ++g) {
    const auto& x = t.gpus[g];
    w.begin_object().field("index", x.index).field("pci", x.pci).field("model", x.model).field("numa", x.numa);
    w.field("cpuset", x.cpus.str()).field("nic", nic_of(t, g)).field("nic_distance", nic_level(t, g));
    w.key("osdevs").begin_array();
    for (const auto& o : x.osdevs) w.value(o);
    w.end_array().end_object();
  }
  w.end_array();
  w.key("nics").begin_array();
  for (const auto& x : t.nics)
    w.begin_object().field("name", x.name).field("pci", x.pci).field("netdev", x.netdev).field("link", x.link)
        .field("numa", x.numa).field("cpuset", x.cpus.str()).field("port_state", x.port_state).end_object();
  w.end_array();
  w.key("nccl_ib_hca").begin_array();
  for (const auto& h : node_hca_list(t)) w.value(h);
  w.end_array();
  w.key("eth_netdevs").begin_array();
  for (const auto& e : t.eth_netdevs) w.value(e);
  w.end_array();
  w.key("nvlink").begin_array();
  for (const auto& row : t.nvlink.links) w.int_array(row);
  w.end_array();
  w.field("nvlink_source", t.nvlink.source).field("nvlink_domain_gpus", t.nvlink.domain_gpus);
  w.field("fabric_cluster_uuid", t.nvlink.fabric_cluster_uuid).field("fabric_clique_id", t.nvlink.fabric_clique_id);
  w.field("fabric_complete", t.nvlink.fabric_complete);
  w.key("gpu_matrix").begin_array();
  for (size_t a = 0; a < t.gpus.size(); ++a) {
    w.begin_array();
    for (size_t b = 0; b < t.gpus.size(); ++b) w.value(gpu_cell(t, a, b));
    w.end_array();
  }
  w.end_array();
  w.key("gpu_nic_matrix").begin_array();
  for (const auto& row : t.gpu_nic) {
    w.begin_array();
    for (PathLevel l : row) w.value(path_level_name(l));
    w.end_array();
  }
  w.end_array();
  w.end_object();
  return out + "\n";
}

}  // namespace meshrun
