#include "meshrun/comm/groups.hpp"

namespace meshrun::comm {

Groups bracket_groups(const Groups& g, device::Backend& backend) {
  Groups out;
  for (std::size_t k = 0; k < g.by_kind.size(); ++k)
    if (g.by_kind[k]) out.by_kind[k] = std::make_unique<HostAccessComm>(*g.by_kind[k], backend);
  if (g.world) out.world = std::make_unique<HostAccessComm>(*g.world, backend);
  return out;
}

Groups make_local_groups() {
  Groups g;
  for (auto& c : g.by_kind) c = std::make_unique<LocalComm>();
  g.world = std::make_unique<LocalComm>();
  return g;
}

}  // namespace meshrun::comm
