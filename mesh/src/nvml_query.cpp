// NVML through dlopen. The few types used are declared here with NVML's public layouts (nvml.h, CUDA 12):
// nvmlPciInfo_t, nvmlGpuFabricInfo_t; functions are looked up by their versioned names.
#include "nvml_query.hpp"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>

namespace meshrun {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct nvmlGpuFabricInfo_t {
  unsigned char clusterUuid[16];
  nvmlReturn_t status;
  unsigned int cliqueId;
  unsigned char state;
};
constexpr unsigned kMaxLinks = 18;            // NVML_NVLINK_MAX_LINKS
constexpr unsigned kMaxGpus = 64;             // bound the work inside slurmstepd
constexpr unsigned char kFabricCompleted = 3; // NVML_GPU_FABRIC_STATE_COMPLETED
constexpr int kLinkDeviceSwitch = 2;          // NVML_NVLINK_DEVICE_TYPE_SWITCH

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*link_state)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remote_pci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*remote_type)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*fabric)(nvmlDevice_t, nvmlGpuFabricInfo_t*) = nullptr;
  ~Nvml() {
    if (lib) {
      if (shutdown) shutdown();
      dlclose(lib);
    }
  }
};

template <typename F>
void bind(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

std::string normalize_pci(const std::string& busid) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(busid.c_str(), "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return busid;
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", dom & 0xffffu, bus & 0xffu, dev & 0xffu, fn & 0xfu);
  return out;
}

std::optional<std::vector<NvmlGpu>> query_nvml(std::string* why) {
  Nvml n;
  n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n.lib) {
    if (why) *why = "libnvidia-ml.so.1 not found (no NVIDIA driver on this node)";
    return std::nullopt;
  }
  bind(n.lib, n.init, "nvmlInit_v2");
  bind(n.lib, n.shutdown, "nvmlShutdown");
  bind(n.lib, n.count, "nvmlDeviceGetCount_v2");
  bind(n.lib, n.handle, "nvmlDeviceGetHandleByIndex_v2");
  bind(n.lib, n.pci, "nvmlDeviceGetPciInfo_v3");
  bind(n.lib, n.link_state, "nvmlDeviceGetNvLinkState");
  bind(n.lib, n.remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  bind(n.lib, n.remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType");
  bind(n.lib, n.fabric, "nvmlDeviceGetGpuFabricInfo");
  if (!n.init || !n.shutdown || !n.count || !n.handle || !n.pci) {
    if (why) *why = "libnvidia-ml.so.1 lacks nvmlInit_v2/nvmlDeviceGetPciInfo_v3 (driver too old)";
    return std::nullopt;
  }
  if (n.init() != 0) {
    n.shutdown = nullptr;  // never shut down what did not start
    if (why) *why = "nvmlInit_v2 failed (driver not loaded?)";
    return std::nullopt;
  }
  unsigned count = 0;
  if (n.count(&count) != 0) count = 0;
  if (count > kMaxGpus) count = kMaxGpus;
  std::vector<NvmlGpu> gpus;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    nvmlPciInfo_t info{};
    if (n.handle(i, &dev) != 0 || n.pci(dev, &info) != 0) continue;
    info.busId[sizeof info.busId - 1] = '\0';
    NvmlGpu g;
    g.pci = normalize_pci(info.busId);
    for (unsigned l = 0; n.link_state && n.remote_pci && l < kMaxLinks; ++l) {
      int active = 0;
      if (n.link_state(dev, l, &active) != 0 || !active) continue;
      nvmlPciInfo_t remote{};
      if (n.remote_pci(dev, l, &remote) != 0) continue;
      remote.busId[sizeof remote.busId - 1] = '\0';
      int type = 0;
      bool is_switch = n.remote_type && n.remote_type(dev, l, &type) == 0 && type == kLinkDeviceSwitch;
      g.links.push_back({normalize_pci(remote.busId), is_switch});
    }
    nvmlGpuFabricInfo_t fi{};
    if (n.fabric && n.fabric(dev, &fi) == 0) {
      g.fabric_known = true;
      g.clique_id = static_cast<int>(fi.cliqueId);
      g.fabric_complete = fi.state == kFabricCompleted && fi.status == 0;
      bool zero = true;
      char hex[3];
      for (unsigned char b : fi.clusterUuid) {
        zero = zero && b == 0;
        std::snprintf(hex, sizeof hex, "%02x", b);
        g.cluster_uuid += hex;
      }
      if (zero) g.cluster_uuid.clear();
    }
    gpus.push_back(std::move(g));
  }
  return gpus;
}

}  // namespace meshrun
