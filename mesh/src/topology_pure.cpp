// Pure parts of the topology model: CPU set lists, the path ladder, GPU<->NIC pairing, node-type NVLink.
#include <algorithm>
#include <cctype>
#include <charconv>

#include "meshrun/topology.hpp"

namespace meshrun {

std::string CpuSet::str() const {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::optional<CpuSet> parse_cpuset(const std::string& text) {
  CpuSet set;
  const char* p = text.data();
  const char* end = p + text.size();
  auto number = [&](int& v) {
    auto r = std::from_chars(p, end, v);
    if (r.ec != std::errc() || v < 0 || v > (1 << 20)) return false;  // bounded: no huge ranges
    p = r.ptr;
    return true;
  };
  while (p < end) {
    int lo = 0, hi = 0;
    if (!number(lo)) return std::nullopt;
    hi = lo;
    if (p < end && *p == '-') {
      ++p;
      if (!number(hi) || hi < lo) return std::nullopt;
    }
    for (int c = lo; c <= hi; ++c) set.cpus.push_back(c);
    if (p < end) {
      if (*p != ',') return std::nullopt;
      ++p;
      if (p == end) return std::nullopt;
    }
  }
  std::sort(set.cpus.begin(), set.cpus.end());
  set.cpus.erase(std::unique(set.cpus.begin(), set.cpus.end()), set.cpus.end());
  return set;
}

CpuSet cpuset_intersect(const CpuSet& a, const CpuSet& b) {
  CpuSet out;
  std::set_intersection(a.cpus.begin(), a.cpus.end(), b.cpus.begin(), b.cpus.end(), std::back_inserter(out.cpus));
  return out;
}

const char* path_level_name(PathLevel l) {
  switch (l) {
    case PathLevel::self: return "X";
    case PathLevel::nvl: return "NV";
    case PathLevel::pix: return "PIX";
    case PathLevel::pxb: return "PXB";
    case PathLevel::phb: return "PHB";
    case PathLevel::node: return "NODE";
    case PathLevel::sys: return "SYS";
  }
  return "?";
}

// Closeness beats exclusivity (a GPU never takes a farther NIC to avoid sharing), which is also how NCCL
// picks; ties spread GPUs over NICs, so GPUs share fairly when NICs are fewer.
std::vector<int> pair_gpus_with_nics(const std::vector<std::vector<int>>& gpu_nic) {
  std::vector<int> pairing(gpu_nic.size(), -1);
  if (gpu_nic.empty() || gpu_nic[0].empty()) return pairing;
  const size_t nics = gpu_nic[0].size();
  std::vector<int> load(nics, 0);
  for (size_t g = 0; g < gpu_nic.size(); ++g) {
    int best = -1;
    for (size_t n = 0; n < nics; ++n) {
      if (best < 0 || gpu_nic[g][n] < gpu_nic[g][best] ||
          (gpu_nic[g][n] == gpu_nic[g][best] && load[n] < load[best]))
        best = static_cast<int>(n);
    }
    pairing[g] = best;
    ++load[best];
  }
  return pairing;
}

NvlinkInfo nvlink_from_node_type(const NodeType& type, int gpus) {
  NvlinkInfo info;
  info.source = "node-type";
  info.domain_gpus = std::max(1, type.nvlink_domain_gpus);
  const bool connected = type.nvlink_domain_gpus > 1;
  info.links.assign(gpus, std::vector<int>(gpus, 0));
  for (int i = 0; i < gpus; ++i)
    for (int j = 0; j < gpus; ++j) info.links[i][j] = (i != j && connected) ? 1 : 0;
  return info;
}

std::vector<std::string> node_hca_list(const NodeTopology& topo) {
  std::vector<bool> paired(topo.nics.size(), false);
  for (int n : topo.nic_of_gpu)
    if (n >= 0 && n < static_cast<int>(topo.nics.size())) paired[static_cast<size_t>(n)] = true;
  // A name once, even where a damaged or hand-edited topology lists two NICs under one name (a fuzz finding):
  // NCCL_IB_HCA names devices, not hwloc objects.
  std::vector<std::string> out;
  for (size_t n = 0; n < topo.nics.size(); ++n)
    if (paired[n] && std::find(out.begin(), out.end(), topo.nics[n].name) == out.end()) out.push_back(topo.nics[n].name);
  return out;
}

int gpu_arch_major(unsigned id, const std::string& model) {
  if (id >= 0x1db0 && id <= 0x1dbf) return 7;
  if (id >= 0x20b0 && id <= 0x20bf) return 8;
  if (id >= 0x2320 && id <= 0x233f) return 9;
  if (id >= 0x2900 && id <= 0x29ff) return 10;
  std::string m;
  for (char c : model) m += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto has = [&](const char* s) { return m.find(s) != std::string::npos; };
  if (has("B100") || has("B200") || has("B300") || has("GB200")) return 10;
  if (has("H100") || has("H200") || has("H800") || has("GH200")) return 9;
  if (has("A100") || has("A800") || has("A30")) return 8;
  if (has("V100")) return 7;
  return 0;
}

}  // namespace meshrun
