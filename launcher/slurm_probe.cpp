#include "slurm_probe.hpp"

#include "meshrun/bounded_file.hpp"

#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace meshrun::launch {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// A Slurm configuration file (from $SLURM_CONF: user input): a regular file of at most 16 MiB, else "".
std::string read_conf(const std::string& path) {
  std::string text, error;
  return meshrun::read_bounded_file(path, meshrun::kSlurmConfLimit, "Slurm configuration", &text, &error) ? text : "";
}

// PlugStackConfig from slurm.conf, else plugstack.conf next to it (Slurm's default).
std::string plugstack_path(const std::map<std::string, std::string>& env) {
  auto it = env.find("SLURM_CONF");
  std::string conf = it != env.end() && !it->second.empty() ? it->second : "/etc/slurm/slurm.conf";
  std::istringstream in(read_conf(conf));
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line.substr(0, line.find('#')));
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = trim(line.substr(0, eq));
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
    if (key == "plugstackconfig") return trim(line.substr(eq + 1));
  }
  return (std::filesystem::path(conf).parent_path() / "plugstack.conf").string();
}

}  // namespace

bool plugstack_lists_meshrun(const std::string& path, std::string* evidence, int depth) {
  if (depth > 8) return false;  // include loops
  std::istringstream in(read_conf(path));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = trim(line.substr(0, line.find('#')));
    std::istringstream words(line);
    std::string first, second;
    words >> first >> second;
    if (first == "include") {
      glob_t g{};
      if (::glob(second.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          if (plugstack_lists_meshrun(g.gl_pathv[i], evidence, depth + 1)) {
            ::globfree(&g);
            return true;
          }
        }
      }
      ::globfree(&g);
    } else if ((first == "required" || first == "optional") &&
               std::filesystem::path(second).filename().string().find("spank_meshrun") != std::string::npos) {
      *evidence = path + ":" + std::to_string(n) + ": " + line;
      return true;
    }
  }
  return false;
}

PluginProbe detect_plugin(const std::map<std::string, std::string>& env) {
  PluginProbe p;
  int rc = -1;
  std::string help = run_capture({"sbatch", "--help"}, 20, &rc);
  if (rc == 0) {
    p.installed = help.find("--mesh-tp") != std::string::npos;
    p.evidence = p.installed ? "`sbatch --help` lists --mesh-tp" : "`sbatch --help` does not list --mesh-tp";
    return p;
  }
  std::string stack = plugstack_path(env);
  p.installed = plugstack_lists_meshrun(stack, &p.evidence);
  if (!p.installed) p.evidence = "sbatch unavailable here and " + stack + " does not load spank_meshrun";
  return p;
}

std::optional<int> partition_cpus(const std::string& partition) {
  std::vector<std::string> argv{"sinfo", "-h", "-o", "%c"};
  if (!partition.empty()) argv.insert(argv.end(), {"-p", partition});
  int rc = -1;
  std::string out = run_capture(argv, 20, &rc);
  if (rc != 0) return std::nullopt;
  std::optional<int> least;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    line = trim(line);
    if (line.empty()) continue;
    int v = 0;
    try {
      v = std::stoi(line);  // "8" or "8+" (sinfo's "+" means "some nodes have more")
    } catch (...) {
      return std::nullopt;
    }
    if (v > 0) least = least ? std::min(*least, v) : v;
  }
  return least;
}

int parse_slurm_version(const std::string& text) {
  // "slurm 22.05.8", "slurm-wlm 22.05.8", "slurm 24.05.1-1"
  size_t p = text.find_first_of("0123456789");
  if (p == std::string::npos) return 0;
  int major = 0, minor = 0;
  size_t i = p;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && major < 1000; ++i)
    major = major * 10 + (text[i] - '0');
  if (i >= text.size() || text[i] != '.') return 0;
  for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && minor < 100; ++i)
    minor = minor * 10 + (text[i] - '0');
  return major > 0 ? major * 100 + minor : 0;
}

int slurm_version() {
  int rc = -1;
  std::string out = run_capture({"sbatch", "--version"}, 10, &rc);
  return rc == 0 ? parse_slurm_version(out) : 0;
}

std::string run_capture(const std::vector<std::string>& argv, int timeout_s, int* rc, bool show_stderr) {
  *rc = -1;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return "";
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return "";
  }
  if (pid == 0) {
    ::dup2(fds[1], 1);
    if (!show_stderr) {
      int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) ::dup2(null, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  timespec start{};
  ::clock_gettime(CLOCK_MONOTONIC, &start);
  bool timed_out = false;
  for (;;) {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    long left_ms = timeout_s * 1000L - ((now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L);
    if (left_ms <= 0) { timed_out = true; break; }
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left_ms));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) { timed_out = r == 0; break; }
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);  // the child we started, by its id
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!timed_out && WIFEXITED(status)) *rc = WEXITSTATUS(status);
  return out;
}

}  // namespace meshrun::launch
