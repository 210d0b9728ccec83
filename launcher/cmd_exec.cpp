// meshrun exec: the per-task wrapper (one task per GPU). Works out who this task is (Slurm step, mpirun, or
// --rank/--world-size), computes its environment with the mesh core's compute_task_env() -- the function the
// SPANK plugin calls -- binds the CPUs and execs the command.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "config_flags.hpp"
#include "launch_common.hpp"
#include "meshrun/bridges.hpp"
#include "meshrun/geometry.hpp"
#include "meshrun/site_policy.hpp"
#include "meshrun/task_env.hpp"
#include "meshrun/topology.hpp"

extern char** environ;

namespace {

const char* kExecHelp =
    "usage: meshrun exec [--template T.toml] [options] -- COMMAND ARGS...\n"
    "\n"
    "Per-task wrapper, one task per GPU: reads who this task is, sets RANK, LOCAL_RANK, WORLD_SIZE,\n"
    "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, MESHRUN_{TP,CP,PP,DP,EP}_{RANK,SIZE}, CUDA_VISIBLE_DEVICES\n"
    "and NCCL_* (the same values as the SPANK plugin), binds the task to its GPU's CPUs and execs COMMAND.\n"
    "The task is found from, in order: --rank/--world-size, Open MPI's OMPI_COMM_WORLD_* (mpirun), Slurm's\n"
    "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun).\n"
    "\n"
    "options:\n"
    "  --template FILE        the job template (layout, cluster, [env]); else defaults + flags\n"
    "  --rank R --world-size N [--local-rank L] [--master-addr HOST]\n"
    "                         run outside Slurm and mpirun as rank R of N (ranks placed as the layout says)\n"
    "  --topology FILE.xml    node topology from an hwloc XML export (default $MESHRUN_TOPOLOGY_XML, else\n"
    "                         this machine, read with hwloc)\n"
    "  --no-bind              leave the CPU affinity alone\n"
    "  --print-env            print the computed variables (NAME=value) and exit instead of running COMMAND\n"
    "  --for megatron|torchtitan\n"
    "                         append the framework's own flags for this layout to COMMAND (parallel sizes,\n"
    "                         virtual stages, sequence parallelism, ZeRO; with --template also the batch);\n"
    "                         a layout it cannot express is refused (docs/launcher.md, Bridges)\n"
    "%s"
    "\n"
    "examples:\n"
    "  srun --ntasks-per-node=8 meshrun exec --template llama3-8b.toml -- python train.py\n"
    "  mpirun -np 4 meshrun exec --template templates/tiny.toml -- meshrun-train templates/tiny.toml\n"
    "  srun meshrun exec --template gpt.toml --for megatron -- python pretrain_gpt.py --num-layers 32 ...\n"
    "  meshrun exec --template templates/tiny.toml --rank 3 --world-size 4 --print-env\n"
    "\n"
    "exit status: COMMAND's; 2 bad input (one line on stderr), nothing is run then\n";

int fail(const std::string& msg) {
  std::fputs(meshrun::message_lines("meshrun exec: ", msg).c_str(), stderr);
  return 2;
}


int to_int(const std::string& text, const std::string& what, int lo) {
  int v = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || v < lo)
    throw meshrun::ConfigError(what + "=" + text + ": expected an integer ≥ " + std::to_string(lo));
  return v;
}

const std::string* find(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

struct Explicit {
  int rank = -1, world = -1, local_rank = -1;
  std::string master_addr;
};

}  // namespace

