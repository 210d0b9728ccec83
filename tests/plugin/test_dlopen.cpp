// Loads the built spank_meshrun.so the way Slurm does (dlopen + dlsym) and checks what it exports.
//
// Slurm's commands provide spank_* and slurm_* to the plugin at load time. This executable provides them
// instead (exported with ENABLE_EXPORTS), recording calls, so dlopen(RTLD_NOW) proves every other symbol the
// plugin needs resolves, and slurm_spank_init can be driven without a cluster. Real behaviour inside Slurm
// is tested on the local cluster (tests/slurm).
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include <slurm/spank.h>
}

namespace {
struct FakeSlurm {
  spank_context_t context = S_CTX_ALLOCATOR;
  std::vector<std::string> registered;
  std::vector<std::string> errors;
} fake;

std::string format(const char* fmt, va_list ap) {
  char buf[2048];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}
}  // namespace

extern "C" {
spank_context_t spank_context(void) { return fake.context; }
int spank_remote(spank_t) { return fake.context == S_CTX_REMOTE; }
spank_err_t spank_option_register(spank_t, struct spank_option* opt) {
  fake.registered.push_back(opt->name);
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}
const char* spank_strerror(spank_err_t) { return "fake"; }
spank_err_t spank_get_item(spank_t, spank_item_t, ...) { return ESPANK_NOT_AVAIL; }
spank_err_t spank_getenv(spank_t, const char*, char*, int) { return ESPANK_ENV_NOEXIST; }
spank_err_t spank_setenv(spank_t, const char*, const char*, int) { return ESPANK_ERROR; }
spank_err_t spank_job_control_setenv(spank_t, const char*, const char*, int) { return ESPANK_ERROR; }
void slurm_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fake.errors.push_back(format(fmt, ap));
  va_end(ap);
}
void slurm_info(const char*, ...) {}
void slurm_verbose(const char*, ...) {}
void slurm_debug(const char*, ...) {}
void slurm_debug2(const char*, ...) {}
void slurm_debug3(const char*, ...) {}
void slurm_spank_log(const char*, ...) {}
}

namespace {
using init_fn = int (*)(spank_t, int, char**);

void* plugin() {
  static void* handle = [] {
    void* h = dlopen(MESHRUN_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!h) FAIL("dlopen: " << dlerror());
    return h;
  }();
  return handle;
}
}  // namespace

TEST_CASE("the plugin loads with every symbol resolved and identifies itself") {
  void* h = plugin();
  auto name = static_cast<const char*>(dlsym(h, "plugin_name"));
  auto type = static_cast<const char*>(dlsym(h, "plugin_type"));
  auto version = static_cast<const unsigned*>(dlsym(h, "plugin_version"));
  auto spank_version = static_cast<const unsigned*>(dlsym(h, "spank_plugin_version"));
  REQUIRE(name);
  REQUIRE(type);
  REQUIRE(version);
  REQUIRE(spank_version);
  CHECK(std::string(name) == "meshrun");
  CHECK(std::string(type) == "spank");
  // Slurm refuses a plugin built for another major.minor release.
  CHECK((*version & 0xffff00u) == (SLURM_VERSION_NUMBER & 0xffff00u));
  CHECK(*spank_version == 1u);
  for (const char* hook : {"slurm_spank_init", "slurm_spank_init_post_opt", "slurm_spank_local_user_init",
                           "slurm_spank_user_init", "slurm_spank_task_init"})
    CHECK(dlsym(h, hook) != nullptr);
  CHECK(dlsym(h, "_ZN7meshrun14validate_layoutEv") == nullptr);
}

TEST_CASE("only the plugin identity and slurm_spank_* are exported") {
  std::string cmd = std::string("nm -D --defined-only --format=posix ") + MESHRUN_PLUGIN_PATH;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::set<std::string> names;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    std::string s(line);
    names.insert(s.substr(0, s.find(' ')));
  }
  REQUIRE(pclose(p) == 0);
  REQUIRE(names.size() >= 9);
  std::regex allowed("plugin_name|plugin_type|plugin_version|spank_plugin_version|slurm_spank_[a-z_]+");
  for (const auto& n : names) {
    INFO(n);
    CHECK(std::regex_match(n, allowed));
  }
  CHECK(names.count("slurm_spank_task_init") == 1);
}

TEST_CASE("init registers every option, prefixed, in sbatch's context") {
  auto init = reinterpret_cast<init_fn>(dlsym(plugin(), "slurm_spank_init"));
  REQUIRE(init);
  fake = FakeSlurm{};
  fake.context = S_CTX_ALLOCATOR;
  REQUIRE(init(nullptr, 0, nullptr) == 0);
  std::set<std::string> got(fake.registered.begin(), fake.registered.end());
  CHECK(got == std::set<std::string>{"mesh-tp", "mesh-cp", "mesh-pp", "mesh-dp", "mesh-ep", "mesh-order",
                                     "mesh-template", "mesh-env", "mesh-dry-run", "mesh-off", "mesh-preflight"});
  CHECK(fake.errors.empty());
}

TEST_CASE("an unknown plugstack argument fails at load, except inside slurmstepd") {
  auto init = reinterpret_cast<init_fn>(dlsym(plugin(), "slurm_spank_init"));
  std::string arg = "colour=blue";
  char* av[] = {arg.data()};
  fake = FakeSlurm{};
  fake.context = S_CTX_LOCAL;
  CHECK(init(nullptr, 1, av) == -1);
  REQUIRE(fake.errors.size() == 1);
  CHECK(fake.errors[0].rfind("meshrun: plugstack.conf: bad argument 'colour=blue'", 0) == 0);
  fake = FakeSlurm{};
  fake.context = S_CTX_SLURMD;
  CHECK(init(nullptr, 1, av) == -1);
  // In slurmstepd a failing init would drain the node: the error is kept for task_init instead.
  fake = FakeSlurm{};
  fake.context = S_CTX_REMOTE;
  CHECK(init(nullptr, 1, av) == 0);
  CHECK(fake.registered.size() == 11);
}
