// NVML at run time, loaded with dlopen("libnvidia-ml.so.1"): nothing links the driver, and a node without it
// (or a login node) simply gets no answer. Private to mesh/src.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace meshrun {

struct NvmlLink {
  std::string remote_pci;  // "0000:1b:00.0" (lower case, 4-digit domain)
  bool remote_is_switch = false;
};

struct NvmlGpu {
  std::string pci;             // normalized like hwloc's busid
  std::vector<NvmlLink> links; // active NVLinks
  bool fabric_known = false;   // nvmlDeviceGetGpuFabricInfo answered
  std::string cluster_uuid;    // hex, "" when all zero
  int clique_id = -1;
  bool fabric_complete = false;
};

// nullopt with *why set when NVML cannot be loaded or initialized. Bounded: at most 64 GPUs x 18 links.
std::optional<std::vector<NvmlGpu>> query_nvml(std::string* why);

// "00000000:1B:00.0" -> "0000:1b:00.0".
std::string normalize_pci(const std::string& busid);

}  // namespace meshrun
