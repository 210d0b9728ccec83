// The rank-map picture: one cell per GPU up to 16 nodes, TP outlines, hover titles with every group, and
// the summarized view for large jobs.
#include <catch2/catch.hpp>

#include <sstream>

#include "launch_common.hpp"
#include "plan_render.hpp"
#include "svg.hpp"

using namespace meshrun;

namespace {

std::string svg_of(const std::string& name, std::vector<std::string> sets = {}, bool schedule = false) {
  ConfigRequest req;
  req.template_path = std::string(MESHRUN_SOURCE_DIR) + "/templates/" + name + ".toml";
  req.use_site = false;
  req.sets = std::move(sets);
  launch::Resolved r = launch::resolve(build_config(req));
  RankMap map(r.layout, r.cluster);
  std::ostringstream o;
  if (schedule) {
    cli::ScheduleView v = cli::make_schedule_view(r.cfg.job, r.layout);
    render_svg(o, map, r.cfg, &v);
  } else {
    render_svg(o, map, r.cfg);
  }
  return o.str();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("small jobs: every GPU drawn, TP groups outlined, groups in the hover text") {
  std::string s = svg_of("mixtral-8x7b");  // 8 nodes x 8, tp 2, pp 4, ep 4
  CHECK(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(s.find("</svg>\n") == s.size() - 7);
  CHECK(count(s, "class=\"gpu\"/>") == 64 + 4);  // cells + 4 stage swatches
  CHECK(count(s, "class=\"tp\"/>") == 32 + 1);   // TP groups + legend sample
  CHECK(count(s, "tp split") == 0);
  CHECK(s.find("<title>rank 5 on node0000 (node 0), GPU 5\nTP 1 of 2 over nvlink: ranks 4-5") != std::string::npos);
  CHECK(s.find("EP 2 of 4 over nvlink") != std::string::npos);
  CHECK(s.find("PP 0 of 4 over network") != std::string::npos);
  CHECK(s.find("stage 3: layers 24-31") != std::string::npos);
  CHECK(count(s, "<g><title>") == 64);
}

TEST_CASE("TP groups that leave their node are drawn dashed") {
  // dp fastest: TP partners are 8 ranks apart, on another node.
  std::string s = svg_of("mixtral-8x7b", {"parallel.order=dp-tp-cp-ep-pp", "parallel.ep=1"});
  CHECK(count(s, "tp split") > 0);
  std::string ok = svg_of("mixtral-8x7b");
  CHECK(count(ok, "tp split") == 0);
}

TEST_CASE("large jobs: one DP replica in full, every node as a square") {
  std::string s = svg_of("llama3-405b");  // 2048 nodes, tp 8, pp 16, dp 128
  CHECK(count(s, "<g><title>") == 16 * 8);  // the 16 nodes of replica 0
  CHECK(s.find("Data-parallel replica 0 in full: 16 nodes") != std::string::npos);
  CHECK(s.find("All 2048 nodes") != std::string::npos);
  CHECK(count(s, "(node 2047): stage 15") == 1);
  CHECK(s.find("DP: 128 groups of 128 GPUs; all cross the network") != std::string::npos);
  CHECK(s.size() < 1'000'000);  // stays viewable
}

TEST_CASE("plan --schedule: the timeline under the map, F, B and W in their own colours") {
  // tiny re-laid as ZB-H1 on 4 ranks, 4 micro-batches: 16 each of F, B and W.
  std::string zb = svg_of("tiny", {"parallel.tp=1", "parallel.pp=4", "parallel.pipeline_schedule=zb"}, true);
  CHECK(count(zb, "Pipeline schedule: zb, 4 micro-batches; bubble_fraction 0.2000, peak_live_microbatches 4") == 1);
  CHECK(count(zb, "fill=\"#4e79a7\" class=\"act\"") == 16);  // F
  CHECK(count(zb, "fill=\"#f28e2b\" class=\"act\"") == 16);  // B
  CHECK(count(zb, "fill=\"#59a14f\" class=\"act\"") == 16);  // W
  CHECK(count(zb, ">pp rank ") == 4);
  CHECK(count(zb, "<title>rank 3: W(mb=3, chunk=3)</title>") == 1);
  for (const char* legend : {">F forward<", ">B input gradient<", ">W weight gradient (a fused BW: B then W)<", ">idle<"})
    CHECK(count(zb, legend) == 1);
  CHECK(zb.find("</svg>\n") == zb.size() - 7);
  // A fused BW is its B part then its W part: as many B as W boxes, one per F.
  std::string fused = svg_of("llama3-70b", {}, true);  // interleaved, pp 4 × 2 chunks, 32 micro-batches
  CHECK(count(fused, "fill=\"#4e79a7\" class=\"act\"") == 4 * 2 * 32);
  CHECK(count(fused, "fill=\"#f28e2b\" class=\"act\"") == 4 * 2 * 32);
  CHECK(count(fused, "fill=\"#59a14f\" class=\"act\"") == 4 * 2 * 32);
  CHECK(count(fused, "<title>rank 1: BW(mb=0, chunk=5)</title>") == 1);  // chunk 5 lives on rank 5 mod 4
  CHECK(count(fused, ">stage 1: 20 layers in 2 chunks<") == 1);           // chunks 1 and 5: 10 layers each
  // Without --schedule, no timeline.
  CHECK(count(svg_of("tiny", {"parallel.tp=1", "parallel.pp=4"}), "Pipeline schedule") == 0);
}
