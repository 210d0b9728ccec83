#include "meshrun/comm/groups.hpp"

namespace meshrun::comm {

Groups bracket_groups(const Groups& g, const std::function<void()>& open, const std::function<void()>& close) {
  Groups out;
  for (std::size_t k = 0; k < g.by_kind.size(); ++k)
    if (g.by_kind[k]) out.by_kind[k] = std::make_unique<HostAccessComm>(*g.by_kind[k], open, close);
  if (g.world) out.world = std::make_unique<HostAccessComm>(*g.world, open, close);
  return out;
}

Groups make_local_groups() {
  Groups g;
  for (auto& c : g.by_kind) c = std::make_unique<LocalComm>();
  g.world = std::make_unique<LocalComm>();
  return g;
}

}  // namespace meshrun::comm
