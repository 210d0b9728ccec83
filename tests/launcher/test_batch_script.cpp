// Golden tests of the generated batch scripts, plus the rules behind them (signal, requeue, quoting, plugin
// detection). Regenerate the golden files after an intended change with
//   MESHRUN_UPDATE_GOLDEN=1 build/tests/launcher/test_launcher "[golden]"
// and review the diff.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "batch_script.hpp"
#include "slurm_probe.hpp"

using namespace meshrun;
using namespace meshrun::launch;

namespace {

const std::string kSrc = MESHRUN_SOURCE_DIR;

Resolved resolve_template(const std::string& name, std::vector<std::string> sets = {}) {
  ConfigRequest req;
  req.template_path = kSrc + "/templates/" + name + ".toml";
  req.use_site = false;
  req.sets = std::move(sets);
  return resolve(build_config(req));
}

// Fixed paths so the scripts do not depend on where the tree or the build lives.
BatchOptions fixed_options(const std::string& name, bool plugin) {
  BatchOptions o;
  o.template_path = "/srv/meshrun/templates/" + name + ".toml";
  o.meshrun = "/opt/meshrun/bin/meshrun";
  o.trainer = "/opt/meshrun/bin/meshrun-train";
  o.plugin = plugin;
  o.cpus_per_task = 16;
  return o;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void check_golden(const std::string& file, const std::string& actual) {
  std::string path = kSrc + "/tests/launcher/golden/" + file;
  const char* update = std::getenv("MESHRUN_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(path) << actual;
    WARN("updated " << path);
  }
  INFO("golden file " << path << " (MESHRUN_UPDATE_GOLDEN=1 rewrites it)");
  REQUIRE(std::filesystem::exists(path));
  CHECK(read(path) == actual);
}

bool has_line(const std::string& script, const std::string& line) {
  std::istringstream in(script);
  std::string l;
  while (std::getline(in, l))
    if (l == line) return true;
  return false;
}

}  // namespace

TEST_CASE("batch scripts of every template match their golden files", "[golden]") {
  for (const char* name : {"tiny", "llama3-8b", "llama3-70b", "llama3-405b", "llama3-405b-128k", "mixtral-8x7b"}) {
    SECTION(name) {
      Resolved r = resolve_template(name);
      check_golden(std::string(name) + ".sbatch", render_batch_script(r, fixed_options(name, false)));
    }
  }
}

TEST_CASE("batch scripts with the SPANK plugin match their golden files", "[golden]") {
  for (const char* name : {"tiny", "llama3-70b", "mixtral-8x7b"}) {
    SECTION(name) {
      Resolved r = resolve_template(name);
      check_golden(std::string(name) + ".plugin.sbatch", render_batch_script(r, fixed_options(name, true)));
    }
  }
}

TEST_CASE("geometry: one task per GPU on every node") {
  Resolved r = resolve_template("llama3-70b");
  std::string s = render_batch_script(r, fixed_options("llama3-70b", false));
  CHECK(has_line(s, "#SBATCH --nodes=" + std::to_string(r.cluster.nodes)));
  CHECK(has_line(s, "#SBATCH --ntasks-per-node=8"));
  CHECK(has_line(s, "#SBATCH --gpus-per-node=8"));
  CHECK(has_line(s, "#SBATCH --cpus-per-task=16"));
  CHECK(has_line(s, "#SBATCH --open-mode=append"));
  // Overrides reach the script: twice the nodes.
  Resolved r2 = resolve_template("llama3-70b", {"cluster.nodes=" + std::to_string(2 * r.cluster.nodes)});
  std::string s2 = render_batch_script(r2, fixed_options("llama3-70b", false));
  CHECK(has_line(s2, "#SBATCH --nodes=" + std::to_string(2 * r.cluster.nodes)));
  CHECK_FALSE(has_line(s2, "#SBATCH --nodes=" + std::to_string(r.cluster.nodes)));
}

TEST_CASE("checkpoint signal and requeue follow the [checkpoint] section") {
  // tiny has no checkpoint directory: no signal, no requeue, the step is exec'd directly.
  std::string tiny = render_batch_script(resolve_template("tiny"), fixed_options("tiny", false));
  CHECK(tiny.find("--signal") == std::string::npos);
  CHECK(tiny.find("--requeue") == std::string::npos);
  CHECK(tiny.find("\nexec srun ") != std::string::npos);

  std::string on = render_batch_script(resolve_template("tiny", {"checkpoint.dir=ck", "checkpoint.signal_lead_s=300"}),
                                       fixed_options("tiny", false));
  CHECK(has_line(on, "#SBATCH --signal=B:USR1@300"));
  CHECK(has_line(on, "#SBATCH --requeue"));
  CHECK(on.find("trap 'requested=1; kill -USR1 \"$step\" 2>/dev/null' USR1") != std::string::npos);
  CHECK(on.find("scontrol requeue") != std::string::npos);

  std::string no_resume = render_batch_script(resolve_template("tiny", {"checkpoint.dir=ck", "checkpoint.resume=false"}),
                                              fixed_options("tiny", false));
  CHECK(has_line(no_resume, "#SBATCH --signal=B:USR1@120"));
  CHECK(no_resume.find("--requeue") == std::string::npos);
  CHECK(no_resume.find("scontrol requeue") == std::string::npos);

  std::string usr2 = render_batch_script(resolve_template("tiny", {"checkpoint.dir=ck", "checkpoint.signal=SIGUSR2"}),
                                         fixed_options("tiny", false));
  CHECK(has_line(usr2, "#SBATCH --signal=B:USR2@120"));

  CHECK_THROWS_WITH(render_batch_script(resolve_template("tiny", {"checkpoint.dir=ck", "checkpoint.signal=KILL"}),
                                        fixed_options("tiny", false)),
                    Catch::Contains("checkpoint.signal = \"KILL\"") && Catch::Contains("USR1"));
}

// Runs the rendered body of a checkpointing tiny script under bash with a fake srun (it writes the trainer's
// status file as `mode` says and exits like the trainer would) and a fake scontrol that logs its arguments.
struct BodyRun {
  std::string out, scontrol;
};
BodyRun run_body(const std::string& mode, const std::vector<std::string>& sets = {}) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("meshrun-body-" + std::to_string(::getpid()) + "-" + mode);
  fs::remove_all(dir);
  fs::create_directories(dir / "bin");
  std::vector<std::string> all{"checkpoint.dir=" + (dir / "ck").string()};
  all.insert(all.end(), sets.begin(), sets.end());
  const std::string script = render_batch_script(resolve_template("tiny", all), fixed_options("tiny", false));
  std::ofstream(dir / "job.sh") << script;
  std::ofstream(dir / "bin/srun") << "#!/bin/bash\nmkdir -p " << (dir / "ck").string() << "\nS=" << (dir / "ck/status").string()
                                  << "\ncase $MODE in\n"
                                     "  saved) echo 'saved 7 USR1' >$S; exit 75 ;;\n"
                                     "  not-saved) echo 'not-saved 7 USR1 writing rank-00001.safetensors failed' >$S; exit 1 ;;\n"
                                     "  finished) echo 'finished 20' >$S; exit 0 ;;\n"
                                     "  stale) exit 137 ;;\n"
                                     "  signal) kill -USR1 $PPID; sleep 0.3; exit 138 ;;\n"
                                     "esac\n";
  std::ofstream(dir / "bin/scontrol") << "#!/bin/sh\necho \"scontrol $*\" >>" << (dir / "scontrol.log").string() << "\n";
  if (mode == "stale") {  // a status file left by an earlier job must not count
    fs::create_directories(dir / "ck");
    std::ofstream(dir / "ck/status") << "saved 3 USR1\n";
  }
  fs::permissions(dir / "bin/srun", fs::perms::owner_all);
  fs::permissions(dir / "bin/scontrol", fs::perms::owner_all);
  const std::string cmd = "cd " + dir.string() + " && PATH=" + (dir / "bin").string() + ":$PATH SLURM_JOB_ID=42 MODE=" + mode +
                          " bash job.sh >out.txt 2>&1";
  (void)std::system(cmd.c_str());
  BodyRun r{read((dir / "out.txt").string()), read((dir / "scontrol.log").string())};
  fs::remove_all(dir);
  return r;
}

