// Subcommands of the `meshrun` CLI, one file each (cmd_<name>.cpp). Each returns the process exit code:
// 0 success, 2 bad input (one line on stderr naming the problem and the fix), 1 other failure.
#pragma once

int cmd_plan(int argc, char** argv);
int cmd_topo(int argc, char** argv);
int cmd_exec(int argc, char** argv);
int cmd_sbatch(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_plot(int argc, char** argv);
int cmd_preflight(int argc, char** argv);
