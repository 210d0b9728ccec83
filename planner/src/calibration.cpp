// Calibration files, measured runs and the fit of the cost model's constants to them (docs/planner.md,
// "Calibration").
#include "meshrun/planner_calibration.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <limits>
#include <sstream>

#include "cost.hpp"
#include "meshrun/config.hpp"
#include "meshrun/planner.hpp"

namespace meshrun::planner {

namespace {

struct ConstantRef {
  const char* name;
  double CostConstants::*member;
};
constexpr ConstantRef kConstants[] = {
    {"matmul_efficiency", &CostConstants::matmul_efficiency},
    {"attention_efficiency", &CostConstants::attention_efficiency},
    {"gemm_half_size", &CostConstants::gemm_half_size},
    {"gemm_tile_rows", &CostConstants::gemm_tile_rows},
    {"gemm_tile_cols", &CostConstants::gemm_tile_cols},
    {"network_efficiency", &CostConstants::network_efficiency},
    {"overlap_cost", &CostConstants::overlap_cost},
    {"collective_base_latency_s", &CostConstants::collective_base_latency_s},
    {"hop_latency_nvlink_s", &CostConstants::hop_latency_nvlink_s},
    {"hop_latency_pcie_s", &CostConstants::hop_latency_pcie_s},
    {"hop_latency_network_s", &CostConstants::hop_latency_network_s},
    {"reserve_gib", &CostConstants::reserve_gib},
    {"memory_efficiency", &CostConstants::memory_efficiency},
    {"shared_core_latency_s", &CostConstants::shared_core_latency_s},
    {"layer_overhead_s", &CostConstants::layer_overhead_s},
    {"attention_score_s", &CostConstants::attention_score_s},
    {"routing_assignment_s", &CostConstants::routing_assignment_s},
    {"host_bytes_per_param", &CostConstants::host_bytes_per_param},
};

std::string where(const std::string& path, const toml::source_region& src) {
  return path + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const std::vector<std::string>& cost_constant_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const ConstantRef& c : kConstants) v.emplace_back(c.name);
    return v;
  }();
  return names;
}

double* cost_constant(CostConstants& c, const std::string& name) {
  for (const ConstantRef& k : kConstants)
    if (name == k.name) return &(c.*k.member);
  return nullptr;
}

Calibration load_calibration(const std::string& path) {
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    if (what.find("File could not be opened") != std::string::npos)
      throw ConfigError("planner.calibration: cannot read " + path +
                        "; write one with `meshrun plan --calibrate RUN.jsonl ... -o FILE` or meshrun-bench-device");
    throw ConfigError(where(path, e.source()) + ": " + what + " (a calibration file is TOML with one [planner] table)");
  }
  Calibration c;
  c.path = path;
  for (auto&& [k, node] : doc) {
    if (k.str() != "planner")
      throw ConfigError(where(path, k.source()) + ": unknown table [" + std::string(k.str()) +
                        "]; a calibration file has one [planner] table");
  }
  const toml::table* t = doc["planner"].as_table();
  if (!t) throw ConfigError(path + ": no [planner] table; a calibration file has one, with device = \"cpu\" or a GPU key");
  const std::vector<std::string> figures = {"device",     "node_cpus",           "gflops_per_cpu", "gflops_per_cpu_fp64",
                                            "memory_gbps_per_cpu", "link_gbps", "collective_gbps", "memory_gib",
                                            "fitted_runs"};
  for (auto&& [k, node] : *t) {
    const std::string key(k.str());
    const std::string at = where(path, k.source());
    if (key == "device") {
      if (!node.is_string()) throw ConfigError(at + ": planner.device must be a string: \"cpu\" or a GPU catalogue key");
      c.device = *node.value<std::string>();
      if (c.device != "cpu" && !find_gpu(c.device))
        throw ConfigError(at + ": planner.device = \"" + c.device + "\" is neither \"cpu\" nor a GPU the planner knows");
      continue;
    }
    const std::optional<double> v = node.value<double>();
    if (!v || !std::isfinite(*v) || *v < 0)
      throw ConfigError(at + ": planner." + key + " must be a finite number >= 0");
    if (key == "node_cpus" || key == "fitted_runs") {
      if (*v != std::floor(*v) || *v > 1e6) throw ConfigError(at + ": planner." + key + " must be a whole number");
      (key == "node_cpus" ? c.node_cpus : c.fitted_runs) = static_cast<int>(*v);
    } else if (key == "gflops_per_cpu") c.gflops_per_cpu = *v;
    else if (key == "gflops_per_cpu_fp64") c.gflops_per_cpu_fp64 = *v;
    else if (key == "memory_gbps_per_cpu") c.memory_gbps_per_cpu = *v;
    else if (key == "link_gbps") c.link_gbps = *v;
    else if (key == "collective_gbps") c.collective_gbps = *v;
    else if (key == "memory_gib") c.memory_gib = *v;
    else {
      CostConstants probe;
      if (!cost_constant(probe, key))
        throw ConfigError(at + ": unknown key planner." + key + "; keys are " + join(figures) + " and the constants " +
                          join(cost_constant_names()));
      c.constants.emplace_back(key, *v);
    }
  }
  if (c.device.empty()) throw ConfigError(path + ": [planner] has no device; add device = \"cpu\" or a GPU catalogue key");
  if (c.device == "cpu" && (c.gflops_per_cpu <= 0 || c.memory_gbps_per_cpu <= 0 || c.link_gbps <= 0 || c.node_cpus <= 0))
    throw ConfigError(path + ": a CPU calibration needs node_cpus, gflops_per_cpu, memory_gbps_per_cpu and link_gbps "
                      "(> 0); measure them with `mpirun -np 2 meshrun-bench-device > " + path + "`");
  return c;
}