int cmd_exec(int argc, char** argv) {
  using namespace meshrun;
  std::vector<std::string> args(argv + 1, argv + argc);
  ConfigRequest req;
  std::vector<std::string> command;
  Explicit expl;
  std::string topology_xml;
  bool bind = true, print_env = false;
  std::optional<Framework> framework;
  try {
    for (size_t i = 0; i < args.size();) {
      const std::string& a = args[i];
      if (a == "--help" || a == "-h") {
        std::printf(kExecHelp, cli::config_flags_help());
        return 0;
      }
      if (a == "--") {
        command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
        break;
      }
      if (cli::take_config_flag(args, i, req)) continue;
      auto value = [&](const char* flag, std::string* out) { return cli::take_value(args, i, flag, out); };
      std::string v;
      if (value("--template", &v)) { req.template_path = v; continue; }
      if (value("--rank", &v)) { expl.rank = to_int(v, "--rank", 0); continue; }
      if (value("--world-size", &v)) { expl.world = to_int(v, "--world-size", 1); continue; }
      if (value("--local-rank", &v)) { expl.local_rank = to_int(v, "--local-rank", 0); continue; }
      if (value("--master-addr", &v)) { expl.master_addr = v; continue; }
      if (value("--topology", &v)) { topology_xml = v; continue; }
      if (value("--for", &v)) {
        framework = parse_framework(v);
        if (!framework) throw ConfigError("--for " + v + ": unknown framework; use megatron or torchtitan");
        continue;
      }
      if (a == "--no-bind") { bind = false; ++i; continue; }
      if (a == "--print-env") { print_env = true; ++i; continue; }
      throw ConfigError("unknown option '" + a + "'; put the command after '--' (see 'meshrun exec --help')");
    }
    if (command.empty() && !print_env)
      throw ConfigError("no command; write meshrun exec [options] -- COMMAND ARGS...");
    if ((expl.rank >= 0) != (expl.world >= 0))
      throw ConfigError("--rank and --world-size go together; give both");
    if (expl.rank >= 0 && expl.rank >= expl.world)
      throw ConfigError("--rank " + std::to_string(expl.rank) + " is outside 0.." + std::to_string(expl.world - 1));
  } catch (const ConfigError& e) {
    return fail(e.what());
  }

  auto env = environment_map(environ);
  req.environment = &env;
  // A missing program is bad input: say so before anything else (execvp's own error would come last).
  if (!command.empty()) {
    bool found = command[0].find('/') != std::string::npos ? ::access(command[0].c_str(), X_OK) == 0
                                                           : launch::find_in_path(command[0], env).has_value();
    if (!found) return fail("cannot run '" + command[0] + "': not found or not executable; check the command and $PATH");
  }
  TaskEnv task;
  TaskContext ctx;
  try {
    // Who this task is: explicit flags, else mpirun, else Slurm. mpirun inside an allocation also leaves
    // SLURM_PROCID of its own daemon step, so mpirun's variables come first.
    std::string mode;
    GpuAllocation gpus;
    if (expl.rank >= 0) {
      mode = "flags";
      ctx.omp_threads_given = find(env, "OMP_NUM_THREADS") != nullptr;
      ctx.rank = expl.rank;
      ctx.world = expl.world;
    } else if (find(env, "OMPI_COMM_WORLD_RANK")) {
      mode = "mpirun";
      ctx = launch::context_from_mpirun(env);
    } else if (find(env, "SLURM_PROCID")) {
      mode = "slurm";  // task_env_from_slurm() below: the plugin's own path from Slurm's variables
    } else {
      return fail("cannot tell which rank this task is: not in a Slurm step (no SLURM_PROCID) nor under mpirun "
                  "(no OMPI_COMM_WORLD_RANK); run it with srun or mpirun, or pass --rank R --world-size N");
    }

    // The GPUs this task may see: Slurm's variables, or a CUDA_VISIBLE_DEVICES the caller set; none = all.
    if (mode != "slurm") gpus = gpu_allocation_from_slurm(env);
    launch::Resolved r = launch::resolve(build_config(req), !command.empty() && launch::is_trainer_command(command));
    RankMap map(r.layout, r.cluster);
    if (framework) {  // the framework's flags, checked against the command's own
      std::optional<BatchGeometry> geometry;
      if (!req.template_path.empty()) {
        std::string why;
        geometry = batch_geometry(r.cfg.job.training, r.layout, &why);
        if (!geometry) throw ConfigError(why);
      }
      FrameworkFlags ff = framework_flags(*framework, r.cfg.job, r.layout, geometry ? &*geometry : nullptr);
      if (!ff.refusal.empty()) throw ConfigError("--for " + std::string(framework_key(*framework)) + ": " + ff.refusal);
      if (const std::string clash = merge_with_command(command, &ff.flags); !clash.empty())
        throw ConfigError("--for " + std::string(framework_key(*framework)) + ": " + clash);
      command.insert(command.end(), ff.flags.begin(), ff.flags.end());
    }
    if (mode == "flags") {
      if (ctx.world != map.world())
        throw TaskEnvError("--world-size " + std::to_string(ctx.world) + " but the layout needs " +
                           std::to_string(map.world()) + " ranks; pass --world-size " + std::to_string(map.world()));
      Placement p = map.placement(ctx.rank);
      ctx.local_rank = expl.local_rank >= 0 ? expl.local_rank : p.local_rank;
      ctx.local_world = r.cluster.gpus_per_node;
      ctx.node_id = p.node;
    }
    if (mode != "slurm") {
      // One host, or the template's host names (rank 0 sits on the first); else the caller must say.
      bool one_host = ctx.local_world == ctx.world;
      ctx.master_addr = !expl.master_addr.empty()          ? expl.master_addr
                        : one_host                          ? std::string("127.0.0.1")
                        : !r.cfg.job.cluster.hostlist.empty() ? r.cluster.hosts.front()
                                                             : std::string();
      if (ctx.master_addr.empty())
        throw TaskEnvError("ranks on several hosts but no host names: pass --master-addr HOST or set "
                           "cluster.hostlist so rank 0's host is known");
    }
    // The CPUs this task may use now (its cgroup / the launcher's binding): the GPU's CPUs are cut to them.
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask)) ctx.allowed_cpus.cpus.push_back(c);

    // Like the plugin's topology_xml= plugstack argument, a site may name a node export in the environment.
    TopologyRequest treq;
    const std::string* site_xml = find(env, "MESHRUN_TOPOLOGY_XML");
    treq.xml_path = !topology_xml.empty() ? topology_xml : site_xml ? *site_xml : std::string();
    treq.node_type = find_node_type(r.cfg.job.cluster.node_type);
    NodeTopology topo = load_topology(treq);
    EnvInputs inputs = env_inputs(r.cfg);  // site policy from the site file, the job's [env] allow-listed
    if (mode == "slurm") {
      task = task_env_from_slurm(map, env, topo, inputs.policy, inputs.user_env, ctx.allowed_cpus);
      ctx.rank = std::atoi(task.get("RANK")->c_str());
    } else {
      task = compute_task_env(map, ctx, topo, gpus, inputs.policy, inputs.user_env);
    }
  } catch (const ConfigError& e) {
    return fail(e.what());
  } catch (const TaskEnvError& e) {
    return fail(e.what());
  } catch (const TopologyError& e) {
    return fail(e.what());
  }

  if (ctx.rank == 0) {
    for (const auto& w : task.warnings) std::fprintf(stderr, "meshrun exec: warning: %s\n", meshrun::cut_long_values(w).c_str());
  }
  auto say_notes = [&] {  // once the task will run (a refusal stays one line)
    if (ctx.rank == 0)
      for (const auto& n : task.notes) std::fprintf(stderr, "meshrun exec: note: %s\n", meshrun::cut_long_values(n).c_str());
  };
  // Multi-node NVLink needs an IMEX channel on the node the task runs on (checked before running; --print-env
  // only warns, it may run on a login node).
  std::string imex;
  if (const std::string* mnnvl = task.get("NCCL_MNNVL_ENABLE"); mnnvl && *mnnvl == "1") imex = imex_channel_problem();
  if (print_env) {
    if (!imex.empty() && ctx.rank == 0) std::fprintf(stderr, "meshrun exec: warning: %s\n", meshrun::cut_long_values(imex).c_str());
    say_notes();
    for (const auto& [k, v] : task.vars) std::printf("%s=%s\n", k.c_str(), v.c_str());
    return 0;
  }
  if (!imex.empty()) return fail(imex);
  say_notes();
  for (const auto& [k, v] : task.vars) ::setenv(k.c_str(), v.c_str(), 1);
  if (bind && !task.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : task.cpus.cpus)
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
      std::fprintf(stderr, "meshrun exec: warning: cannot bind rank %d to CPUs %s (%s); running unbound\n", ctx.rank,
                   task.cpus.str().c_str(), std::strerror(errno));
  }
  std::vector<char*> cargv;
  for (auto& s : command) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  ::execvp(cargv[0], cargv.data());
  return fail("cannot run '" + command[0] + "': " + std::strerror(errno) + "; check the command and $PATH");
}
