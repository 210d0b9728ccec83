// Target 5: hwloc XML topologies through load_topology(), the entry `meshrun topo --xml`, `plan --topology`,
// `exec` and the plugin's topology_xml= use (it reads the file bounded, loads it with hwloc and derives
// GPUs, NICs, paths and pairing). Whatever hwloc does with the XML, what meshrun builds from it is checked.
// Contracts: only TopologyError escapes (one line); the path matrices are square over the GPUs and NICs
// found; each GPU's NIC is one of the NICs or -1; NCCL_IB_HCA's list names only found NICs, each once; every
// local rank of the node can be described; the table and the JSON render.
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>

#include <set>

#include "fuzz_common.hpp"
#include "meshrun/topology.hpp"

using namespace meshrun;

static fuzz::ScratchCleanup cleanup;

// load_topology checks the XML in a forked child first; what goes wrong there (hwloc crashing, the child's
// memory limit) is the parent's TopologyError, not a finding. Without this the child, a copy of the fuzzer,
// would run libFuzzer's death callback and leave a crash-* file for it.
static const int quiet_children = pthread_atfork(nullptr, nullptr, [] { __sanitizer_set_death_callback(nullptr); });

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  TopologyRequest req;
  req.xml_path = fuzz::write_scratch("node.xml", data, size);
  req.use_nvml = false;
  NodeTopology t;
  try {
    t = load_topology(req);
  } catch (const TopologyError& e) {
    FUZZ_CHECK(fuzz::one_line_message(e.what(), true), "TopologyError message");
    return 0;
  }
  const size_t g = t.gpus.size(), n = t.nics.size();
  FUZZ_CHECK(t.gpu_gpu.size() == g && t.gpu_nic.size() == g && t.nic_of_gpu.size() == g, "per-GPU tables");
  for (size_t i = 0; i < g; ++i) {
    FUZZ_CHECK(t.gpu_gpu[i].size() == g && t.gpu_nic[i].size() == n, "matrix row " + std::to_string(i));
    FUZZ_CHECK(t.nic_of_gpu[i] >= -1 && t.nic_of_gpu[i] < static_cast<int>(n), "pairing of GPU " + std::to_string(i));
    FUZZ_CHECK(n == 0 || t.nic_of_gpu[i] >= 0, "a GPU left without a NIC on a node that has NICs");
    FUZZ_CHECK(t.gpus[i].index == static_cast<int>(i), "GPU index");
  }
  std::set<std::string> nic_names, hcas;
  for (const auto& nic : t.nics) nic_names.insert(nic.name);
  for (const auto& h : node_hca_list(t)) {
    FUZZ_CHECK(nic_names.count(h), "NCCL_IB_HCA names an unknown NIC " + h);
    FUZZ_CHECK(hcas.insert(h).second, "NCCL_IB_HCA names " + h + " twice");
  }
  for (size_t i = 0; i < g; ++i) {
    const RankDescription d = describe_rank(t, static_cast<int>(i));
    FUZZ_CHECK(d.gpu == static_cast<int>(i) && d.gpu_pci == t.gpus[i].pci, "describe_rank " + std::to_string(i));
  }
  topology_table(t);
  FUZZ_CHECK(!topology_json(t).empty(), "empty JSON");
  return 0;
}
