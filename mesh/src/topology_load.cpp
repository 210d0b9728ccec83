// Reads a node's topology with hwloc (live with I/O discovery, or an XML export) and completes NVLink from
// hwloc's NVLinkBandwidth matrix, NVML, or the declared node type.
#include <fcntl.h>
#include <hwloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <type_traits>

#include "meshrun/bounded_file.hpp"
#include "meshrun/topology.hpp"
#include "nvml_query.hpp"
#include "topology_nvlink.hpp"

namespace meshrun {
namespace {

constexpr unsigned kNvidia = 0x10de;

struct Hwloc {
  hwloc_topology_t t = nullptr;
  ~Hwloc() {
    if (t) hwloc_topology_destroy(t);
  }
};

CpuSet to_cpuset(hwloc_const_bitmap_t b) {
  CpuSet s;
  if (!b || hwloc_bitmap_iszero(b) || hwloc_bitmap_weight(b) < 0) return s;  // weight < 0: infinite set
  unsigned id;
  hwloc_bitmap_foreach_begin(id, b) s.cpus.push_back(static_cast<int>(id));
  hwloc_bitmap_foreach_end();
  return s;
}

std::string busid(hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

bool is_nvidia_gpu(hwloc_obj_t o) {
  if (o->type != HWLOC_OBJ_PCI_DEVICE || o->attr->pcidev.vendor_id != kNvidia) return false;
  return o->attr->pcidev.class_id == 0x0300 || o->attr->pcidev.class_id == 0x0302;
}

// The NUMA node nearest to an I/O object: the first NUMA node with CPUs under its non-I/O ancestor.
int numa_of(hwloc_topology_t t, hwloc_obj_t ancestor) {
  int first = -1;
  if (!ancestor->nodeset) return -1;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n;
       n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) {
    if (!hwloc_bitmap_isset(ancestor->nodeset, n->os_index)) continue;
    if (first < 0) first = static_cast<int>(n->os_index);
    if (n->cpuset && !hwloc_bitmap_iszero(n->cpuset)) return static_cast<int>(n->os_index);
  }
  return first;
}

int depth_of(hwloc_obj_t o) {
  int d = 0;
  for (; o->parent; o = o->parent) ++d;
  return d;
}

// nvidia-smi's ladder from the deepest common ancestor of two PCI devices (topology-nccl.md section 4).
// A PCIe switch is an upstream port with downstream-port children, so "same switch" is a common PCI bridge
// with at most one bridge between it and each device.
PathLevel path_between(hwloc_obj_t a, hwloc_obj_t b, int* common_depth) {
  if (a == b) {
    *common_depth = depth_of(a);
    return PathLevel::self;
  }
  std::vector<hwloc_obj_t> up;
  for (hwloc_obj_t o = a->parent; o; o = o->parent) up.push_back(o);
  hwloc_obj_t c = nullptr;
  for (hwloc_obj_t o = b->parent; o && !c; o = o->parent)
    if (std::find(up.begin(), up.end(), o) != up.end()) c = o;
  if (!c) {
    *common_depth = 0;
    return PathLevel::sys;
  }
  *common_depth = depth_of(c);
  auto bridges_below = [c](hwloc_obj_t o) {
    int n = 0;
    for (o = o->parent; o && o != c; o = o->parent) n += o->type == HWLOC_OBJ_BRIDGE;
    return n;
  };
  if (c->type == HWLOC_OBJ_BRIDGE) {
    if (c->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) return PathLevel::phb;
    return std::max(bridges_below(a), bridges_below(b)) <= 1 ? PathLevel::pix : PathLevel::pxb;
  }
  if (c->type == HWLOC_OBJ_PCI_DEVICE) return PathLevel::pix;  // functions of one device
  return !c->nodeset || hwloc_bitmap_weight(c->nodeset) <= 1 ? PathLevel::node : PathLevel::sys;
}

// Only PUs, NUMA, packages and I/O matter here: skip caches, memory attributes and CPU kinds (faster), and
// never let discovery rebind the calling process (it may run inside slurmstepd).
void configure(hwloc_topology_t t, bool xml) {
  hwloc_topology_set_cache_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_icache_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_DONT_CHANGE_BINDING | HWLOC_TOPOLOGY_FLAG_NO_MEMATTRS |
                                  HWLOC_TOPOLOGY_FLAG_NO_CPUKINDS);
  // From XML, keep every I/O object the file has (the default filter would drop them all on import).
  hwloc_topology_set_io_types_filter(t, xml ? HWLOC_TYPE_FILTER_KEEP_ALL : HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
}

// Limits of the child that tries a user's XML first (check_xml_in_child).
constexpr long kProbeMemoryBytes = 2L << 30;  // on top of the address space the caller already has
constexpr rlim_t kProbeCpuSeconds = 20;
constexpr int kProbeWallMs = 30000;

long address_space_bytes() {  // the caller's current virtual size (/proc/self/statm, first field in pages)
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  return pages * ::sysconf(_SC_PAGESIZE);
}

// Lowers a limit, never raises it (a caller's own ulimit stays in force, even for root).
void lower_limit(int resource, rlim_t value) {
  rlimit r{};
  if (::getrlimit(resource, &r) != 0) return;
  r.rlim_cur = std::min(r.rlim_cur, value);
  r.rlim_max = std::min(r.rlim_max, value);
  ::setrlimit(resource, &r);
}

// libhwloc 2.9 crashes inside hwloc_topology_load on some malformed XML (SIGSEGV on a root object without
// complete_cpuset or complete_nodeset; hwloc-info --input crashes on them too), and this runs inside
// slurmstepd for the plugin. So a forked child loads the buffer first, under memory and CPU limits and a
// wall-clock timeout; the caller loads only a buffer the child loaded (same bytes, same settings, same
// library). The child does nothing but the load and _exit: after fork in a multi-threaded host only this
// thread exists, and neither atexit handlers nor the host's stdio buffers may run or flush there.
void check_xml_in_child(const std::string& xml_text, const std::string& path) {
  const std::string fix = "; check it with hwloc-info --input " + path + " or re-export it with lstopo --of xml";
  const rlim_t mem = static_cast<rlim_t>(address_space_bytes() + kProbeMemoryBytes);
  const pid_t pid = ::fork();
  if (pid < 0) throw TopologyError("topology XML " + path + ": cannot fork to check it (" + std::strerror(errno) + ")");
  if (pid == 0) {
    if (const int null = ::open("/dev/null", O_RDWR); null >= 0) {  // hwloc's complaints are the parent's to report
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
    }
    const rlimit none{0, 0};
    ::setrlimit(RLIMIT_CORE, &none);
    lower_limit(RLIMIT_AS, mem);
    lower_limit(RLIMIT_CPU, kProbeCpuSeconds);
    sigset_t fatal;  // the host's handlers and masks must not turn a crash here into something else
    ::sigemptyset(&fatal);
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGXCPU}) {
      ::signal(sig, SIG_DFL);
      ::sigaddset(&fatal, sig);
    }
    ::sigprocmask(SIG_UNBLOCK, &fatal, nullptr);
    hwloc_topology_t t = nullptr;
    bool ok = hwloc_topology_init(&t) == 0;
    if (ok) configure(t, true);
    ok = ok && hwloc_topology_set_xmlbuffer(t, xml_text.c_str(), static_cast<int>(xml_text.size() + 1)) == 0 &&
         hwloc_topology_load(t) == 0;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  for (int waited_ms = 0, step_ms = 1;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR)
      throw TopologyError("topology XML " + path + ": lost the process that checks it (" + std::strerror(errno) + ")");
    if (waited_ms >= kProbeWallMs) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
      throw TopologyError("topology XML " + path + ": libhwloc did not finish reading it in " +
                          std::to_string(kProbeWallMs / 1000) + " s" + fix);
    }
    ::usleep(static_cast<useconds_t>(step_ms) * 1000);
    waited_ms += step_ms;
    step_ms = std::min(step_ms * 2, 50);
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    throw TopologyError("topology XML " + path + ": libhwloc " +
                        (sig == SIGXCPU ? "used more than " + std::to_string(kProbeCpuSeconds) + " s of CPU time reading it"
                                        : "crashed reading it (signal " + std::to_string(sig) + ")") + fix);
  }
  if (WEXITSTATUS(status) != 0)
    throw TopologyError("hwloc could not load '" + path + "' (XML version > 2 or malformed); export it with hwloc 2.x");
}