std::string calibration_toml(const Calibration& c, const std::string& header_comment) {
  std::ostringstream o;
  o.precision(6);
  std::istringstream lines(header_comment);
  for (std::string line; std::getline(lines, line);) o << "# " << line << "\n";
  o << "[planner]\ndevice = \"" << c.device << "\"\n";
  if (c.node_cpus > 0) o << "node_cpus = " << c.node_cpus << "\n";
  auto num = [&](const char* k, double v) {
    if (v > 0) o << k << " = " << v << "\n";
  };
  num("gflops_per_cpu", c.gflops_per_cpu);
  num("gflops_per_cpu_fp64", c.gflops_per_cpu_fp64);
  num("memory_gbps_per_cpu", c.memory_gbps_per_cpu);
  num("link_gbps", c.link_gbps);
  num("collective_gbps", c.collective_gbps);
  num("memory_gib", c.memory_gib);
  for (const auto& [k, v] : c.constants) o << k << " = " << v << "\n";
  if (c.fitted_runs > 0) o << "fitted_runs = " << c.fitted_runs << "\n";
  return o.str();
}

CostConstants calibrated_constants(const CostConstants& base, const Calibration& c) {
  CostConstants k = base;
  for (const auto& [name, v] : c.constants) *cost_constant(k, name) = v;
  return k;
}