TEST_CASE("the batch script requeues only when the trainer's status file says the save was committed") {
  const std::string on = render_batch_script(resolve_template("tiny", {"checkpoint.dir=ck"}), fixed_options("tiny", false));
  CHECK(on.find("checkpointed before the time limit") == std::string::npos);  // the old unconditional claim
  CHECK(on.find("status=ck/status\n") != std::string::npos);

  BodyRun saved = run_body("saved");
  CHECK(saved.out.find("meshrun: the trainer committed checkpoint step-7 after SIGUSR1") != std::string::npos);
  CHECK(saved.out.find("requeueing job 42") != std::string::npos);
  CHECK(saved.scontrol == "scontrol requeue 42\n");

  BodyRun not_saved = run_body("not-saved");
  CHECK(not_saved.out.find("stopped after step 7 on SIGUSR1 without saving a checkpoint: writing rank-00001.safetensors "
                           "failed; not requeueing") != std::string::npos);
  CHECK(not_saved.scontrol.empty());

  BodyRun finished = run_body("finished");
  CHECK(finished.out.find("meshrun: training finished at step 20") != std::string::npos);
  CHECK(finished.scontrol.empty());

  BodyRun stale = run_body("stale");  // removed before srun starts: no claim, no requeue
  CHECK(stale.out.find("committed") == std::string::npos);
  CHECK(stale.scontrol.empty());

  BodyRun relayed = run_body("signal");
  CHECK(relayed.out.find("meshrun: USR1 was relayed to the job step, but no status file says a checkpoint was saved") !=
        std::string::npos);
  CHECK(relayed.out.find("srun exit 138") != std::string::npos);
  CHECK(relayed.scontrol.empty());

  BodyRun no_resume = run_body("saved", {"checkpoint.resume=false"});
  CHECK(no_resume.out.find("not requeueing (checkpoint.resume = false)") != std::string::npos);
  CHECK(no_resume.scontrol.empty());
}

