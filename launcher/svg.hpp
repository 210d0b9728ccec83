// `meshrun plan --format svg`: a picture of the rank map. Nodes are rows, GPUs columns; each GPU is filled
// with its pipeline stage's colour, TP groups are outlined, and hovering a GPU shows its coordinates and
// every group it belongs to (with the link the group uses). Up to kSvgDetailNodes nodes are drawn in full;
// larger jobs show the nodes of one data-parallel replica in full and every node as a small square.
#pragma once
#include <ostream>
#include <string>
#include <string_view>

#include "meshrun/config.hpp"
#include "meshrun/rank_map.hpp"

namespace meshrun {
namespace cli {
struct ScheduleView;
}

inline constexpr int kSvgDetailNodes = 16;

// Text made safe inside an SVG element or attribute (&, <, >, "). Control bytes are the caller's: pass
// untrusted text through cut_value() first (meshrun/bounded_file.hpp), which escapes them.
std::string svg_escape(const std::string& s);

// The opening every meshrun SVG shares: the <svg> element (width × height, given as formatted numbers),
// its <style> with `style_rules` (one ".class{...}" per line), `defs` (patterns; may be empty) and the page
// background. The caller appends its body and "</svg>\n".
std::string svg_preamble(const std::string& width, const std::string& height, std::string_view style_rules,
                         std::string_view defs = {});

// With a schedule (`--schedule`), the picture ends with its timeline: a row per pipeline rank, F, B and W
// in their own colours (a fused BW drawn as its B part then its W part), idle time left blank.
void render_svg(std::ostream& out, const RankMap& map, const Config& cfg, const cli::ScheduleView* schedule = nullptr);

}  // namespace meshrun
