// Node types for planning without the hardware. Facts from vendor documentation (DGX H100/H200/A100 user
// guides, GB200 NVL72 product brief); see docs/topology.md for sources.
#include "meshrun/layout.hpp"

namespace meshrun {

const std::vector<NodeType>& node_types() {
  static const std::vector<NodeType> types = {
      {"dgx-h100", "h100-sxm", 8, 8, 8, true, "DGX H100: 8x H100 SXM5, NVSwitch, 8x ConnectX-7 400G (one per GPU)"},
      {"dgx-h200", "h200", 8, 8, 8, true, "DGX H200: 8x H200 SXM, NVSwitch, 8x ConnectX-7 400G (one per GPU)"},
      {"dgx-a100", "a100-80gb", 8, 8, 8, true, "DGX A100: 8x A100 SXM4 80GB, NVSwitch, 8x ConnectX-6 200G"},
      {"gb200-nvl72", "gb200", 4, 72, 4, true,
       "GB200 NVL72 compute tray: 4x B200 per node, one NVLink domain of 72 GPUs over 18 trays, 4x ConnectX-7 400G"},
      {"generic", "generic", 8, 1, 0, false, "N GPUs per node without NVLink; set gpus_per_node"},
  };
  return types;
}

const NodeType* find_node_type(std::string_view name) {
  for (const auto& t : node_types())
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace meshrun
