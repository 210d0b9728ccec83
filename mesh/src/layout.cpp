#include <algorithm>
#include <string>

#include "meshrun/hostlist.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/limits.hpp"
#include "meshrun/schedule.hpp"

namespace meshrun {
namespace {
std::string node_type_names() {
  std::string s;
  for (const auto& t : node_types()) s += (s.empty() ? "" : ", ") + t.name;
  return s;
}

// "key=value is larger than limit …; fix" for a size beyond meshrun/limits.hpp.
Problem over_limit(const char* check, const std::string& what, int64_t value, int64_t limit, const char* fix) {
  return {check, what + " = " + std::to_string(value) + " is larger than " + std::to_string(limit) +
                     ", the most meshrun accepts (docs/mesh.md, Limits); " + fix};
}
}  // namespace

int Cluster::nvlink_domain_of(int node, int local) const {
  int64_t slot = int64_t(node) * gpus_per_node + local;
  return static_cast<int>(slot / std::max(1, nvlink_domain_gpus));
}

Cluster resolve_cluster(const ClusterSpec& spec, std::vector<Problem>* problems) {
  Cluster c;
  const NodeType* type = find_node_type(spec.node_type);
  if (!type) {
    problems->push_back({"node-type", "unknown cluster.node_type '" + spec.node_type + "'; use one of " +
                                          node_type_names()});
    type = find_node_type("generic");
  }
  c.type = *type;
  c.gpus_per_node = spec.gpus_per_node > 0 ? spec.gpus_per_node : type->gpus_per_node;
  c.type.gpus_per_node = c.gpus_per_node;
  c.nvlink_domain_gpus = spec.nvlink_domain_gpus > 0 ? spec.nvlink_domain_gpus : type->nvlink_domain_gpus;
  if (spec.nvlink_domain_gpus <= 0 && type->nvlink_domain_gpus == type->gpus_per_node)
    c.nvlink_domain_gpus = c.gpus_per_node;  // a whole-node NVSwitch domain follows the node's GPU count
  c.type.nvlink_domain_gpus = c.nvlink_domain_gpus;
  // The config layer bounds each key; these guard specs built in code, and the product of the two.
  bool too_big = false;
  if (spec.nodes > limits::kHosts) {
    problems->push_back(over_limit("size", "cluster.nodes", spec.nodes, limits::kHosts, "use fewer nodes"));
    too_big = true;
  }
  if (c.gpus_per_node > limits::kGpusPerNode || c.nvlink_domain_gpus > limits::kNvlinkDomainGpus) {
    problems->push_back(c.gpus_per_node > limits::kGpusPerNode
                            ? over_limit("size", "cluster.gpus_per_node", c.gpus_per_node,
                                         limits::kGpusPerNode, "set the GPUs of one node")
                            : over_limit("nvlink-domain", "cluster.nvlink_domain_gpus", c.nvlink_domain_gpus,
                                         limits::kNvlinkDomainGpus, "set the GPUs of one NVLink domain"));
    too_big = true;
  }
  if (too_big) {  // a refused cluster: one node, no host names (nothing may size an allocation from it)
    c.nodes = 1;
    return c;
  }
  if (c.nvlink_domain_gpus > 1 && c.nvlink_domain_gpus % c.gpus_per_node != 0 &&
      c.gpus_per_node % c.nvlink_domain_gpus != 0)
    problems->push_back({"nvlink-domain", "cluster.nvlink_domain_gpus=" + std::to_string(c.nvlink_domain_gpus) +
                                              " neither divides nor is a multiple of gpus_per_node=" +
                                              std::to_string(c.gpus_per_node) +
                                              "; an NVLink domain is whole nodes or a fixed part of one"});

  if (!spec.hostlist.empty()) {
    std::string err;
    auto hosts = expand_hostlist(spec.hostlist, &err);
    if (!hosts) {
      problems->push_back({"hostlist", "cluster.hostlist: " + err});
    } else {
      c.hosts = std::move(*hosts);
      if (spec.nodes > 0 && spec.nodes != static_cast<int>(c.hosts.size()))
        problems->push_back({"hostlist", "cluster.nodes=" + std::to_string(spec.nodes) + " but cluster.hostlist names " +
                                             std::to_string(c.hosts.size()) +
                                             " hosts; make them agree or drop cluster.nodes"});
    }
  }
  c.nodes = spec.nodes > 0 ? spec.nodes : (c.hosts.empty() ? 1 : static_cast<int>(c.hosts.size()));
  if (c.gpus() > limits::kWorld) {
    problems->push_back({"size", "cluster.nodes × gpus_per_node = " + std::to_string(c.nodes) + " × " +
                                           std::to_string(c.gpus_per_node) + " = " + std::to_string(c.gpus()) +
                                           " GPUs is more than " + std::to_string(limits::kWorld) +
                                           ", the most ranks meshrun lays out (docs/mesh.md, Limits); use fewer nodes"});
    c.nodes = 1;  // a refused cluster: one node, no host names (nothing may size an allocation from it)
    c.hosts.clear();
    return c;
  }
  if (c.hosts.size() != static_cast<size_t>(c.nodes)) {
    c.hosts.clear();
    int width = std::max<int>(4, static_cast<int>(std::to_string(std::max(0, c.nodes - 1)).size()));
    c.hosts.reserve(c.nodes);
    for (int i = 0; i < c.nodes; ++i) {
      std::string num = std::to_string(i);
      c.hosts.push_back("node" + std::string(width - num.size(), '0') + num);
    }
  }
  return c;
}

ClusterSpec single_node_spec(int ranks) {
  ClusterSpec spec;
  spec.nodes = 1;
  spec.gpus_per_node = ranks;
  spec.nvlink_domain_gpus = ranks;
  spec.node_type = "generic";
  return spec;
}

std::optional<Layout> resolve_layout(const LayoutSpec& spec, int64_t world, std::vector<Problem>* problems) {
  Layout l;
  bool ok = true;
  std::string err;
  if (auto o = parse_order(spec.order, &err)) {
    l.order = *o;
  } else {
    problems->push_back({"order", "parallel.order: " + err});
    ok = false;
  }
  auto positive = [&](const char* key, int v) {
    if (v < 1) {
      problems->push_back({"size", std::string("parallel.") + key + "=" + std::to_string(v) +
                                       " must be a positive integer; use 1 to leave the axis unused"});
      ok = false;
    }
  };
  positive("tp", spec.tp);
  positive("cp", spec.cp);
  positive("pp", spec.pp);
  positive("ep", spec.ep);
  positive("virtual_stages", spec.virtual_stages);
  if (spec.dp < 0) {
    problems->push_back({"size", "parallel.dp=" + std::to_string(spec.dp) +
                                     " must be a positive integer or \"auto\" (world / (tp·cp·pp))"});
    ok = false;
  }
  if (spec.zero_stage < 0 || spec.zero_stage > 3) {
    problems->push_back({"zero-stage", "parallel.zero_stage=" + std::to_string(spec.zero_stage) +
                                           " is not a ZeRO stage; use 0 (none), 1 (optimizer), 2 (+gradients) or 3 (+parameters)"});
    ok = false;
  }
  if (!ok) return std::nullopt;
  // Products in 64 bits against the limits, so that every later product of a layout fits an int.
  const auto s = [](int64_t v) { return std::to_string(v); };
  const int64_t model = limits::product({spec.tp, spec.cp, spec.pp});
  const int64_t ranks = limits::product({model, std::max(spec.dp, 1)});
  if (world < 1 || world > limits::kWorld) {
    problems->push_back({"size", "the job has " + s(world) + " GPUs; meshrun lays out 1 to " +
                                           s(limits::kWorld) + " ranks: change cluster.nodes or gpus_per_node"});
    ok = false;
  } else if (model > limits::kWorld || ranks > limits::kWorld) {
    problems->push_back({"size", "tp·cp·pp·dp = " + s(spec.tp) + "·" + s(spec.cp) + "·" + s(spec.pp) + "·" +
                                           (spec.dp == 0 ? std::string("auto") : s(spec.dp)) + " is more than " +
                                           s(limits::kWorld) + " ranks, the most meshrun lays out; use smaller " +
                                           "parallel.tp/cp/pp/dp sizes"});
    ok = false;
  }
  // What runs: zbv and dualpipev take virtual_stages = 1 (the default) as their two chunks per rank.
  const auto kind = parse_pipeline_schedule(spec.pipeline_schedule);
  const int virtual_stages = kind ? scheduled_virtual_stages(*kind, spec.virtual_stages) : spec.virtual_stages;
  if (limits::product({spec.pp, virtual_stages}) > limits::kLayers) {
    problems->push_back({"size", "pp·virtual_stages = " + s(spec.pp) + "·" + s(virtual_stages) + " = " +
                                          s(int64_t(spec.pp) * virtual_stages) + " pipeline chunks is more than " +
                                          s(limits::kLayers) + " (each chunk needs a layer); use fewer " +
                                          "parallel.virtual_stages or a smaller parallel.pp"});
    ok = false;
  }
  if (!ok) return std::nullopt;
  l.tp = spec.tp;
  l.cp = spec.cp;
  l.pp = spec.pp;
  l.ep = spec.ep;
  l.virtual_stages = virtual_stages;
  l.zero_stage = spec.zero_stage;
  l.sequence_parallel = spec.sequence_parallel;
  if (spec.dp == 0) {
    if (world % model != 0) {
      problems->push_back({"world-size", "dp = \"auto\" needs the world size (" + std::to_string(world) +
                                             " GPUs) to be a multiple of tp·cp·pp = " + std::to_string(model) +
                                             "; change the node count or the tp/cp/pp sizes"});
      return std::nullopt;
    }
    l.dp = static_cast<int>(world / model);
  } else {
    l.dp = spec.dp;
  }
  return l;
}

std::optional<std::vector<int>> chunk_layers(int layers, int chunks) {
  if (chunks < 1 || layers < 1 || layers > limits::kLayers || chunks > layers + 2) return std::nullopt;
  if (layers % chunks == 0) return std::vector<int>(chunks, layers / chunks);
  // Llama 3: the first and last chunk hold one layer fewer, room for the embedding and the output head; with
  // one layer per chunk they hold only those (paper §3.3.2). Needs a layer in some chunk besides them.
  if (chunks >= 3 && (layers + 2) % chunks == 0) {
    std::vector<int> v(chunks, (layers + 2) / chunks);
    v.front() -= 1;
    v.back() -= 1;
    return v;
  }
  return std::nullopt;
}

std::vector<int64_t> divisors_up_to(int64_t n, int64_t limit) {
  std::vector<int64_t> small, large;
  for (int64_t d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      if (d <= limit) small.push_back(d);
      if (d != n / d && n / d <= limit) large.push_back(n / d);
    }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

}  // namespace meshrun