TEST_CASE("values that would break an #SBATCH line are refused with their source") {
  Resolved r = resolve_template("tiny", {"job.name=my run"});
  CHECK_THROWS_WITH(render_batch_script(r, fixed_options("tiny", false)),
                    Catch::Contains("set --set job.name=my run") && Catch::Contains("space"));
  Resolved inject = resolve_template("tiny", {"job.partition=gpu\nrm"});
  CHECK_THROWS_AS(render_batch_script(inject, fixed_options("tiny", false)), ConfigError);
}

TEST_CASE("the plugin variant passes the resolved layout to Slurm and skips meshrun exec") {
  Resolved r = resolve_template("tiny", {"parallel.tp=1"});
  std::string s = render_batch_script(r, fixed_options("tiny", true));
  CHECK(has_line(s, "#SBATCH --mesh-tp=1"));
  CHECK(has_line(s, "#SBATCH --mesh-dp=4"));
  CHECK(has_line(s, "#SBATCH --mesh-template=/srv/meshrun/templates/tiny.toml"));
  CHECK(s.find("meshrun exec") == std::string::npos);
  std::string plain = render_batch_script(r, fixed_options("tiny", false));
  CHECK(plain.find("--mesh-tp") == std::string::npos);
  CHECK(plain.find("/opt/meshrun/bin/meshrun exec --template /srv/meshrun/templates/tiny.toml") != std::string::npos);
}

TEST_CASE("a user command replaces the trainer and is quoted for the shell") {
  BatchOptions o = fixed_options("tiny", false);
  o.command = {"python", "-c", "import os; print(os.environ['RANK'])"};
  o.sets = {"--set", "training.steps=3"};
  std::string s = render_batch_script(resolve_template("tiny"), o);
  CHECK(s.find("--set training.steps=3 -- python -c 'import os; print(os.environ['\\''RANK'\\''])'") !=
        std::string::npos);
  CHECK(s.find("meshrun-train") == std::string::npos);
}

TEST_CASE("extra #SBATCH options are single options") {
  BatchOptions o = fixed_options("tiny", false);
  o.extra = {"--exclusive", "--constraint=h100&ib"};
  std::string s = render_batch_script(resolve_template("tiny"), o);
  CHECK(has_line(s, "#SBATCH --exclusive"));
  CHECK(has_line(s, "#SBATCH --constraint=h100&ib"));
  for (const char* bad : {"--comment=a b", "exclusive", "--x\nrm -rf /"}) {
    o.extra = {bad};
    CHECK_THROWS_WITH(render_batch_script(resolve_template("tiny"), o), Catch::Contains("--sbatch-option"));
  }
}

