// Topology reader on the project's fixtures: GPUs, NICs, NUMA, cpusets, PCI ladder, pairing, NVLink.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "meshrun/topology.hpp"
#include "nvml_query.hpp"  // private to mesh/src: tested here

using namespace meshrun;

namespace {
std::string fixture(const char* name) { return std::string(MESHRUN_TOPO_FIXTURES) + "/" + name; }
NodeTopology load(const char* name, const char* node_type = nullptr) {
  TopologyRequest r;
  r.xml_path = fixture(name);
  r.node_type = node_type ? find_node_type(node_type) : nullptr;
  return load_topology(r);
}
std::vector<std::string> paired_names(const NodeTopology& t) {
  std::vector<std::string> out;
  for (int n : t.nic_of_gpu) out.push_back(n < 0 ? "-" : t.nics[n].name);
  return out;
}
}  // namespace

TEST_CASE("DGX H100 fixture: GPUs and NICs and pairing and NUMA and NVSwitch links") {
  const NodeTopology t = load("dgx-h100.xml");
  REQUIRE(t.gpus.size() == 8);
  REQUIRE(t.nics.size() == 12);  // 8 compute + 4 storage ports
  CHECK(t.hostname == "dgx-h100-fixture");
  CHECK(t.machine_cpus.count() == 224);
  CHECK(t.numa_nodes == 2);
  const char* pci[] = {"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                       "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"};
  for (int g = 0; g < 8; ++g) {
    CHECK(t.gpus[g].index == g);
    CHECK(t.gpus[g].pci == pci[g]);
    CHECK(t.gpus[g].model == "NVIDIA H100 80GB HBM3");
    CHECK(t.gpus[g].numa == (g < 4 ? 0 : 1));
    CHECK(t.gpus[g].cpus.str() == (g < 4 ? "0-55,112-167" : "56-111,168-223"));
    CHECK(t.gpus[g].osdevs == std::vector<std::string>{"nvml" + std::to_string(g)});
    CHECK(t.gpu_nic[g][t.nic_of_gpu[g]] == PathLevel::pix);
  }
  // The DGX H100 compute NICs are not contiguous: never mlx5_0..7.
  CHECK(paired_names(t) ==
        std::vector<std::string>{"mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"});
  CHECK(t.nics[t.nic_of_gpu[1]].netdev == "ibp64s0");
  CHECK(t.nics[t.nic_of_gpu[7]].netdev == "ibp220s0");
  CHECK(t.nics[1].name == "mlx5_1");
  CHECK(t.nics[1].link == "Ethernet");
  CHECK(t.nics[0].link == "InfiniBand");
  CHECK(t.eth_netdevs == std::vector<std::string>{"eno3"});
  // Ladder: same switch PIX, same socket other host bridge NODE, other socket SYS.
  CHECK(t.gpu_nic[0][1] == PathLevel::node);  // storage port on socket 0
  CHECK(t.gpu_nic[0][6] == PathLevel::sys);
  CHECK(t.gpu_gpu[0][1] == PathLevel::nvl);
  // NVSwitch: 5+4+4+5 links per GPU -> NV18 between every pair.
  CHECK(t.nvlink.source == "hwloc");
  CHECK(t.nvlink.domain_gpus == 8);
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) CHECK(t.nvlink.links[a][b] == (a == b ? 0 : 18));
}

