// `meshrun plot --timeline`'s module on a hand-made trace whose answer is known: the measured bubble (idle ÷
// (pp × span) over the pipeline phase), the simulator's unit-cost figure and the one from the measured costs,
// the checks against the schedule's table, and the bad-input messages. The real trace is checked end to end
// by tests/trainer/trace_cli.sh.
#include <catch2/catch.hpp>

#include <string>

#include "timeline.hpp"

using namespace meshrun::timeline;

namespace {

// 1f1b, pp 2, 2 micro-batches, dp 1: stage 0 runs F0 F1 BW0 BW1, stage 1 F0 BW0 F1 BW1 (the generator's table).
// Stage 0's pipeline phase spans [0, 100] µs, stage 1's [5, 95]; each computes 60 µs: F 10, BW 20.
std::string event(const std::string& name, int pid, int tid, double ts, double dur, int step, int mb = -1, int chunk = -1) {
  std::string s = "{\"name\":\"" + name + "\",\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",\"tid\":" +
                  std::to_string(tid) + ",\"ts\":" + std::to_string(ts) + ",\"dur\":" + std::to_string(dur) +
                  ",\"args\":{\"step\":" + std::to_string(step);
  if (mb >= 0) s += ",\"microbatch\":" + std::to_string(mb) + ",\"chunk\":" + std::to_string(chunk);
  return s + "}}";
}

std::string trace_text(const std::string& stage1_second = "BW", const std::string& other_data_extra = "") {
  std::string ev;
  auto add = [&](const std::string& e) { ev += (ev.empty() ? "" : ",\n") + e; };
  add(R"({"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"rank 0 (pp 0, dp 0, tp 0, cp 0) node n0"}})");
  add(event("pipeline", 0, 1, 1000, 100, 2));
  add(event("F", 0, 2, 1000, 10, 2, 0, 0));
  add(event("F", 0, 2, 1010, 10, 2, 1, 0));
  add(event("BW", 0, 2, 1040, 20, 2, 0, 0));
  add(event("BW", 0, 2, 1080, 20, 2, 1, 0));
  add(event("recv", 0, 4, 1020, 20, 2));
  add(event("pipeline", 1, 1, 1005, 90, 2));
  add(event("F", 1, 2, 1012, 10, 2, 0, 1));
  if (stage1_second == "BW") {
    add(event("BW", 1, 2, 1022, 20, 2, 0, 1));
    add(event("F", 1, 2, 1042, 10, 2, 1, 1));
  } else {  // the other order: not the 1f1b table's
    add(event("F", 1, 2, 1022, 10, 2, 1, 1));
    add(event("BW", 1, 2, 1032, 20, 2, 0, 1));
  }
  add(event("BW", 1, 2, 1055, 20, 2, 1, 1));
  add(event("send_act", 0, 3, 1010, 1, 2, 0, 0));  // a p2p event: not read
  return R"({"displayTimeUnit":"ms","otherData":{"meshrun_trace":1,"model":"m","schedule":"1f1b","pp":2,)"
         R"("virtual_stages":1,"microbatches":2,"tp":1,"cp":1,"dp":1,"ep":1,"world":2,"steps":[1,2],)"
         R"("clock_error_bound_us":3.5,"ranks":[{"rank":0,"pp":0,"dp":0,"tp":0,"cp":0,"node":"n0"},)"
         R"({"rank":1,"pp":1,"dp":0,"tp":0,"cp":0,"node":"n1"}])" +
         other_data_extra + "},\n\"traceEvents\":[\n" + ev + "\n]}\n";
}

std::string error_of(const std::string& text, std::optional<int> step = std::nullopt) {
  try {
    compare(parse_trace(text, "dir/trace.json"), step);
  } catch (const TimelineError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("timeline: the measured bubble is idle ÷ (pp × span) over the step's pipeline phase") {
  const Trace t = parse_trace(trace_text(), "dir/trace.json");
  CHECK(t.spec.pp == 2);
  CHECK(t.spec.microbatches == 2);
  CHECK(t.steps == std::vector<int>{1, 2});
  const Comparison c = compare(t, std::nullopt);
  CHECK(c.step == 2);  // the last traced
  CHECK(c.span_us == Approx(100));
  // (100 − 60) + (100 − 60) idle over 2 × 100
  CHECK(c.measured_bubble == Approx(0.4));
  REQUIRE(c.measured.size() == 2);
  CHECK(c.measured[0].rank == 0);
  CHECK(c.measured[1].rank == 1);
  CHECK(c.measured[1].node == "n1");
  CHECK(c.measured[1].boxes[0].start == Approx(12));  // from the first stage's start
  REQUIRE(c.measured[0].waits.size() == 1);
  CHECK(c.measured[0].waits[0].first == Approx(20));
  // meshrun plan --schedule's figure for 1f1b, pp 2, m 2: (p − 1) / (m + p − 1)
  CHECK(c.simulated_bubble == Approx(1.0 / 3));
  CHECK(c.makespan == Approx(9));
  // F 10, BW 20 on both chunks: the unit-cost shape again
  CHECK(c.simulated_measured_costs == Approx(1.0 / 3));
  const std::string s = summary_text(t, c);
  CHECK(s.find("measured bubble_fraction 0.4000 ") != std::string::npos);
  CHECK(s.find("simulated bubble_fraction 0.3333 ") != std::string::npos);
  const std::string svg = render_timeline_svg(t, c);
  CHECK(svg.find("Measured: bubble_fraction 0.4000") != std::string::npos);
  CHECK(svg.find("Simulated: bubble_fraction 0.3333") != std::string::npos);
  CHECK(svg == render_timeline_svg(t, c));  // a function of the input
  CHECK(render_timeline_svg(t, c, "T & T").find("T &amp; T") != std::string::npos);
}

TEST_CASE("timeline: a trace that does not follow its layout's schedule is refused") {
  CHECK(error_of(trace_text("F")) ==
        "dir/trace.json: rank 1 (pipeline stage 1) in step 2: compute action 1 is F(mb=1, chunk=1) where the 1f1b "
        "table has BW(mb=0, chunk=1); the trace does not match its otherData layout");
  CHECK(error_of(trace_text(), 1) == "dir/trace.json: rank 0 has no \"pipeline\" phase in step 1");
  CHECK(error_of(trace_text(), 7) == "dir/trace.json: step 7 was not traced; the trace holds steps 1, 2");
}

TEST_CASE("timeline: bad input is one line naming the file") {
  CHECK(error_of("{\"traceEvents\":[]}") ==
        "dir/trace.json: a trace-event file without otherData.meshrun_trace: not written by meshrun-train --trace, so "
        "its pipeline layout is unknown");
  CHECK(error_of("[1, 2]").find("dir/trace.json: not a trace-event file") == 0);
  CHECK(error_of("{\"traceEvents\":").find("dir/trace.json: not JSON (") == 0);
  std::string text = trace_text();
  text.replace(text.find("\"ts\":1012.000000"), 16, "\"ts\":\"x\"");
  CHECK(error_of(text) == "dir/trace.json: traceEvents[8]: \"ts\" is missing or not a number");
  text = trace_text();
  text.replace(text.find("\"schedule\":\"1f1b\""), 17, "\"schedule\":\"interleaved\"");
  CHECK(error_of(text).find("dir/trace.json: otherData: ") == 0);  // interleaved needs virtual_stages >= 2
  text = trace_text();
  text.replace(text.find("\"microbatches\":2"), 16, "\"microbatches\":1000000000");
  CHECK(error_of(text).find("schedule slots, more than meshrun simulates") != std::string::npos);
}