namespace detail {

// meshrun-train's CPU backend before any fit: the measured GEMM rate is the matmul peak, MPI moves data at
// the measured rate, nothing hides communication (MPI progresses inside its calls), no GPU reserve.
CostConstants cpu_constants() {
  CostConstants c;
  c.matmul_efficiency = 1.0;
  c.attention_efficiency = 0.5;
  c.gemm_half_size = 32;
  c.gemm_tile_rows = c.gemm_tile_cols = 0;  // no SMs: no wave quantization
  c.network_efficiency = 1.0;
  c.overlap_cost = 1.0;
  c.collective_base_latency_s = 20e-6;
  c.hop_latency_nvlink_s = c.hop_latency_pcie_s = 5e-6;
  c.hop_latency_network_s = 20e-6;
  c.reserve_gib = 0;
  c.memory_efficiency = 1.0;
  c.shared_core_latency_s = 1e-3;
  c.layer_overhead_s = 1e-4;
  c.attention_score_s = 5e-9;
  c.routing_assignment_s = 2e-7;
  c.host_bytes_per_param = 8;
  return c;
}

void apply_calibration(const JobConfig& cfg, int ranks_per_node, const Calibration& cal, Hardware* hw) {
  if (!gpu_run(cfg)) {
    if (cal.empty()) return;  // resolve() refused already: no GPU and no calibration
    if (cal.device != "cpu")
      throw ConfigError(cal.path + " calibrates " + cal.device + ", and this run is meshrun-train on CPU (node type '" +
                        cfg.cluster.node_type + "'); use a CPU calibration or set cluster.gpu");
    // One rank per CPU computes at the measured rate; more ranks than CPUs take turns (Hardware::core_share).
    const double gflops = cfg.training.dtype == "fp64" && cal.gflops_per_cpu_fp64 > 0 ? cal.gflops_per_cpu_fp64
                                                                                        : cal.gflops_per_cpu;
    Hardware h;
    h.gpu = "cpu";
    h.generation = "cpu";
    h.constants = calibrated_constants(cpu_constants(), cal);
    h.bf16_tflops = gflops / 1000.0;
    h.core_share = std::max(1.0, double(ranks_per_node) / cal.node_cpus);
    h.sms = 0;
    h.memory_gib = cal.memory_gib > 0 ? cal.memory_gib / std::max(1, ranks_per_node) : 1e6;
    h.hbm_tbps = cal.memory_gbps_per_cpu / 1000.0;
    h.nvlink_gbps = 0;
    h.pcie_gbps = cal.link_gbps;  // ranks of a node talk through MPI's shared memory
    h.nic_gbit = cal.link_gbps * 8;
    h.nics_per_node = std::max(1, ranks_per_node);
    h.nic_gbps_per_gpu = cal.link_gbps;
    // MPI's collectives reduce on the CPUs and copy through shared memory: slower than a point-to-point
    h.collective_link_ratio = cal.collective_gbps > 0 ? cal.collective_gbps / cal.link_gbps : 1.0;
    h.gpus_per_node = ranks_per_node;
    h.nvlink_domain_gpus = 1;
    h.calibration = cal.path;
    *hw = h;
    return;
  }
  if (cal.empty()) return;
  if (cal.device != hw->gpu)
    throw ConfigError(cal.path + " calibrates " + cal.device + ", and this run plans " + hw->gpu +
                      "; use that GPU's calibration (or none)");
  hw->constants = calibrated_constants(hw->constants, cal);
  hw->calibration = cal.path;
}

}  // namespace detail

// ---- measured runs ----

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

