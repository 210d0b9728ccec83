// `meshrun plan --format svg`: a picture of the rank map. Nodes are rows, GPUs columns; each GPU is filled
// with its pipeline stage's colour, TP groups are outlined, and hovering a GPU shows its coordinates and
// every group it belongs to (with the link the group uses). Up to kSvgDetailNodes nodes are drawn in full;
// larger jobs show the nodes of one data-parallel replica in full and every node as a small square.
#pragma once
#include <ostream>

#include "meshrun/config.hpp"
#include "meshrun/rank_map.hpp"

namespace meshrun {

inline constexpr int kSvgDetailNodes = 16;

void render_svg(std::ostream& out, const RankMap& map, const Config& cfg);

}  // namespace meshrun
