// `meshrun plot`'s module: ticks at round numbers, fixed tick labels, the metrics file's rules (run records,
// old lines without "record", repeated steps, resumed runs, other kinds skipped), its bad-input messages, and
// the SVG's panels. The picture as a whole is pinned by the golden file (cli_cases.sh plot-golden).
#include <catch2/catch.hpp>

#include <sstream>

#include "plot.hpp"

using namespace meshrun::plot;

namespace {

MetricsFile parse(const std::string& text, const std::string& name = "dir/m.jsonl") {
  std::istringstream in(text);
  return parse_metrics(in, name);
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const PlotError& e) {
    return e.what();
  }
  return "(no error)";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

const char* kRun =
    R"({"record":"run","schema":1,"start_step":0,"model":"tiny","layout":{"tp":2,"cp":1,"pp":1,"dp":2,"ep":1,"zero":1,"virtual_stages":1,"world":4}})";

}  // namespace

TEST_CASE("plot: ticks at 1-2-5 round numbers covering the range") {
  CHECK(nice_ticks(0, 60, 8) == std::vector<double>{0, 10, 20, 30, 40, 50, 60});
  CHECK(nice_ticks(1, 24, 8) == std::vector<double>{0, 5, 10, 15, 20, 25});
  CHECK(nice_ticks(2.3, 5.6, 4) == std::vector<double>{2, 3, 4, 5, 6});
  CHECK(nice_ticks(0, 0.0031, 4) == std::vector<double>{0, 0.001, 0.002, 0.003, 0.004});
  const auto t = nice_ticks(0, 18000, 4);
  CHECK(t.front() == 0);
  CHECK(t[1] == 5000);
  CHECK(t.back() == 20000);
  // A flat series still gets two ticks around its value.
  const auto flat = nice_ticks(3, 3, 4);
  REQUIRE(flat.size() >= 2);
  CHECK(flat.front() <= 3);
  CHECK(flat.back() >= 3);
  CHECK(nice_ticks(0, 0, 4).size() >= 2);
}

TEST_CASE("plot: tick labels are short, fixed and need no locale") {
  CHECK(tick_label(0, 0.5) == "0");
  CHECK(tick_label(1.5, 0.5) == "1.5");
  CHECK(tick_label(3, 1) == "3");
  CHECK(tick_label(0.25, 0.05) == "0.25");
  CHECK(tick_label(5000, 5000) == "5k");
  CHECK(tick_label(15000, 5000) == "15k");
  CHECK(tick_label(12500, 2500) == "12.5k");
  CHECK(tick_label(2500, 500) == "2500");
  CHECK(tick_label(1.2e6, 2e5) == "1.2M");
  CHECK(tick_label(800000, 2e5) == "800k");
  CHECK(tick_label(0.0005, 0.0005) == "5e-4");
  CHECK(tick_label(0.0015, 0.0005) == "1.5e-3");
  CHECK(tick_label(0.003, 0.001) == "3e-3");
  CHECK(tick_label(-2, 1) == "-2");
  CHECK(tick_label(-1e-17, 0.1) == "0");  // never "-0"
}

TEST_CASE("plot: layout labels name the axes above 1") {
  CHECK(layout_label(2, 1, 1, 2, 1, 1, 1) == "tp2·dp2·zero1");
  CHECK(layout_label(1, 2, 4, 8, 1, 0, 2) == "cp2·pp4×v2·dp8");
  CHECK(layout_label(1, 1, 1, 4, 4, 3, 1) == "dp4·ep4·zero3");
  CHECK(layout_label(1, 1, 1, 1, 1, 0, 1) == "1 rank");
}

