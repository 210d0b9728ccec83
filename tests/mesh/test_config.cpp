// Templates and layered configuration: located errors, did-you-mean, sources of values.
#include <catch2/catch.hpp>

#include <algorithm>

#include "meshrun/config.hpp"
#include "meshrun/hostlist.hpp"

using namespace meshrun;

namespace {
std::string error_of(std::string_view toml) {
  Config cfg;
  try {
    apply_toml_text(cfg, toml, "t.toml", SourceKind::template_file);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a template fills values and records where each came from", "[config]") {
  Config cfg;
  apply_toml_text(cfg, "[parallel]\ntp = 4\ndp = \"auto\"\n\n[model]\nlayers = 12\nrope_theta = 500000\n", "t.toml",
                  SourceKind::template_file);
  REQUIRE(cfg.job.parallel.tp == 4);
  REQUIRE(cfg.job.parallel.dp == 0);
  REQUIRE(cfg.job.model.layers == 12);
  REQUIRE(cfg.job.model.rope_theta == 500000.0);  // integers are accepted for numbers
  REQUIRE(cfg.origin_of("parallel.tp").str() == "template t.toml:2:6");
  REQUIRE(cfg.origin_of("model.layers").str() == "template t.toml:6:10");
  REQUIRE(cfg.origin_of("parallel.cp").str() == "default");
}

TEST_CASE("bad templates give one located line with a fix", "[config]") {
  SECTION("syntax error") {
    auto e = error_of("[parallel]\ntp = = 4\n");
    REQUIRE(e.rfind("t.toml:2:", 0) == 0);
    REQUIRE(e.find("TOML syntax error") != std::string::npos);
  }
  SECTION("unknown key with a suggestion") {
    REQUIRE(error_of("[parallel]\ntpp = 4\n") == "t.toml:2:1: unknown key 'tpp' in [parallel]; did you mean 'tp'?");
  }
  SECTION("a key in the wrong section") {
    REQUIRE(error_of("[model]\ntp = 4\n") ==
            "t.toml:2:1: unknown key 'tp' in [model]; did you mean 'parallel.tp'?");
  }
  SECTION("unknown section") {
    REQUIRE(error_of("[paralel]\ntp = 4\n") == "t.toml:1:2: unknown section [paralel]; did you mean [parallel]?");
  }
  SECTION("wrong type") {
    REQUIRE(error_of("[parallel]\ntp = \"8\"\n") ==
            "t.toml:2:6: parallel.tp must be an integer, got \"8\"; write tp = 8");
  }
  SECTION("negative size") {
    REQUIRE(error_of("[parallel]\npp = -2\n") == "t.toml:2:6: parallel.pp = -2 must be at least 1; use 1 to leave the axis unused");
  }
  SECTION("a choice that is not allowed") {
    REQUIRE(error_of("[model]\nmlp = \"swiglo\"\n") ==
            "t.toml:2:7: model.mlp = \"swiglo\" is not one of swiglu, gelu; did you mean \"swiglu\"?");
  }
  SECTION("env values are strings") {
    REQUIRE(error_of("[env]\nNCCL_DEBUG = 1\n").find("env.NCCL_DEBUG must be a string") != std::string::npos);
  }
  SECTION("nothing is changed by a failing template") {
    Config cfg;
    cfg.job.parallel.tp = 2;
    REQUIRE_THROWS_AS(apply_toml_text(cfg, "[parallel]\ntp = 8\npp = \"x\"\n", "t.toml", SourceKind::template_file),
                      ConfigError);
    REQUIRE(cfg.job.parallel.tp == 2);
  }
}

TEST_CASE("set: --set addresses a key by section and name", "[config]") {
  Config cfg;
  apply_set(cfg, "parallel.tp=4");
  apply_set(cfg, "parallel.dp=auto");
  apply_set(cfg, "model.mlp=gelu");
  apply_set(cfg, "job.name=\"x y\"");
  apply_set(cfg, "parallel.sequence_parallel=true");
  apply_set(cfg, "training.lr=1e-4");
  apply_set(cfg, "env.MY_VAR=1");
  REQUIRE(cfg.job.parallel.tp == 4);
  REQUIRE(cfg.job.parallel.dp == 0);
  REQUIRE(cfg.job.model.mlp == "gelu");
  REQUIRE(cfg.job.job.name == "x y");
  REQUIRE(cfg.job.parallel.sequence_parallel);
  REQUIRE(cfg.job.training.lr == 1e-4);
  REQUIRE(cfg.job.env.at("MY_VAR") == "1");
  REQUIRE(cfg.origin_of("parallel.tp").str() == "set --set parallel.tp=4");
  SECTION("unknown key") {
    REQUIRE_THROWS_WITH(apply_set(cfg, "parallel.tpp=4"),
                        "--set parallel.tpp=4: unknown key 'parallel.tpp'; did you mean 'parallel.tp'?");
  }
  SECTION("wrong type") {
    REQUIRE_THROWS_WITH(apply_set(cfg, "parallel.tp=eight"),
                        "--set parallel.tp=eight: parallel.tp must be an integer, got \"eight\"; write tp = 8");
  }
  SECTION("missing =") {
    REQUIRE_THROWS_WITH(apply_set(cfg, "parallel.tp"), Catch::Contains("expected section.key=value"));
  }
}

TEST_CASE("layers stack: defaults < site < template < flags < --set", "[config]") {
  // build_config reads files; use the in-memory layers directly in the same order.
  Config cfg;
  apply_toml_text(cfg, "[parallel]\ntp = 2\npp = 2\ncp = 2\n", "site.toml", SourceKind::site);
  apply_toml_text(cfg, "[parallel]\ntp = 4\npp = 4\n", "t.toml", SourceKind::template_file);
  apply_value(cfg, "parallel.tp", "8", Origin{SourceKind::flag, "--mesh-tp=8"});
  apply_set(cfg, "parallel.pp=8");
  REQUIRE(cfg.job.parallel.cp == 2);
  REQUIRE(cfg.origin_of("parallel.cp").kind == SourceKind::site);
  REQUIRE(cfg.job.parallel.tp == 8);
  REQUIRE(cfg.origin_of("parallel.tp").kind == SourceKind::flag);
  REQUIRE(cfg.job.parallel.pp == 8);
  REQUIRE(cfg.origin_of("parallel.pp").kind == SourceKind::set);
}

TEST_CASE("hostlists expand like Slurm's", "[hostlist]") {
  std::string err;
  using V = std::vector<std::string>;
  REQUIRE(*expand_hostlist("node[001-003,7]", &err) == V{"node001", "node002", "node003", "node7"});
  REQUIRE(*expand_hostlist("a1,b[8-10]", &err) == V{"a1", "b8", "b9", "b10"});
  REQUIRE(*expand_hostlist("r[1-2]-n[01-02]", &err) == V{"r1-n01", "r1-n02", "r2-n01", "r2-n02"});
  REQUIRE(expand_hostlist("node[001-128]", &err)->size() == 128);
  REQUIRE(expand_hostlist("node[001-128]", &err)->back() == "node128");
  REQUIRE_FALSE(expand_hostlist("node[1-", &err));
  REQUIRE(err.find("unclosed '['") != std::string::npos);
  REQUIRE_FALSE(expand_hostlist("node[5-2]", &err));
  REQUIRE(err.find("runs backwards") != std::string::npos);
  REQUIRE_FALSE(expand_hostlist("node[a-b]", &err));
  REQUIRE_FALSE(expand_hostlist("node[1-99999999]", &err));
  REQUIRE_FALSE(expand_hostlist("", &err));
}

#include "meshrun/site_policy.hpp"

TEST_CASE("site policy comes only from the site file", "[config][site]") {
  Config plain;
  REQUIRE(plain.job.site.hca_scope == "node");  // one NCCL_IB_HCA per node unless the site chooses rank
  REQUIRE(env_inputs(plain).policy.hca_scope == EnvPolicy::HcaScope::node);
  Config ranked;
  apply_toml_text(ranked, "[site]\nhca_scope = \"rank\"\n", "site.toml", SourceKind::site);
  REQUIRE(env_inputs(ranked).policy.hca_scope == EnvPolicy::HcaScope::rank);
  Config cfg;
  apply_toml_text(cfg,
                  "[site]\nnccl = \"off\"\nallow_env = \"MY_*, WANDB_PROJECT\"\nhca_scope = \"node\"\n"
                  "[env]\nLD_LIBRARY_PATH = \"/opt/site/lib\"\n",
                  "site.toml", SourceKind::site);
  apply_toml_text(cfg, "[env]\nMY_FLAG = \"1\"\n", "t.toml", SourceKind::template_file);
  EnvInputs in = env_inputs(cfg);
  REQUIRE(in.policy.nccl == EnvPolicy::Nccl::off);
  REQUIRE(in.policy.hca_scope == EnvPolicy::HcaScope::node);
  REQUIRE(in.policy.allow == std::vector<std::string>{"MY_*", "WANDB_PROJECT"});
  REQUIRE(in.policy.site_env.at("LD_LIBRARY_PATH") == "/opt/site/lib");  // the site's own, trusted
  REQUIRE(in.user_env == std::map<std::string, std::string>{{"MY_FLAG", "1"}});
  SECTION("a template cannot set [site]") {
    REQUIRE_THROWS_WITH(apply_toml_text(cfg, "[site]\nallow_env = \"LD_*\"\n", "t.toml", SourceKind::template_file),
                        Catch::StartsWith("t.toml:1:2: [site] policy can only be set in the site file"));
  }
  SECTION("nor can --set") {
    REQUIRE_THROWS_WITH(apply_set(cfg, "site.nccl=auto"), Catch::Contains("can only be set in the site file"));
  }
}

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "meshrun/bounded_file.hpp"

TEST_CASE("files from user input: regular files only, limits by kind, long values cut", "[config][files]") {
  std::string text, err;
  CHECK_FALSE(read_bounded_file("/dev/zero", kTemplateFileLimit, "template", &text, &err));
  CHECK(err == "/dev/zero: the template is a character device, not a regular file; give the path of a file");
  CHECK(text.empty());
  const std::string dir = (std::filesystem::temp_directory_path() / ("meshrun-files-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/t.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_FALSE(read_bounded_file(fifo, kTemplateFileLimit, "template", &text, &err));  // returns, never blocks
  CHECK_THAT(err, Catch::Contains("is a FIFO, not a regular file"));
  CHECK_FALSE(read_bounded_file(dir, kTemplateFileLimit, "site file", &text, &err));
  CHECK_THAT(err, Catch::Contains("the site file is a directory"));
  const std::string big = dir + "/big.toml";
  {
    std::FILE* f = std::fopen(big.c_str(), "w");
    REQUIRE(f);
    std::string chunk(1 << 20, '#');
    std::fwrite(chunk.data(), 1, chunk.size(), f);
    std::fputc('\n', f);  // 1 MiB + 1 byte
    std::fclose(f);
  }
  CHECK_FALSE(read_bounded_file(big, kTemplateFileLimit, "template", &text, &err));
  CHECK_THAT(err, Catch::Contains("larger than 1 MiB"));
  REQUIRE(read_bounded_file(big, kTopologyXmlLimit, "topology XML", &text, &err));  // 64 MiB for XML
  CHECK(text.size() == (1u << 20) + 1);
  CHECK(check_regular_file(big, "token file", &err));
  CHECK_FALSE(check_regular_file(fifo, "token file", &err));
  Config cfg;
  CHECK_THROWS_WITH(apply_toml_file(cfg, fifo, SourceKind::template_file), Catch::Contains("FIFO"));
  std::filesystem::remove_all(dir);

  const std::string huge(10000, 'x');
  CHECK(cut_value(huge) == std::string(60, 'x') + "…");
  CHECK(cut_value("short") == "short");
  const std::string cut = cut_long_values("--mesh-tp='" + huge + "' is not a valid size");
  CHECK(cut == "--mesh-tp='" + std::string(60, 'x') + "…' is not a valid size");
  const std::string path = "/a/" + std::string(100, 'p') + "/missing.toml";  // paths keep up to 200
  CHECK(cut_long_values(path + ": no such file") == path + ": no such file");
  CHECK_THROWS_WITH(apply_set(cfg, "parallel.tp=" + huge), !Catch::Contains(std::string(61, 'x')));
}

TEST_CASE("cut_value makes untrusted text printable: control bytes and invalid UTF-8 escaped, UTF-8 kept", "[config]") {
  using namespace std::string_literals;
  CHECK(cut_value("a\nb") == "a\\nb");
  CHECK(cut_value("\r\t") == "\\r\\t");
  CHECK(cut_value("x\x1b[31mred\x07") == "x\\x1b[31mred\\x07");
  CHECK(cut_value("nul\0end"s) == "nul\\x00end");
  CHECK(cut_value("del\x7f") == "del\\x7f");
  CHECK(cut_value("café … ✓ 𝄞") == "café … ✓ 𝄞");  // 2-, 3- and 4-byte UTF-8 kept
  CHECK(cut_value("a\xff" "b") == "a\\xffb");                  // not UTF-8 at all
  CHECK(cut_value("\x80") == "\\x80");                         // a stray continuation byte
  CHECK(cut_value("\xc0\x80") == "\\xc0\\x80");                // overlong NUL
  CHECK(cut_value("\xe0\x80\xaf") == "\\xe0\\x80\\xaf");       // overlong '/'
  CHECK(cut_value("\xed\xa0\x80") == "\\xed\\xa0\\x80");       // a UTF-16 surrogate
  CHECK(cut_value("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  CHECK(cut_value("\xe2\x80") == "\\xe2\\x80");                // truncated "…"
  CHECK(cut_value("\xc2\x9b" "2J") == "\\u009b2J");            // C1 CSI encoded as UTF-8
  CHECK(cut_value("abc\xe2\x80\xae" "cba") == "abc\\u202ecba");  // right-to-left override
  CHECK(cut_value("back\\slash") == "back\\slash");             // a backslash is kept as is
  // Cutting counts the escaped form and never splits an escape or a character.
  CHECK(cut_value(std::string(58, 'x') + "\x1b", 60) == std::string(58, 'x') + "…");
  CHECK(cut_value(std::string(59, 'x') + "é", 60) == std::string(59, 'x') + "…");
  CHECK(cut_value(std::string(100, '\x1b')).size() == 15 * 4 + std::string("…").size());
  // Over a whole message: one line, each value escaped, and a second pass changes nothing.
  const std::string msg = "order 'tp\ndp\x1b[2J' in " + std::string(100, 'y') + "\xff: bad";
  const std::string once = cut_long_values(msg);
  CHECK(once == "order 'tp\\ndp\\x1b[2J' in " + std::string(60, 'y') + "…: bad");
  CHECK(once.find('\n') == std::string::npos);
  CHECK(cut_long_values(once) == once);
  CHECK(cut_long_values("line one\nline two") == "line one\\nline two");
  // Many short values of bytes that are not UTF-8 (each escaped to 4 bytes; the fuzzer's regress-long-escaped-set):
  // the whole line is cut at 1536 bytes, on an escape boundary, and stays the same on a second pass.
  std::string many;
  for (int i = 0; i < 300; ++i) many += "k\xef\xef\xef ";
  const std::string capped = cut_long_values(many);
  CHECK(capped.size() <= 1536);
  CHECK(capped.size() >= 1500);
  CHECK(capped.substr(capped.size() - 3) == "…");
  const std::string kept = capped.substr(0, capped.size() - 3);
  CHECK(kept.size() - kept.rfind('\\') >= 4);  // the last escape is whole
  CHECK(cut_long_values(capped) == capped);
  CHECK(cut_long_values(std::string(1000, 'a') + " short") == std::string(60, 'a') + "… short");  // a run is still cut first
}

TEST_CASE("typed values: an option parsed to an integer is stored without a text round trip", "[config]") {
  Config cfg;
  apply_int(cfg, "parallel.tp", 4, Origin{SourceKind::flag, "--mesh-tp=4"});
  CHECK(cfg.job.parallel.tp == 4);
  CHECK(cfg.origin_of("parallel.tp").str() == Origin{SourceKind::flag, "--mesh-tp=4"}.str());
  CHECK_THROWS_AS(apply_int(cfg, "parallel.nope", 1, Origin{SourceKind::flag, "--x=1"}), ConfigError);
  CHECK_THROWS_AS(apply_int(cfg, "model.mlp", 1, Origin{SourceKind::flag, "--x=1"}), ConfigError);  // a string key
  CHECK_THROWS_AS(apply_int(cfg, "site.port_base", 1, Origin{SourceKind::flag, "--x=1"}), ConfigError);
}

TEST_CASE("data.blend and data.valid: [[weight, path], ...] arrays or a path, located errors", "[config][data]") {
  Config cfg;
  apply_toml_text(cfg, "[data]\nblend = [[0.7, \"web\"], [3, \"code\"]]\nvalid = \"held-out\"\n", "t.toml",
                  SourceKind::template_file);
  REQUIRE(cfg.job.data.blend == std::vector<BlendEntry>{{0.7, "web"}, {3.0, "code"}});
  REQUIRE(cfg.job.data.valid == std::vector<BlendEntry>{{1.0, "held-out"}});
  REQUIRE(cfg.origin_of("data.blend").str() == "template t.toml:2:9");
  // The text form reads back through --set (what the dry run and the launcher show).
  REQUIRE(value_text(cfg.job, "data.blend") == "[[0.7, \"web\"], [3, \"code\"]]");
  Config back;
  apply_set(back, "data.blend=" + value_text(cfg.job, "data.blend"));
  REQUIRE(back.job.data.blend == cfg.job.data.blend);
  apply_set(back, "data.valid=[[1, \"a\"], [2, \"b\"]]");
  REQUIRE(back.job.data.valid.size() == 2);
  apply_set(back, "data.valid=");
  REQUIRE(back.job.data.valid.empty());
  apply_set(back, "training.eval_interval=5");
  REQUIRE(back.job.training.eval_interval == 5);
  // Not a pair, a weight that is not a number: the element's location.
  auto e = error_of("[data]\nblend = [[0.5, \"a\"],\n  [\"b\", 0.5]]\n");
  REQUIRE(e.rfind("t.toml:3:3: data.blend: element 1 is not a [weight, path] pair", 0) == 0);
  REQUIRE(error_of("[data]\nblend = [[0.5]]\n").find("element 0 is not a [weight, path] pair") != std::string::npos);
  REQUIRE(error_of("[data]\nblend = 3\n").find("data.blend must be a path or an array of [weight, path] pairs") !=
          std::string::npos);
  REQUIRE_THROWS_WITH(apply_set(back, "data.blend=[[0.5, \"a\"]"),
                      Catch::StartsWith("--set data.blend=[[0.5, \"a\"]: data.blend = [[0.5, \"a\"]: "));
  REQUIRE(error_of("[training]\neval_batches = 0\n").find("training.eval_batches = 0 must be at least 1") != std::string::npos);
}

// Issue 47 item 7: every problem of a template, one located line each, in the file's order; nothing applied.
TEST_CASE("config: every unknown key of a template is reported, one line each") {
  Config cfg;
  std::string msg;
  try {
    apply_toml_text(cfg, "[model]\nlayer = 4\n[training]\nstep = 60\nlearning_rate = 1e-3\n[parallel]\ntp = 2\n", "t.toml",
                    SourceKind::template_file);
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  REQUIRE(msg ==
          "t.toml:2:1: unknown key 'layer' in [model]; did you mean 'layers'?\n"
          "t.toml:4:1: unknown key 'step' in [training]; did you mean 'steps'?\n"
          "t.toml:5:1: unknown key 'learning_rate' in [training]; did you mean 'lr'?");
  REQUIRE(cfg.files.empty());  // the file with problems is not applied (tp = 2 is not stored)
  REQUIRE(cfg.job.parallel.tp != 2);
  // Each line is escaped on its own: a key with a newline stays on its line.
  REQUIRE(error_of("[model]\n\"a\\nb\" = 1\nlayer = 2\n") ==
          "t.toml:2:1: unknown key 'a\\nb' in [model]; valid keys: " + error_of("[model]\nzzzzzzzzzz = 1\n").substr(
              error_of("[model]\nzzzzzzzzzz = 1\n").find("valid keys: ") + 12) + "\n"
          "t.toml:3:1: unknown key 'layer' in [model]; did you mean 'layers'?");
  // At most 8 problems, then a count: a file of garbage gives a bounded message.
  std::string many = "[model]\n";
  for (int i = 0; i < 12; ++i) many += "zz" + std::to_string(i) + "zz = 1\n";
  const std::string m = error_of(many);
  REQUIRE(std::count(m.begin(), m.end(), '\n') == 8);
  REQUIRE(m.find("t.toml:9:1: unknown key 'zz7zz'") != std::string::npos);
  REQUIRE(m.find("zz8zz") == std::string::npos);
  REQUIRE(m.substr(m.rfind('\n') + 1) == "t.toml: 4 more problems not shown; fix the ones above first");
}

// Issue 47 item 9: an unknown --set key gets a template key's suggestions.
TEST_CASE("config: --set keys get did-you-mean as template keys do") {
  auto set_error = [](const std::string& a) {
    Config cfg;
    try {
      apply_set(cfg, a);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  REQUIRE(set_error("training.learning_rate=1e-3") ==
          "--set training.learning_rate=1e-3: unknown key 'training.learning_rate'; did you mean 'training.lr'?");
  REQUIRE(set_error("model.tp=2") == "--set model.tp=2: unknown key 'model.tp'; did you mean 'parallel.tp'?");
  REQUIRE(set_error("parallel.tpp=2") == "--set parallel.tpp=2: unknown key 'parallel.tpp'; did you mean 'parallel.tp'?");
  REQUIRE(set_error("training.zzzzzz=1").find("unknown key 'training.zzzzzz'; valid keys: seq_len, ") != std::string::npos);
  REQUIRE(set_error("traning.steps=4") == "--set traning.steps=4: unknown key 'traning.steps'; did you mean 'training.steps'?");
}
