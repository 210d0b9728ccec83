#include "meshrun/comm/groups.hpp"

#include <stdexcept>
#include <string>

#include "meshrun/device/backend.hpp"

namespace meshrun::comm {

Groups bracket_groups(const Groups& g, device::Backend& backend) {
  Groups out;
  for (std::size_t k = 0; k < g.by_kind.size(); ++k)
    if (g.by_kind[k]) out.by_kind[k] = std::make_unique<HostAccessComm>(*g.by_kind[k], backend);
  if (g.world) out.world = std::make_unique<HostAccessComm>(*g.world, backend);
  return out;
}

Groups device_local_groups(const Groups& g, device::Backend& backend) {
  Groups out;
  for (std::size_t k = 0; k < g.by_kind.size(); ++k)
    if (g.by_kind[k]) {
      if (g.by_kind[k]->size() != 1)
        throw std::invalid_argument("a group of " + std::to_string(g.by_kind[k]->size()) + " processes on the " +
                                    backend.name() + " backend needs a device communicator (NCCL), which meshrun does "
                                    "not have yet; run one process");
      out.by_kind[k] = std::make_unique<DeviceLocalComm>(backend);
    }
  if (g.world) out.world = std::make_unique<DeviceLocalComm>(backend);
  return out;
}

Groups make_local_groups() {
  Groups g;
  for (auto& c : g.by_kind) c = std::make_unique<LocalComm>();
  g.world = std::make_unique<LocalComm>();
  return g;
}

}  // namespace meshrun::comm
