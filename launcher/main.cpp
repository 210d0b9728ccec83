// `meshrun`: a tiny dispatcher over one file per subcommand.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "meshrun/bounded_file.hpp"
#include "meshrun/version.hpp"
#include "commands.hpp"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
#ifdef MESHRUN_HAVE_CMD_PLAN
    {"plan", cmd_plan, "dry-run a layout: rank map, groups, checks (and estimates, search)"},
#endif
#ifdef MESHRUN_HAVE_CMD_TOPO
    {"topo", cmd_topo, "show this node's GPUs, NICs, NVLink and GPU-NIC pairing"},
#endif
#ifdef MESHRUN_HAVE_CMD_SBATCH
    {"sbatch", cmd_sbatch, "render (and submit) a batch script for a template"},
#endif
#ifdef MESHRUN_HAVE_CMD_RUN
    {"run", cmd_run, "launch a template with srun (in an allocation) or mpirun (locally)"},
#endif
#ifdef MESHRUN_HAVE_CMD_PLOT
    {"plot", cmd_plot, "draw a run's metrics (loss, lr, grad norm, tokens/s, MFU) as SVG or PNG"},
#endif
#ifdef MESHRUN_HAVE_CMD_EXEC
    {"exec", cmd_exec, "per-task wrapper: set rank, GPU, CPU binding and NCCL, then exec a command"},
#endif
#ifdef MESHRUN_HAVE_CMD_PREFLIGHT
    {"preflight", cmd_preflight, "check an allocation's nodes (devices, binding, GEMM, bandwidth) before a job"},
#endif
};

void usage(std::FILE* out) {
  std::fprintf(out, "usage: meshrun <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-8s %s\n", c.name, c.summary);
  std::fprintf(out, "\n'meshrun <command> --help' shows a command's options and examples.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage(stdout);
    return 0;
  }
  if (name == "--version") {
    std::printf("meshrun %s\n", meshrun::kVersion);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (name != c.name) continue;
    if (argc >= 3 && std::string_view(argv[2]) == "--version") {  // every subcommand, as its first option
      std::printf("meshrun %s %s\n", c.name, meshrun::kVersion);
      return 0;
    }
    // The last line of defence: each command reports its own errors as one line and exit 2; anything that
    // still escapes (an allocation that outgrew memory, an unexpected exception) is said here the same way,
    // escaped so that input it echoes stays on one printable line, instead of std::terminate's abort.
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const std::bad_alloc&) {
      const bool topo = name == "topo";
      std::fprintf(stderr,
                   "meshrun %s: out of memory (std::bad_alloc) building the output; the input asks for more than "
                   "this machine can hold: %s or raise the memory limit\n",
                   c.name,
                   topo ? "check the topology XML (--xml), it describes more objects than a node has,"
                        : "lower the sizes it gives (cluster.nodes, cluster.gpus_per_node, training.global_batch_size)");
      return 2;
    } catch (const std::exception& e) {
      std::fputs(meshrun::message_lines(std::string("meshrun ") + c.name + ": ", e.what()).c_str(), stderr);
      return 2;
    }
  }
  std::fprintf(stderr, "meshrun: unknown command '%s'; run 'meshrun --help' for the list\n",
               meshrun::cut_value(argv[1]).c_str());
  return 2;
}
