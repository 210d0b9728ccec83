// The SPANK entry points: C linkage outside, one dispatch per context, no exception ever escapes.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "spank_state.hpp"

extern "C" {
// SPANK_PLUGIN() defines const arrays, which C++ gives internal linkage; declaring them extern "C" first
// keeps them visible to Slurm's dlsym ("Plugin name/type/version symbol missing" otherwise).
extern const char plugin_name[];
extern const char plugin_type[];
extern const unsigned int plugin_version;
extern const unsigned int spank_plugin_version;
SPANK_PLUGIN(meshrun, 1);
}

namespace meshrun::plugin {

PluginState& plugin_state() {
  static PluginState state;
  return state;
}

std::optional<std::string> job_getenv(spank_t sp, const char* name) {
  std::string buf(4096, '\0');
  for (int tries = 0; tries < 6; ++tries) {
    spank_err_t rc = spank_getenv(sp, name, buf.data(), static_cast<int>(buf.size()));
    if (rc == ESPANK_SUCCESS) return std::string(buf.c_str());
    if (rc != ESPANK_NOSPACE) return std::nullopt;
    buf.assign(buf.size() * 4, '\0');
  }
  return std::nullopt;
}

void log_error_lines(const std::string& text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    // Each line escaped (cut_long_values): what it echoes cannot add lines or terminal sequences to the log.
    if (!line.empty()) slurm_error("%s", meshrun::cut_long_values(line).c_str());
    if (end == std::string::npos) break;
    start = end + 1;
  }
}

namespace {

// Slurm echoes a value an option callback refuses, whole, in its own line ("Invalid --mesh-tp argument:
// VALUE"). A value that prints as itself on one short line may go there; any other (long, control bytes,
// not ASCII) is refused in init_post_opt instead, where Slurm adds only its generic line. (Under an
// `optional` plugstack line Slurm ignores that failure; the tasks then end in task_init with the message.)
bool echoes_safely(const char* value) {
  if (value == nullptr) return true;
  const std::size_t n = std::strlen(value);
  return n <= 60 && std::all_of(value, value + n, [](char c) { return c >= 0x20 && c <= 0x7e; });
}

int on_option(int val, const char* optarg, int remote) {
  try {
    PluginState& st = plugin_state();
    std::string error;
    if (set_option(st.opts, static_cast<OptionId>(val), optarg, &error)) return 0;
    if (remote || !echoes_safely(optarg)) {  // remote: Slurm only logs a failing callback; fail the tasks instead
      if (st.deferred_error.empty()) st.deferred_error = "meshrun: " + error;
      st.bad_option = true;
      return 0;
    }
    slurm_error("meshrun: %s", meshrun::cut_long_values(error).c_str());
    return -1;
  } catch (...) {
    slurm_error("meshrun: internal error while parsing an option");
    return -1;
  }
}

// The table Slurm copies at registration. Deliberately not named spank_options: that magic symbol is
// ignored by sbatch/salloc, while spank_option_register works in every context.
std::vector<spank_option> make_option_table() {
  std::vector<spank_option> table;
  for (const auto& spec : option_specs())
    table.push_back(spank_option{const_cast<char*>(spec.name), const_cast<char*>(spec.arginfo),
                                 const_cast<char*>(spec.usage), spec.arginfo ? 1 : 0,
                                 static_cast<int>(spec.id), on_option});
  return table;
}

int register_options(spank_t sp) {
  static std::vector<spank_option> table = make_option_table();
  for (auto& opt : table) {
    spank_err_t rc = spank_option_register(sp, &opt);
    if (rc != ESPANK_SUCCESS) {
      slurm_error("meshrun: cannot register --%s: %s", opt.name, spank_strerror(rc));
      return -1;
    }
  }
  return 0;
}

template <class F>
int guarded(const char* where, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    slurm_error("meshrun: %s failed: %s", where, meshrun::cut_long_values(e.what()).c_str());
  } catch (...) {
    slurm_error("meshrun: %s failed with an unknown exception", where);
  }
  return -1;
}

}  // namespace
}  // namespace meshrun::plugin

using namespace meshrun::plugin;

extern "C" int slurm_spank_init(spank_t sp, int ac, char** av) {
  return guarded("init", [&] {
    PluginState& st = plugin_state();
    std::string error;
    spank_context_t ctx = spank_context();
    if (!parse_plugstack_args(ac, av, &st.args, &error)) {
      // slurmstepd: a failing init drains the node (batch step) or reports rc=0 (srun), so defer it to
      // task_init. Prolog/epilog processes would drain the node too and meshrun does no work there: log only.
      // srun, sbatch, salloc and slurmd: refuse loudly, they print the line and stop.
      if (ctx == S_CTX_REMOTE) {
        st.deferred_error = "meshrun: " + error;
      } else if (ctx == S_CTX_JOB_SCRIPT) {
        slurm_error("meshrun: %s", meshrun::cut_long_values(error).c_str());
      } else {
        slurm_error("meshrun: %s", meshrun::cut_long_values(error).c_str());
        return -1;
      }
    }
    if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) return register_options(sp);
    return 0;
  });
}

extern "C" int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  return guarded("init_post_opt", [&] {
    PluginState& st = plugin_state();
    const spank_context_t ctx = spank_context();
    if ((ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR) && st.bad_option) {  // a value kept from Slurm's echo
      slurm_error("%s", meshrun::cut_long_values(st.deferred_error).c_str());
      return -1;
    }
    switch (ctx) {
      case S_CTX_LOCAL: return srun_init_post_opt(sp, st);
      case S_CTX_ALLOCATOR: return alloc_init_post_opt(sp, st);
      default: return 0;  // slurmstepd checks in user_init, when the step's items are known
    }
  });
}

extern "C" int slurm_spank_local_user_init(spank_t sp, int, char**) {
  return guarded("local_user_init", [&] { return srun_local_user_init(sp, plugin_state()); });
}

extern "C" int slurm_spank_user_init(spank_t sp, int, char**) {
  // Never fail here (see PluginState::deferred_error); an exception becomes a deferred error too.
  PluginState& st = plugin_state();
  int rc = guarded("user_init", [&] { return stepd_user_init(sp, st); });
  if (rc != 0 && st.deferred_error.empty()) st.deferred_error = "meshrun: user_init failed (see the slurmd log)";
  return 0;
}

extern "C" int slurm_spank_task_init(spank_t sp, int, char**) {
  return guarded("task_init", [&] { return stepd_task_init(sp, plugin_state()); });
}
