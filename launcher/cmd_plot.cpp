// meshrun plot: training curves from metrics files (launcher/plot.*) as SVG, or PNG through rsvg-convert; with
// --template, the planner's throughput estimate for that job as a reference line.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "config_flags.hpp"
#include "meshrun/resolve.hpp"
#include "meshrun/bounded_file.hpp"
#include "meshrun/config.hpp"
#include "meshrun/layout.hpp"
#include "plot.hpp"
#include "timeline.hpp"
#ifdef MESHRUN_HAVE_PLANNER
#include "meshrun/planner.hpp"
#endif

extern char** environ;

namespace {

const char* kPlotHelp =
    "usage: meshrun plot FILE.jsonl... -o OUT.svg|OUT.png [options]\n"
    "       meshrun plot --timeline DIR/trace.json -o OUT.svg|OUT.png [--step N] [--title TEXT]\n"
    "\n"
    "Draw training curves from meshrun-train metrics files (JSON Lines): loss (eval loss as circles), learning\n"
    "rate, grad norm, global tokens/s and MFU, one panel each over the step axis; a panel no file has data for\n"
    "is left out. Several files overlay, one colour each, labelled by the layout of their run records and the\n"
    "file (its name, with as many of its directories as tell it from the others: ck1/metrics.jsonl), or --label.\n"
    "\n"
    "With --timeline: the measured pipeline timeline of one traced step (meshrun-train --trace DIR writes\n"
    "DIR/trace.json), a row per pipeline rank of dp 0 with F, B and W in the colours of 'meshrun plan --schedule',\n"
    "above the schedule simulator's plan for the same layout (read from the trace); prints the bubble fraction of\n"
    "each: measured = idle ÷ (pp × the step's pipeline span), simulated = 'meshrun plan --schedule''s figure.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE        write FILE: .svg, or .png (the SVG converted by rsvg-convert, package\n"
    "                           librsvg2-bin)\n"
    "  --title TEXT             the picture's title (default: \"Training metrics\" and the model)\n"
    "  --label TEXT             the legend's name of a file instead of its path; give it once per file, in order\n"
    "  --timeline TRACE         draw TRACE (DIR/trace.json, or DIR) instead of metrics files\n"
    "  --step N                 with --timeline: the traced step to draw (default: the last traced)\n"
    "  --template T.toml        draw the planner's throughput estimate for this job (what 'meshrun plan T.toml\n"
    "                           --estimate' prints, per GPU, times the job's GPUs) on the tokens/s panel\n"
    "  with --template:\n"
    "%s"
    "\n"
    "examples:\n"
    "  meshrun-train templates/tiny.toml --metrics run.jsonl && meshrun plot run.jsonl -o run.svg\n"
    "  meshrun plot tp2.jsonl pp2.jsonl -o compare.png --title 'tiny: TP 2 against PP 2'\n"
    "  meshrun plot run.jsonl -o run.svg --template templates/llama3-8b.toml --set training.steps=100\n"
    "  meshrun-train T.toml --trace tr && meshrun plot --timeline tr/trace.json -o timeline.png\n"
    "\n"
    "exit status: 0 written, 2 bad input (one line on stderr naming FILE:LINE), 1 rsvg-convert failed\n";

int fail(const std::string& msg) {
  std::fputs(meshrun::message_lines("meshrun plot: ", msg).c_str(), stderr);
  return 2;
}

bool ends_with(const std::string& s, const std::string& tail) {
  if (s.size() < tail.size()) return false;
  for (size_t i = 0; i < tail.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[s.size() - tail.size() + i])) != tail[i]) return false;
  return true;
}

// The first executable `name` on $PATH, or "".
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string full = dir + "/" + name;
    struct stat st {};
    if (::stat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(full.c_str(), X_OK) == 0) return full;
    start = end + 1;
  }
  return "";
}

