// The plugin's node setup (user_init in slurmstepd) on topology XML that crashes libhwloc: a TopologyError
// the plugin keeps for task_init (ctx_stepd.cpp), never a crash of the process that loads it.
#include <catch2/catch.hpp>

#include <string>

#include "meshrun/layout.hpp"
#include "task_setup.hpp"

using namespace meshrun;
using namespace meshrun::plugin;

TEST_CASE("topology_xml= that crashes libhwloc refuses the node setup with one line") {
  const NodeType* dgx = find_node_type("dgx-h100");
  REQUIRE(dgx);
  PlugstackArgs args;
  for (const char* name : {"root-without-complete-cpuset.xml", "root-without-complete-nodeset.xml"}) {
    args.topology_xml = std::string(MESHRUN_TOPO_FIXTURES) + "/malformed/" + name;
    INFO(args.topology_xml);
    CHECK_THROWS_WITH(load_node_setup(args, *dgx, Config{}),
                      Catch::Contains(args.topology_xml) && Catch::Contains("libhwloc crashed reading it (signal 11)") &&
                          !Catch::Contains("\n"));
  }
  args.topology_xml = std::string(MESHRUN_TOPO_FIXTURES) + "/malformed/osdev-type-8.xml";
  CHECK_THROWS_AS(load_node_setup(args, *dgx, Config{}), TopologyError);
  args.topology_xml = std::string(MESHRUN_TOPO_FIXTURES) + "/dgx-h100.xml";  // the same path still works
  CHECK(load_node_setup(args, *dgx, Config{}).topology.gpus.size() == 8);
}