MeasuredRun read_measured_run(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--calibrate: cannot read " + path + "; give meshrun-train's metrics files (--metrics FILE)");
  using nlohmann::json;
  json run;
  std::vector<json> steps;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (line.size() > (1u << 20))
      throw ConfigError(path + ":" + std::to_string(line_no) + ": a line over 1 MiB; this is not a meshrun-train metrics file");
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("record"))
      throw ConfigError(path + ":" + std::to_string(line_no) +
                        ": not a metrics record (JSON object with \"record\"); give meshrun-train's --metrics file");
    if (j["record"] == "run") run = j, steps.clear();  // a resumed run: the last run's steps
    else if (j["record"] == "step") steps.push_back(std::move(j));
  }
  if (run.is_null()) throw ConfigError(path + ": no run record; give a metrics file meshrun-train wrote");
  MeasuredRun m;
  m.path = path;
  try {
    if (!run.contains("micro_batch_size") || !run.contains("host"))
      throw ConfigError(path + ": the run record has no micro_batch_size or host (written before meshrun-train "
                        "recorded them); measure the run again with this meshrun-train");
    JobConfig& c = m.cfg;
    const json& mo = run.at("model");
    c.model.name = mo.at("name");
    c.model.layers = mo.at("layers");
    c.model.hidden = mo.at("hidden");
    c.model.ffn_hidden = mo.at("ffn_hidden");
    c.model.heads = mo.at("heads");
    c.model.kv_heads = mo.at("kv_heads");
    c.model.vocab = mo.at("vocab");
    c.model.mlp = mo.at("mlp");
    c.model.tied_embeddings = mo.at("tied_embeddings");
    c.model.experts = mo.at("experts");
    c.model.top_k = mo.at("top_k");
    c.model.moe_ffn_hidden = mo.at("moe_ffn_hidden");
    const json& l = run.at("layout");
    c.parallel.tp = l.at("tp");
    c.parallel.cp = l.at("cp");
    c.parallel.pp = l.at("pp");
    c.parallel.dp = l.at("dp");
    c.parallel.ep = l.at("ep");
    c.parallel.zero_stage = l.at("zero");
    c.parallel.sequence_parallel = l.at("sp");
    c.parallel.order = l.at("order");
    c.parallel.pipeline_schedule = l.at("schedule");
    c.parallel.virtual_stages = l.at("virtual_stages");
    c.parallel.cp_comm = l.value("cp_comm", "ring");
    c.training.device = run.at("device");
    c.training.dtype = run.at("dtype");
    c.training.param_dtype = run.at("param_dtype");
    c.training.grad_dtype = run.at("grad_dtype");
    c.training.optim_dtype = run.at("optim_dtype");
    c.training.seq_len = run.at("seq_len");
    c.training.global_batch_size = run.at("global_batch_size");
    c.training.micro_batch_size = run.at("micro_batch_size");
    const json& h = run.at("host");
    c.cluster.nodes = h.at("nodes");
    c.cluster.gpus_per_node = h.at("ranks_per_node");
    c.cluster.node_type = "generic";
  } catch (const json::exception& e) {
    throw ConfigError(path + ": the run record lacks a field or has the wrong type (" + std::string(e.what()) +
                      "); give a metrics file meshrun-train wrote");
  }
  // The first step pays for first touches and warm-up: medians over the rest.
  if (steps.size() < 3)
    throw ConfigError(path + ": " + std::to_string(steps.size()) + " step record(s); calibration needs at least 3 (the "
                      "first is left out); run more steps");
  std::vector<double> ms, mm, at, el, opt, outside, imbalance;
  bool kernels = true;
  for (std::size_t i = 1; i < steps.size(); ++i) {
    const json& s = steps[i];
    if (!s.contains("ms_per_step") || !s["ms_per_step"].is_number())
      throw ConfigError(path + ": a step record without ms_per_step; give a metrics file meshrun-train wrote");
    ms.push_back(s["ms_per_step"]);
    // MoE: the measured routing imbalance is the planner's input (planner.expert_imbalance).
    if (s.contains("expert_rank_imbalance") && s["expert_rank_imbalance"].is_number() &&
        s["expert_rank_imbalance"].get<double>() > 0)
      imbalance.push_back(s["expert_rank_imbalance"].get<double>());
    if (!s.contains("kernel_ms") || !s["kernel_ms"].is_object()) {
      kernels = false;
      continue;
    }
    const json& k = s["kernel_ms"];
    auto sum = [&](std::initializer_list<const char*> kinds) {
      double t = 0;
      for (const char* kind : kinds) t += k.value(kind, 0.0);
      return t;
    };
    mm.push_back(sum({"linear_forward", "linear_backward_input", "linear_backward_weight"}));
    at.push_back(sum({"attention_forward", "attention_backward"}));
    el.push_back(sum({"rmsnorm", "rope", "swiglu", "elementwise", "embedding", "gather_rows", "moe", "cross_entropy"}));
    opt.push_back(sum({"adamw", "sum_squares"}));
    outside.push_back(ms.back() - mm.back() - at.back() - el.back() - opt.back());
  }
  m.steps = static_cast<int>(ms.size());
  if (!imbalance.empty()) m.cfg.planner.expert_imbalance = std::max(1.0, median(imbalance));
  m.step_ms = median(ms);
  m.step_ms_spread = (*std::max_element(ms.begin(), ms.end()) - *std::min_element(ms.begin(), ms.end())) / m.step_ms;
  if (kernels) {
    m.matmul_ms = median(mm);
    m.attention_ms = median(at);
    m.elementwise_ms = median(el);
    m.optimizer_ms = median(opt);
    m.outside_kernels_ms = median(outside);
  }
  return m;
}

// ---- the fit ----

namespace {

struct Param {
  std::string name;
  double lo, hi;  // bounds of the constant itself (> 0: fitted in log space)
};

// What --calibrate fits per device kind: the efficiencies and latencies a measured run pins down. The tile
// sizes, hop latencies of links the runs cannot tell apart and the memory reserve stay as they are.
std::vector<Param> fitted_params(bool cpu) {
  if (cpu)
    return {{"matmul_efficiency", 0.02, 2.0},        {"gemm_half_size", 1.0, 4096.0},
            {"attention_efficiency", 0.005, 2.0},    {"memory_efficiency", 0.01, 4.0},
            {"network_efficiency", 0.01, 4.0},       {"collective_base_latency_s", 1e-7, 0.05},
            {"hop_latency_pcie_s", 1e-8, 0.05},      {"shared_core_latency_s", 1e-6, 0.1},
            {"layer_overhead_s", 1e-7, 0.1},         {"attention_score_s", 1e-12, 1e-6},
            {"routing_assignment_s", 1e-10, 1e-4},  {"host_bytes_per_param", 0.01, 1000.0}};
  return {{"matmul_efficiency", 0.2, 1.0}, {"attention_efficiency", 0.1, 1.0}, {"network_efficiency", 0.2, 1.0},
          {"overlap_cost", 0.01, 1.0}};
}

struct Observation {
  std::size_t run;
  int what;  // 0 step, 1 matmul, 2 attention, 3 elementwise, 4 optimizer, 5 outside the kernels
  double measured_s;
};

}  // namespace