// The stored value of an enum field, read as its integer: hwloc copies these from the XML unchecked
// (osdev_type="8", bridge_type="2-1" load fine), and loading an undefined value as the enum is undefined.
template <class E>
long stored(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<long>(v);
}

// Refuses I/O objects whose enum attributes hwloc does not define, before any code compares them.
void check_io_enums(hwloc_topology_t t, const std::string& path) {
  auto bad = [&](hwloc_obj_t o, const std::string& what) {
    return TopologyError("topology XML " + path + ": " + hwloc_obj_type_string(o->type) + (o->name ? std::string(" ") + o->name : "") +
                         " (gp_index " + std::to_string(o->gp_index) + ") has " + what +
                         ", which hwloc does not define; re-export it with lstopo --of xml");
  };
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o; o = hwloc_get_next_osdev(t, o))
    if (const long v = stored(o->attr->osdev.type); v < HWLOC_OBJ_OSDEV_BLOCK || v > HWLOC_OBJ_OSDEV_COPROC)
      throw bad(o, "osdev_type=\"" + std::to_string(v) + "\"");
  for (hwloc_obj_t o = hwloc_get_next_bridge(t, nullptr); o; o = hwloc_get_next_bridge(t, o)) {
    const long up = stored(o->attr->bridge.upstream_type), down = stored(o->attr->bridge.downstream_type);
    if ((up != HWLOC_OBJ_BRIDGE_HOST && up != HWLOC_OBJ_BRIDGE_PCI) || down != HWLOC_OBJ_BRIDGE_PCI)
      throw bad(o, "bridge_type=\"" + std::to_string(up) + "-" + std::to_string(down) + "\"");
  }
}

}  // namespace