TEST_CASE("shell quoting") {
  CHECK(shell_quote("templates/tiny.toml") == "templates/tiny.toml");
  CHECK(shell_quote("--set=a.b=1") == "--set=a.b=1");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("$HOME") == "'$HOME'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_join({"echo", "a b", "c"}) == "echo 'a b' c");
}

TEST_CASE("plugin detection reads plugstack.conf and its includes") {
  auto dir = std::filesystem::temp_directory_path() / ("meshrun-plugstack-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "plugstack.conf.d");
  std::ofstream(dir / "plugstack.conf") << "# site plugins\ninclude " << (dir / "plugstack.conf.d").string()
                                        << "/*.conf\n";
  std::ofstream(dir / "plugstack.conf.d" / "pyxis.conf") << "required /usr/lib/slurm/spank_pyxis.so\n";
  std::string evidence;
  CHECK_FALSE(plugstack_lists_meshrun((dir / "plugstack.conf").string(), &evidence));
  std::ofstream(dir / "plugstack.conf.d" / "meshrun.conf")
      << "# meshrun\noptional /usr/lib/x86_64-linux-gnu/slurm/spank_meshrun.so nccl=auto\n";
  CHECK(plugstack_lists_meshrun((dir / "plugstack.conf").string(), &evidence));
  CHECK_THAT(evidence, Catch::Contains("meshrun.conf:2") && Catch::Contains("spank_meshrun.so"));
  // A commented-out line does not count.
  std::ofstream(dir / "plugstack.conf.d" / "meshrun.conf") << "#optional /usr/lib/slurm/spank_meshrun.so\n";
  CHECK_FALSE(plugstack_lists_meshrun((dir / "plugstack.conf").string(), &evidence));
  std::filesystem::remove_all(dir);
}

TEST_CASE("multi-node NVLink domains: --segment on Slurm 24.05+, a comment saying why not otherwise") {
  Resolved r = resolve_template("tiny", {"cluster.node_type=gb200-nvl72", "cluster.nodes=36", "cluster.gpus_per_node=4",
                                         "parallel.tp=1", "training.global_batch_size=576"});
  REQUIRE(r.cluster.nvlink_domain_gpus == 72);
  BatchOptions o = fixed_options("tiny", false);
  o.slurm_version = 2405;
  std::string s = render_batch_script(r, o);
  CHECK(has_line(s, "#SBATCH --segment=18"));
  o.slurm_version = 2205;
  s = render_batch_script(r, o);
  CHECK(s.find("#SBATCH --segment") == std::string::npos);
  CHECK(s.find("# --segment=18 (18 nodes of one 72-GPU NVLink domain) not rendered: the local Slurm is 22.05; "
               "--segment needs Slurm 24.05 or later") != std::string::npos);
  o.slurm_version = 0;
  CHECK(render_batch_script(r, o).find("the local Slurm's version is unknown") != std::string::npos);
  // One domain per node (DGX H100): nothing about segments.
  CHECK(render_batch_script(resolve_template("tiny"), o).find("segment") == std::string::npos);
  CHECK(parse_slurm_version("slurm 22.05.8\n") == 2205);
  CHECK(parse_slurm_version("slurm 24.05.1-1") == 2405);
  CHECK(parse_slurm_version("garbage") == 0);
}

TEST_CASE("plugin variant: --set env.* reaches the plugin's task environment through --mesh-env") {
  Resolved r = resolve_template("tiny", {"env.NCCL_DEBUG=INFO", "env.WANDB_PROJECT=run7"});
  std::string s = render_batch_script(r, fixed_options("tiny", true));
  CHECK(has_line(s, "#SBATCH --mesh-env=NCCL_DEBUG=INFO,WANDB_PROJECT=run7"));
  CHECK(render_batch_script(resolve_template("tiny"), fixed_options("tiny", true)).find("--mesh-env") ==
        std::string::npos);  // the template's own [env] is read by the plugin from the template
  CHECK(render_batch_script(r, fixed_options("tiny", false)).find("--mesh-env") == std::string::npos);
  CHECK_THROWS_WITH(render_batch_script(resolve_template("tiny", {"env.OMP_NUM_THREADS=4 8"}), fixed_options("tiny", true)),
                    Catch::Contains("--mesh-env cannot carry"));
}