bool write_file(const std::string& path, const std::string& data, std::string* error) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    *error = meshrun::cut_value(path, 200) + ": cannot write (" + std::strerror(errno) + "); check the directory";
    return false;
  }
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    *error = meshrun::cut_value(path, 200) + ": writing failed (" + std::strerror(errno) + ")";
    return false;
  }
  return true;
}

// rsvg-convert reads the SVG on its standard input and writes `png`. Returns its exit status (127 when it
// could not be started).
int convert_to_png(const std::string& rsvg, const std::string& svg, const std::string& png) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return 127;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], 0);
  std::vector<std::string> args = {rsvg, "--format", "png", "--output", png};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, rsvg.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    return 127;
  }
  // A reader that quits early must not kill this process with SIGPIPE: write errors are checked instead.
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &old);
  size_t done = 0;
  while (done < svg.size()) {
    const ssize_t n = ::write(fds[1], svg.data() + done, svg.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fds[1]);
  ::sigaction(SIGPIPE, &old, nullptr);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return done == svg.size() ? WEXITSTATUS(status) : std::max(1, WEXITSTATUS(status));
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

int cmd_plot(int argc, char** argv) {
  using namespace meshrun;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> inputs;
  std::string output, title, timeline;
  std::optional<int> step;
  std::vector<std::string> labels;  // --label, one per metrics file
  ConfigRequest req;
  bool config_flags = false;
  try {
    for (size_t i = 0; i < args.size();) {
      const std::string& a = args[i];
      if (a == "--help" || a == "-h") {
        std::printf(kPlotHelp, cli::config_flags_help());
        return 0;
      }
      std::string v;
      if (cli::take_value(args, i, "-o", &v) || cli::take_value(args, i, "--output", &v)) {
        output = v;
        continue;
      }
      if (cli::take_value(args, i, "--title", &v)) {
        title = v;
        continue;
      }
      if (cli::take_value(args, i, "--label", &v)) {
        labels.push_back(v);
        continue;
      }
      if (cli::take_value(args, i, "--timeline", &v)) {
        if (!timeline.empty()) throw ConfigError("--timeline given twice; give one trace");
        timeline = v;
        continue;
      }
      if (cli::take_value(args, i, "--step", &v)) {
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1 || n > 1000000000)
          throw ConfigError("--step " + v + ": give a traced step number (1 or more)");
        step = static_cast<int>(n);
        continue;
      }
      if (cli::take_value(args, i, "--template", &v)) {
        if (!req.template_path.empty()) throw ConfigError("--template given twice; give one");
        req.template_path = v;
        continue;
      }
      if (cli::take_config_flag(args, i, req)) {
        config_flags = true;
        continue;
      }
      if (a == "--") {  // the rest are files, even those that start with '-'
        inputs.insert(inputs.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
        break;
      }
      if (a.size() > 1 && a[0] == '-') throw ConfigError("unknown option '" + a + "'; see 'meshrun plot --help'");
      inputs.push_back(a);
      ++i;
    }
    if (!timeline.empty() && !inputs.empty())
      throw ConfigError("--timeline draws one trace; give no metrics files with it (" + inputs.front() + ")");
    if (!timeline.empty() && (config_flags || !req.template_path.empty()))
      throw ConfigError("--template and --set do not apply to --timeline: the layout comes from the trace");
    if (step && timeline.empty()) throw ConfigError("--step applies to --timeline; give --timeline DIR/trace.json");
    if (inputs.empty() && timeline.empty())
      throw ConfigError("no metrics file; give FILE.jsonl (meshrun-train --metrics FILE.jsonl writes one)");
    if (!labels.empty() && !timeline.empty()) throw ConfigError("--label names metrics files; --timeline draws one trace without a legend");
    if (!labels.empty() && labels.size() != inputs.size())
      throw ConfigError(std::to_string(labels.size()) + " --label for " + std::to_string(inputs.size()) +
                        " metrics files; give one --label per file, in the files' order");
    if (output.empty()) throw ConfigError("no output; give -o OUT.svg or -o OUT.png");
    if (!ends_with(output, ".svg") && !ends_with(output, ".png"))
      throw ConfigError("-o " + output + ": the output's name must end in .svg or .png");
    if (config_flags && req.template_path.empty())
      throw ConfigError("--set and the --mesh-*/--nodes/--site flags apply to --template; give --template T.toml");
  } catch (const ConfigError& e) {
    return fail(e.what());
  }

  // PNG needs rsvg-convert: refused before any work when it is missing.
  std::string rsvg;
  const bool png = ends_with(output, ".png");
  if (png) {
    rsvg = find_on_path("rsvg-convert");
    if (rsvg.empty())
      return fail("-o " + output + " needs rsvg-convert, which is not on PATH; install the package librsvg2-bin "
                  "(apt-get install librsvg2-bin), or write SVG with -o FILE.svg");
  }

  if (!timeline.empty()) {
    std::string svg, summary;
    try {
      const timeline::Trace trace = timeline::read_trace(timeline);
      const timeline::Comparison comparison = timeline::compare(trace, step);
      svg = timeline::render_timeline_svg(trace, comparison, title);
      summary = timeline::summary_text(trace, comparison);
    } catch (const timeline::TimelineError& e) {
      return fail(e.what());
    }
    std::string error;
    if (!png) {
      if (!write_file(output, svg, &error)) return fail(error);
    } else if (const int rc = convert_to_png(rsvg, svg, output); rc != 0) {
      std::fprintf(stderr, "meshrun plot: %s failed (exit %d) writing %s\n", rsvg.c_str(), rc,
                   cut_value(output, 200).c_str());
      return 1;
    }
    std::fputs(summary.c_str(), stdout);
    return 0;
  }

  plot::PlotOptions options;
  options.title = title;
  if (!req.template_path.empty()) {
#ifdef MESHRUN_HAVE_PLANNER
    // The figure `meshrun plan T.toml --estimate` prints (tokens/s per GPU), over the job's GPUs: the panel is
    // global tokens/s. The planner models the template's GPUs, not the machine the metrics came from.
    auto env = environment_map(environ);
    req.environment = &env;
    try {
      Config cfg = build_config(req);
      // The planner estimates any program's step: the model's rules, not the bundled trainer's.
      const Resolution res = resolve_job(cfg, {RuleSet::model});
      if (!res.ok()) return fail("--template " + req.template_path + ": invalid layout: " + res.problems.front().message);
      if (std::string why = planner::schedule_problem(cfg.job, *res.layout); !why.empty())
        return fail("--template " + req.template_path + ": " + why);
      const planner::Estimate est = planner::estimate(cfg.job);
      const int gpus = est.layout.tp * est.layout.cp * est.layout.pp * est.layout.dp;
      char per_gpu[64];
      std::snprintf(per_gpu, sizeof per_gpu, "%.0f", est.tokens_per_s_per_gpu);
      plot::Reference ref;
      ref.tokens_per_s = est.tokens_per_s_per_gpu * gpus;
      ref.label = std::string("planner estimate: ") + per_gpu + " tokens/s per GPU × " + std::to_string(gpus) +
                  " GPUs (" + est.hardware.gpu + ")";
      options.reference = ref;
    } catch (const ConfigError& e) {
      return fail(std::string("--template: ") + e.what());
    }
#else
    return fail("--template needs the planner, which this build does not include");
#endif
  }

  std::vector<plot::MetricsFile> files;
  try {
    for (const auto& path : inputs) files.push_back(plot::read_metrics(path));
  } catch (const plot::PlotError& e) {
    return fail(e.what());
  }
  plot::name_runs(files, labels);
  const std::string svg = plot::render_svg(files, options);

  std::string error;
  if (!png) {
    if (!write_file(output, svg, &error)) return fail(error);
    return 0;
  }
  const int rc = convert_to_png(rsvg, svg, output);
  if (rc != 0) {
    std::fprintf(stderr, "meshrun plot: %s failed (exit %d) writing %s\n", rsvg.c_str(), rc,
                 cut_value(output, 200).c_str());
    return 1;
  }
  return 0;
}