TEST_CASE("plot: run records, old lines, repeated steps, resumed runs and other kinds") {
  SECTION("lines without \"record\" are steps (files from before schema 1)") {
    const MetricsFile f = parse("{\"step\":1,\"loss\":5.5,\"lr\":0.001,\"tokens_per_s\":4000}\n"
                                "{\"step\":2,\"loss\":5.0,\"lr\":0.002,\"tokens_per_s\":4100}\n");
    REQUIRE(f.steps.size() == 2);
    CHECK(f.runs.empty());
    CHECK(f.name == "m.jsonl");
    CHECK(*f.steps.at(2).v[kLoss] == 5.0);
    CHECK_FALSE(f.steps.at(1).v[kMfu].has_value());
    CHECK_FALSE(f.steps.at(1).v[kEvalLoss].has_value());
  }
  SECTION("a repeated step keeps its later record") {
    const MetricsFile f = parse("{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":9}\n{\"step\":2,\"loss\":4}\n");
    CHECK(*f.steps.at(2).v[kLoss] == 4);
  }
  SECTION("a resumed run drops what the earlier run wrote after its start step") {
    const std::string resumed =
        R"({"record":"run","schema":1,"start_step":2,"layout":{"tp":1,"dp":4,"zero":3}})";
    const MetricsFile f = parse(std::string(kRun) + "\n" + R"({"record":"step","step":1,"loss":5})" + "\n" +
                                R"({"record":"step","step":2,"loss":4})" + "\n" +
                                R"({"record":"step","step":3,"loss":3})" + "\n" +
                                R"({"record":"step","step":4,"loss":2})" + "\n" + resumed + "\n" +
                                R"({"record":"step","step":3,"loss":3.5})" + "\n");
    REQUIRE(f.runs.size() == 2);
    CHECK(f.runs[0].layout == "tp2·dp2·zero1");
    CHECK(f.runs[0].model == "tiny");
    CHECK(f.runs[1].layout == "dp4·zero3");
    CHECK(f.runs[1].start_step == 2);
    REQUIRE(f.steps.size() == 3);  // step 4 of the first run is gone
    CHECK(*f.steps.at(3).v[kLoss] == 3.5);
    CHECK(*f.steps.at(2).v[kLoss] == 4);
  }
  SECTION("other record kinds, null values and blank lines are skipped") {
    const MetricsFile f = parse(std::string(kRun) + "\n\n" +
                                R"({"record":"straggler","rank":3,"step":1,"loss":"not a number"})" + "\n" +
                                R"({"record":"step","step":1,"loss":null,"grad_norm":1.5,"eval_loss":5.1})" + "\r\n");
    CHECK(f.other_records == 1);
    REQUIRE(f.steps.size() == 1);
    CHECK_FALSE(f.steps.at(1).v[kLoss].has_value());
    CHECK(*f.steps.at(1).v[kGradNorm] == 1.5);
    CHECK(*f.steps.at(1).v[kEvalLoss] == 5.1);
  }
}

TEST_CASE("plot: bad input names FILE:LINE and the problem") {
  CHECK(error_of("{\"step\":1}\n{\"step\":2,\"loss\":}\n") ==
        "dir/m.jsonl:2: not JSON (syntax error at byte 18); each line of a metrics file is one JSON object");
  CHECK(error_of("[1,2]\n").rfind("dir/m.jsonl:1: not a JSON object", 0) == 0);
  CHECK(error_of("{\"loss\":1}\n") == "dir/m.jsonl:1: a step record needs \"step\", a whole number >= 0 (it has none)");
  CHECK(error_of("{\"step\":-1}\n").rfind("dir/m.jsonl:1: a step record needs", 0) == 0);
  CHECK(error_of("{\"step\":1.5}\n").rfind("dir/m.jsonl:1: a step record needs", 0) == 0);
  CHECK(error_of("\n{\"step\":1,\"lr\":\"3e-4\"}\n") == "dir/m.jsonl:2: \"lr\" is not a number");
  CHECK(error_of("{\"step\":1,\"record\":7}\n").rfind("dir/m.jsonl:1: \"record\" is not a string", 0) == 0);
  CHECK(error_of(std::string(kRun) + "\n").rfind("dir/m.jsonl: no step records (1 lines, 1 run records)", 0) == 0);
  CHECK(error_of("").rfind("dir/m.jsonl: no step records (0 lines", 0) == 0);
  // Over 1 MiB on one line: refused at that line, before it is held whole.
  const std::string long_line = "{\"step\":1}\n{\"step\":2,\"x\":\"" + std::string(kMaxLineBytes, 'a') + "\"}\n";
  CHECK(error_of(long_line).rfind("dir/m.jsonl:2: line longer than 1 MiB", 0) == 0);
  // Just under the limit is fine.
  const std::string fits = "{\"step\":2,\"x\":\"" + std::string(kMaxLineBytes - 20, 'a') + "\"}\n";
  CHECK(parse(fits).steps.size() == 1);
}