TEST_CASE("A100 node visible only as PCI devices") {
  const NodeTopology t = load("a100-pci.xml");
  REQUIRE(t.gpus.size() == 8);
  REQUIRE(t.nics.size() == 10);
  for (const auto& g : t.gpus) {
    CHECK(g.model == "[10de:20b2]");
    CHECK(g.osdevs.empty());
  }
  // Two GPUs and two NICs per switch: one NIC each, in order; storage mlx5_4/5 unused.
  CHECK(paired_names(t) ==
        std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"});
  CHECK(t.gpus[0].cpus.str() == "0-63,128-191");
  CHECK(t.gpus[7].cpus.str() == "64-127,192-255");
  CHECK(t.gpus[5].numa == 1);
  CHECK(t.gpu_gpu[0][1] == PathLevel::pix);
  CHECK(t.gpu_gpu[0][2] == PathLevel::node);
  CHECK(t.gpu_gpu[0][4] == PathLevel::sys);
  // No NVML: no NVLink knowledge unless the node type gives it.
  CHECK(t.nvlink.source == "none");
  CHECK(t.nvlink.domain_gpus == 1);
  CHECK(t.nvlink.links.empty());
  const NodeTopology typed = load("a100-pci.xml", "dgx-a100");
  CHECK(typed.nvlink.source == "node-type");
  CHECK(typed.nvlink.domain_gpus == 8);
  CHECK(typed.nvlink.links[2][5] == 1);
  CHECK(typed.gpu_gpu[0][4] == PathLevel::nvl);
  const NodeTopology generic = load("a100-pci.xml", "generic");
  CHECK(generic.nvlink.domain_gpus == 1);
  CHECK(generic.gpu_gpu[0][4] == PathLevel::sys);
}

TEST_CASE("GB200 NVL72 tray: Grace locality and NICs at NODE distance and 72-GPU domain from the node type") {
  const NodeTopology t = load("gb200-tray.xml", "gb200-nvl72");
  REQUIRE(t.gpus.size() == 4);
  REQUIRE(t.nics.size() == 4);
  const char* pci[] = {"0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"};
  for (int g = 0; g < 4; ++g) {
    CHECK(t.gpus[g].pci == pci[g]);
    CHECK(t.gpus[g].cpus.str() == (g < 2 ? "0-71" : "72-143"));
    CHECK(t.gpus[g].numa == g / 2);
    CHECK(t.gpu_nic[g][t.nic_of_gpu[g]] == PathLevel::node);
  }
  CHECK(paired_names(t) == std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"});
  CHECK(t.nics[2].netdev == "ibP16p3s0");
  CHECK(t.nvlink.source == "node-type");
  CHECK(t.nvlink.domain_gpus == 72);
  const NodeTopology bare = load("gb200-tray.xml");
  CHECK(bare.nvlink.domain_gpus == 1);
}

TEST_CASE("pairing: closest first and fair sharing when NICs are fewer") {
  // 4 GPUs, 2 NICs, all equally far: shared 2 and 2.
  CHECK(pair_gpus_with_nics({{5, 5}, {5, 5}, {5, 5}, {5, 5}}) == std::vector<int>{0, 1, 0, 1});
  // A closer NIC wins even when taken; an equally close one is preferred when less loaded.
  CHECK(pair_gpus_with_nics({{1, 9}, {1, 9}, {9, 1}}) == std::vector<int>{0, 0, 1});
  CHECK(pair_gpus_with_nics({{1, 1}, {1, 1}}) == std::vector<int>{0, 1});
  CHECK(pair_gpus_with_nics({{3}, {3}}) == std::vector<int>{0, 0});
  CHECK(pair_gpus_with_nics({{}, {}}) == std::vector<int>{-1, -1});
  // Same level: the deeper common ancestor (same socket) beats the machine root.
  CHECK(path_cost(PathLevel::sys, 2) < path_cost(PathLevel::sys, 0));
  CHECK(path_cost(PathLevel::pix, 0) < path_cost(PathLevel::pxb, 9));
}

TEST_CASE("cpuset lists") {
  auto s = parse_cpuset("8,0-3,10-11,3");
  REQUIRE(s);
  CHECK(s->cpus == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(s->str() == "0-3,8,10-11");
  CHECK(CpuSet{}.str().empty());
  CHECK(parse_cpuset("")->empty());
  CHECK_FALSE(parse_cpuset("3-1"));
  CHECK_FALSE(parse_cpuset("1,"));
  CHECK_FALSE(parse_cpuset("a"));
  CHECK_FALSE(parse_cpuset("0-99999999"));
  CHECK(cpuset_intersect(*parse_cpuset("0-7"), *parse_cpuset("4-12")).str() == "4-7");
}

TEST_CASE("topology errors are one actionable line") {
  TopologyRequest r;
  r.xml_path = fixture("no-such-file.xml");
  CHECK_THROWS_WITH(load_topology(r), Catch::Contains("cannot read the topology XML") && Catch::Contains("lstopo"));
  const std::string junk = std::string(MESHRUN_TOPO_BUILD_DIR) + "/not-xml.xml";
  std::FILE* f = std::fopen(junk.c_str(), "w");
  REQUIRE(f);
  std::fputs("this is not xml\n", f);
  std::fclose(f);
  r.xml_path = junk;
  CHECK_THROWS_AS(load_topology(r), TopologyError);
}

TEST_CASE("XML that crashes libhwloc is one error here, and this process lives on") {
  // Each load forks a child that hwloc crashes in (signal 11); the parent only reads its exit status.
  for (const char* f : {"malformed/root-without-complete-cpuset.xml", "malformed/root-without-complete-nodeset.xml"}) {
    INFO(f);
    CHECK_THROWS_WITH(load(f), Catch::Contains(fixture(f)) && Catch::Contains("libhwloc crashed reading it (signal 11)") &&
                                   Catch::Contains("hwloc-info --input") && !Catch::Contains("\n"));
  }
  CHECK_THROWS_WITH(load("malformed/osdev-type-8.xml"), Catch::Contains("OSDev mlx5_0 (gp_index 6) has osdev_type=\"8\""));
  CHECK_THROWS_WITH(load("malformed/bridge-type-2-1.xml"), Catch::Contains("has bridge_type=\"2-1\""));
  CHECK(load("dgx-h100.xml").gpus.size() == 8);  // and a good file still loads after them
}

TEST_CASE("live machine loads (no GPU here is fine)") {
  TopologyRequest r;
  r.use_nvml = false;
  const NodeTopology t = load_topology(r);
  CHECK(t.source == "live");
  CHECK(t.machine_cpus.count() >= 1);
  CHECK(t.gpu_nic.size() == t.gpus.size());
  CHECK(t.nic_of_gpu.size() == t.gpus.size());
}

TEST_CASE("describe_rank and renderings") {
  const NodeTopology t = load("dgx-h100.xml");
  RankDescription d = describe_rank(t, 5);
  CHECK(d.gpu == 5);
  CHECK(d.gpu_pci == "0000:c3:00.0");
  CHECK(d.nic == "mlx5_9");
  CHECK(d.nic_level == "PIX");
  CHECK(d.cpus == "56-111,168-223");
  CHECK(d.numa == 1);
  CHECK(describe_rank(t, 8).gpu == -1);
  const std::string json = topology_json(t);
  CHECK_THAT(json, Catch::Contains("\"nic\":\"mlx5_9\"") && Catch::Contains("\"nic_distance\":\"PIX\""));
  CHECK_THAT(json, Catch::Contains("\"nvlink\":[[0,18,18,18,18,18,18,18]"));
  const std::string table = topology_table(t);
  CHECK_THAT(table, Catch::Contains("NV18") && Catch::Contains("GPU5->mlx5_9"));
}

TEST_CASE("NVML through dlopen: absent driver is an answer, not a failure") {
  CHECK(normalize_pci("00000000:1B:00.0") == "0000:1b:00.0");
  CHECK(normalize_pci("0000:db:00.0") == "0000:db:00.0");
  CHECK(normalize_pci("junk") == "junk");
  std::string why;
  const auto gpus = query_nvml(&why);
  if (gpus) {  // a GPU node: every answer carries a normalized PCI id
    for (const auto& g : *gpus) CHECK(g.pci.size() == 12);
  } else {
    CHECK_THAT(why, Catch::Contains("libnvidia-ml") || Catch::Contains("nvml"));
  }
}