CalibrationFit calibrate(const std::vector<MeasuredRun>& runs, const Calibration& base) {
  if (runs.empty()) throw ConfigError("--calibrate needs at least one metrics file");
  const bool cpu = base.device == "cpu";
  if (!cpu && !find_gpu(base.device))
    throw ConfigError("calibration device '" + base.device + "' is neither \"cpu\" nor a GPU the planner knows");
  for (const MeasuredRun& r : runs) {
    const bool run_cpu = !detail::gpu_run(r.cfg);
    if (run_cpu != cpu)
      throw ConfigError(r.path + " is a " + (run_cpu ? std::string("CPU") : r.cfg.training.device) + " run and " +
                        base.path + " calibrates " + base.device + "; calibrate runs of one device type together");
  }
  for (const MeasuredRun& r : runs) {
    try {
      (void)estimate(r.cfg, base);
    } catch (const ConfigError& e) {
      throw ConfigError(r.path + ": the planner cannot estimate this run: " + e.what());
    }
  }
  std::vector<Observation> obs;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const MeasuredRun& r = runs[i];
    obs.push_back({i, 0, r.step_ms / 1000});
    const double parts[] = {r.matmul_ms, r.attention_ms, r.elementwise_ms, r.optimizer_ms};
    for (int k = 0; k < 4; ++k)
      if (parts[k] > 0) obs.push_back({i, k + 1, parts[k] / 1000});
    // Communication, waits, the bubble and host work, as measured: without them the constants of the links and
    // the host would be fitted to whatever the kernel constants leave over in the step.
    if (r.outside_kernels_ms > 0) obs.push_back({i, 5, r.outside_kernels_ms / 1000});
  }
  const std::vector<Param> params = fitted_params(cpu);
  Calibration cal = base;
  // The starting point: the base file's constants over the device's defaults.
  const CostConstants start = cpu ? calibrated_constants(detail::cpu_constants(), base)
                                  : calibrated_constants(cost_constants(find_gpu(base.device)->generation), base);
  CostConstants k0 = start;
  std::vector<double> u(params.size());
  for (std::size_t p = 0; p < params.size(); ++p)
    u[p] = std::log(std::clamp(*cost_constant(k0, params[p].name), params[p].lo, params[p].hi));

  auto with = [&](const std::vector<double>& uu) {
    Calibration c = base;
    c.constants.clear();
    CostConstants k = start;
    for (std::size_t p = 0; p < params.size(); ++p) *cost_constant(k, params[p].name) = std::exp(uu[p]);
    for (const std::string& n : cost_constant_names()) c.constants.emplace_back(n, *cost_constant(k, n));
    return c;
  };
  auto predict = [&](const Calibration& c, std::vector<double>* steps, std::vector<double>* raw = nullptr) {
    std::vector<double> res(obs.size());
    std::vector<Estimate> est;
    for (const MeasuredRun& r : runs) est.push_back(estimate(r.cfg, c));
    if (steps) {
      steps->clear();
      for (const Estimate& e : est) steps->push_back(e.step_time_s * 1000);
    }
    for (std::size_t o = 0; o < obs.size(); ++o) {
      const Estimate& e = est[obs[o].run];
      const ComputeParts& k = e.time.compute_parts;
      const double pred[] = {e.step_time_s, k.matmul, k.attention, k.elementwise, e.time.optimizer,
                             e.step_time_s - k.matmul - k.attention - k.elementwise - e.time.optimizer};
      // The step is what the estimate is for: its residual weighs 5× a kernel group's, which only steers
      // how the step's time is split between the constants.
      res[o] = (obs[o].what == 0 ? 5.0 : 1.0) * std::log(std::max(pred[obs[o].what], 1e-12) / obs[o].measured_s);
      if (raw) raw->push_back(pred[obs[o].what] / obs[o].measured_s - 1);
    }
    return res;
  };
  auto cost = [](const std::vector<double>& r) {
    double s = 0;
    for (double x : r) s += x * x;
    return s;
  };

  CalibrationFit fit;
  predict(base, &fit.before_ms);  // "before": the base file as it stands
  std::vector<double> r = predict(with(u), nullptr);
  // Levenberg–Marquardt in log space, steps projected onto the bounds.
  double lambda = 1e-2, c0 = cost(r);
  const std::size_t n = params.size();
  for (int iter = 0; iter < 80 && c0 > 1e-14; ++iter) {
    std::vector<std::vector<double>> J(obs.size(), std::vector<double>(n));
    for (std::size_t p = 0; p < n; ++p) {
      std::vector<double> up = u;
      const double h = 1e-4;
      up[p] += h;
      const std::vector<double> rp = predict(with(up), nullptr);
      for (std::size_t o = 0; o < obs.size(); ++o) J[o][p] = (rp[o] - r[o]) / h;
    }
    std::vector<double> g(n, 0.0);
    std::vector<std::vector<double>> A(n, std::vector<double>(n, 0.0));
    for (std::size_t o = 0; o < obs.size(); ++o)
      for (std::size_t a = 0; a < n; ++a) {
        g[a] += J[o][a] * r[o];
        for (std::size_t b = 0; b < n; ++b) A[a][b] += J[o][a] * J[o][b];
      }
    bool improved = false;
    for (int tries = 0; tries < 12 && !improved; ++tries) {
      // Solve (A + λ·diag(A) + 1e-9·I) δ = −g by Gaussian elimination with partial pivoting.
      std::vector<std::vector<double>> M = A;
      std::vector<double> rhs(n);
      for (std::size_t a = 0; a < n; ++a) M[a][a] += lambda * A[a][a] + 1e-9, rhs[a] = -g[a];
      for (std::size_t col = 0; col < n; ++col) {
        std::size_t piv = col;
        for (std::size_t row = col + 1; row < n; ++row)
          if (std::fabs(M[row][col]) > std::fabs(M[piv][col])) piv = row;
        std::swap(M[col], M[piv]);
        std::swap(rhs[col], rhs[piv]);
        for (std::size_t row = col + 1; row < n; ++row) {
          const double f = M[row][col] / M[col][col];
          for (std::size_t k = col; k < n; ++k) M[row][k] -= f * M[col][k];
          rhs[row] -= f * rhs[col];
        }
      }
      std::vector<double> delta(n);
      for (std::size_t a = n; a-- > 0;) {
        double s = rhs[a];
        for (std::size_t k = a + 1; k < n; ++k) s -= M[a][k] * delta[k];
        delta[a] = s / M[a][a];
      }
      std::vector<double> trial(n);
      for (std::size_t p = 0; p < n; ++p)
        trial[p] = std::clamp(u[p] + std::clamp(delta[p], -3.0, 3.0), std::log(params[p].lo), std::log(params[p].hi));
      const std::vector<double> rt = predict(with(trial), nullptr);
      const double ct = cost(rt);
      if (ct < c0) {
        improved = true;
        const bool converged = c0 - ct < 1e-10 * (1 + c0);
        u = trial, r = rt, c0 = ct;
        lambda = std::max(lambda / 3, 1e-9);
        if (converged) iter = 1 << 20;
      } else {
        lambda *= 4;
      }
    }
    if (!improved) break;
  }
  fit.calibration = with(u);
  fit.calibration.fitted_runs = static_cast<int>(runs.size());
  fit.calibration.path.clear();
  for (std::size_t p = 0; p < n; ++p) {
    fit.fitted.push_back(params[p].name);
    // A constant none of the runs depends on (e.g. the routing cost without a MoE run) cannot be fitted:
    // it stays where it started, and the output says so.
    std::vector<double> up = u;
    up[p] += 0.1;
    const std::vector<double> rp = predict(with(up), nullptr);
    bool moves = false;
    for (std::size_t o = 0; o < obs.size() && !moves; ++o) moves = std::fabs(rp[o] - r[o]) > 1e-9;
    if (!moves) fit.unconstrained.push_back(params[p].name);
  }
  std::vector<double> ratios;
  predict(fit.calibration, &fit.after_ms, &ratios);
  const double none = std::numeric_limits<double>::quiet_NaN();
  fit.after_part_errors.assign(runs.size(), {none, none, none, none, none});
  for (std::size_t o = 0; o < obs.size(); ++o)
    if (obs[o].what > 0) fit.after_part_errors[obs[o].run][static_cast<std::size_t>(obs[o].what - 1)] = ratios[o];
  return fit;
}

}  // namespace meshrun::planner