NodeTopology load_topology(const TopologyRequest& req) {
  Hwloc h;
  if (hwloc_topology_init(&h.t) != 0) throw TopologyError("hwloc_topology_init failed; out of memory?");
  const bool xml = !req.xml_path.empty();
  configure(h.t, xml);
  std::string xml_text;  // must outlive hwloc_topology_load
  if (xml) {
    // Read here (a regular file of at most 64 MiB) and hand hwloc the buffer: hwloc itself would open a FIFO
    // and block, or read /dev/zero without end.
    std::string error;
    if (!read_bounded_file(req.xml_path, kTopologyXmlLimit, "topology XML", &xml_text, &error))
      throw TopologyError(error + " (an hwloc export: lstopo --of xml FILE)");
    check_xml_in_child(xml_text, req.xml_path);
    if (hwloc_topology_set_xmlbuffer(h.t, xml_text.c_str(), static_cast<int>(xml_text.size() + 1)) != 0)
      throw TopologyError("'" + req.xml_path + "' is not an hwloc XML topology; export one with lstopo --of xml");
  }
  if (hwloc_topology_load(h.t) != 0)
    throw TopologyError(xml ? "hwloc could not load '" + req.xml_path + "' (XML version > 2 or malformed); "
                                  "export it with hwloc 2.x"
                            : std::string("hwloc could not discover this machine; set HWLOC_XMLFILE or pass --xml"));
  if (xml) check_io_enums(h.t, req.xml_path);

  NodeTopology topo;
  topo.source = xml ? req.xml_path : "live";
  hwloc_obj_t root = hwloc_get_root_obj(h.t);
  if (const char* host = hwloc_obj_get_info_by_name(root, "HostName")) topo.hostname = host;
  const char* ver = hwloc_obj_get_info_by_name(root, "hwlocVersion");
  const std::string version = ver ? ver : (xml ? "" : HWLOC_VERSION);
  topo.machine_cpus = to_cpuset(root->cpuset);
  topo.numa_nodes = hwloc_get_nbobjs_by_type(h.t, HWLOC_OBJ_NUMANODE);

  std::vector<hwloc_obj_t> gpu_objs, nic_objs;
  std::vector<std::pair<std::string, hwloc_obj_t>> eth;  // netdevs without RDMA, by PCI id
  for (hwloc_obj_t o = hwloc_get_next_pcidev(h.t, nullptr); o; o = hwloc_get_next_pcidev(h.t, o)) {
    if (is_nvidia_gpu(o)) {
      gpu_objs.push_back(o);
      continue;
    }
    bool rdma = false;
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling)
      rdma = rdma || (c->type == HWLOC_OBJ_OS_DEVICE && c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS);
    if (rdma) nic_objs.push_back(o);
    else
      for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling)
        if (c->type == HWLOC_OBJ_OS_DEVICE && c->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && c->name)
          eth.emplace_back(busid(o), c);
  }
  auto by_bus = [](hwloc_obj_t a, hwloc_obj_t b) { return busid(a) < busid(b); };
  std::sort(gpu_objs.begin(), gpu_objs.end(), by_bus);
  std::sort(nic_objs.begin(), nic_objs.end(), by_bus);
  std::stable_sort(eth.begin(), eth.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [pci, dev] : eth) topo.eth_netdevs.push_back(dev->name);

  std::vector<unsigned> device_ids;
  for (size_t i = 0; i < gpu_objs.size(); ++i) {
    hwloc_obj_t o = gpu_objs[i];
    TopoGpu g;
    g.index = static_cast<int>(i);
    g.pci = busid(o);
    char id[24];
    std::snprintf(id, sizeof id, "[10de:%04x]", o->attr->pcidev.device_id);
    g.model = o->name ? o->name : id;
    g.pci_device_id = o->attr->pcidev.device_id;
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name) continue;
      g.osdevs.push_back(c->name);
      if (const char* m = hwloc_obj_get_info_by_name(c, "GPUModel")) g.model = m;
    }
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(h.t, o);
    g.cpus = to_cpuset(anc->cpuset);
    g.numa = numa_of(h.t, anc);
    topo.gpus.push_back(std::move(g));
    device_ids.push_back(o->attr->pcidev.device_id);
  }
  for (hwloc_obj_t o : nic_objs) {
    TopoNic n;
    n.pci = busid(o);
    n.link = o->attr->pcidev.class_id == 0x0207 ? "InfiniBand" : "Ethernet";
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name) continue;
      if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && n.name.empty()) {
        n.name = c->name;
        if (const char* st = hwloc_obj_get_info_by_name(c, "Port1State")) n.port_state = std::atoi(st);
      }
      if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && n.netdev.empty()) n.netdev = c->name;
    }
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(h.t, o);
    n.cpus = to_cpuset(anc->cpuset);
    n.numa = numa_of(h.t, anc);
    topo.nics.push_back(std::move(n));
  }

  const size_t G = gpu_objs.size(), N = nic_objs.size();
  std::vector<std::vector<int>> cost(G, std::vector<int>(N, 0));
  topo.gpu_nic.assign(G, std::vector<PathLevel>(N, PathLevel::sys));
  topo.gpu_gpu.assign(G, std::vector<PathLevel>(G, PathLevel::sys));
  for (size_t a = 0; a < G; ++a) {
    int depth = 0;
    for (size_t b = 0; b < G; ++b) topo.gpu_gpu[a][b] = path_between(gpu_objs[a], gpu_objs[b], &depth);
    for (size_t n = 0; n < N; ++n) {
      topo.gpu_nic[a][n] = path_between(gpu_objs[a], nic_objs[n], &depth);
      cost[a][n] = path_cost(topo.gpu_nic[a][n], depth);
    }
  }
  topo.nic_of_gpu = pair_gpus_with_nics(cost);

  if (G > 0) {
    nvlink_from_hwloc(h.t, gpu_objs, device_ids, version, &topo.nvlink);
    if (!xml && req.use_nvml) {
      std::string why;
      if (auto nv = query_nvml(&why)) nvlink_from_nvml(*nv, topo.gpus, &topo.nvlink);
    }
    if (topo.nvlink.source == "none" && req.node_type) topo.nvlink = nvlink_from_node_type(*req.node_type, int(G));
    if (topo.nvlink.source != "node-type") topo.nvlink.domain_gpus = local_domain(topo.nvlink);
    // A multi-node NVLink domain (GB200 NVL72) is not visible from one tray's hwloc: take the declared size
    // when every local GPU is NVLink-connected.
    if (req.node_type && req.node_type->nvlink_domain_gpus > topo.nvlink.domain_gpus &&
        topo.nvlink.domain_gpus == static_cast<int>(G))
      topo.nvlink.domain_gpus = req.node_type->nvlink_domain_gpus;
    for (size_t a = 0; a < G; ++a)
      for (size_t b = 0; b < G; ++b)
        if (a != b && !topo.nvlink.links.empty() && topo.nvlink.links[a][b] > 0) topo.gpu_gpu[a][b] = PathLevel::nvl;
  }
  return topo;
}

}  // namespace meshrun