TEST_CASE("plot: panels follow the data; the same input gives the same bytes") {
  std::vector<MetricsFile> files = {parse("{\"step\":1,\"loss\":5,\"lr\":0.001,\"tokens_per_s\":4000}\n"
                                          "{\"step\":2,\"loss\":4,\"lr\":0.002,\"tokens_per_s\":4200}\n")};
  const std::string svg = render_svg(files, {});
  CHECK(count(svg, "class=\"panel\"") == 3);
  CHECK(svg.find(">loss<") != std::string::npos);
  CHECK(svg.find(">learning rate<") != std::string::npos);
  CHECK(svg.find(">tokens/s (global: all ranks)<") != std::string::npos);
  CHECK(svg.find("MFU") == std::string::npos);        // no file has mfu: no panel
  CHECK(svg.find("grad norm") == std::string::npos);
  CHECK(svg.find("eval loss") == std::string::npos);  // no eval: no key for it
  CHECK(svg.find("m.jsonl") != std::string::npos);    // no run record: labelled by file name
  CHECK(render_svg(files, {}) == svg);

  PlotOptions with_ref;
  with_ref.reference = Reference{5000, "planner estimate: test"};
  const std::string near = render_svg(files, with_ref);
  CHECK(count(near, "class=\"estimate\"") == 2);  // the key's dash and the line across the panel
  CHECK(near.find("above this axis") == std::string::npos);
  with_ref.reference = Reference{1e6, "planner estimate: test"};
  const std::string far = render_svg(files, with_ref);
  CHECK(count(far, "class=\"estimate\"") == 1);  // off the scale: only the key, which says where it is
  CHECK(far.find("↑ planner estimate: test, above this axis: 238× the highest measured") != std::string::npos);

  // Untrusted text (a title, a model name) cannot break the XML.
  PlotOptions titled;
  titled.title = "a <b> & \"c\"\x1b";
  const std::string t = render_svg(files, titled);
  CHECK(t.find("a &lt;b&gt; &amp; &quot;c&quot;\\x1b") != std::string::npos);
}

// Issue 47 item 10: files of one name are told apart by their directories; --label names them instead.
TEST_CASE("plot: runs of the same file name are labelled by their directories") {
  auto names = [](std::vector<std::string> paths, std::vector<std::string> labels = {}) {
    std::vector<MetricsFile> files;
    for (auto& p : paths) {
      MetricsFile f;
      f.path = p;
      files.push_back(f);
    }
    name_runs(files, labels);
    std::vector<std::string> out;
    for (auto& f : files) out.push_back(f.name);
    return out;
  };
  REQUIRE(names({"ck1/metrics.jsonl", "ck2/metrics.jsonl"}) == std::vector<std::string>{"ck1/metrics.jsonl", "ck2/metrics.jsonl"});
  REQUIRE(names({"a/run/m.jsonl", "b/run/m.jsonl", "x.jsonl"}) ==
          std::vector<std::string>{"a/run/m.jsonl", "b/run/m.jsonl", "x.jsonl"});
  REQUIRE(names({"tp2.jsonl", "dir/pp2.jsonl"}) == std::vector<std::string>{"tp2.jsonl", "pp2.jsonl"});
  REQUIRE(names({"/r/m.jsonl", "m.jsonl"}) == std::vector<std::string>{"r/m.jsonl", "m.jsonl"});
  REQUIRE(names({"m.jsonl", "m.jsonl"}) == std::vector<std::string>{"m.jsonl", "m.jsonl #2"});
  REQUIRE(names({"ck1/metrics.jsonl", "ck2/metrics.jsonl"}, {"base", "lr 1e-3"}) ==
          std::vector<std::string>{"base", "lr 1e-3"});
}
