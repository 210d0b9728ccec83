// GPU performance figures (vendor data sheets) and the cost model's constants.
#include <algorithm>
#include <cmath>
#include <string>

#include "meshrun/config.hpp"
#include "meshrun/planner_catalogue.hpp"

namespace meshrun::planner {

const std::vector<GpuPerf>& gpu_catalogue() {
  // Memory is what the driver reports (nvidia-smi MiB / 1024) where known; the vendors' "GB" for HBM
  // matches it closely (H100 80 GB -> 81,559 MiB). NVLink is per direction (half the bidirectional figure).
  static const std::vector<GpuPerf> gpus = {
      {"a100-80gb", "ampere", 312, 108, 80.0, 2.039, 300, 32, 200, 1,
       "A100 SXM4 80GB data sheet, 108 SMs; NVLink3 600 GB/s bidirectional; DGX A100 ConnectX-6 HDR 200G per GPU"},
      {"h100-sxm", "hopper", 989, 132, 79.6, 3.35, 450, 64, 400, 1,
       "H100 SXM5 data sheet (989 TFLOP/s dense bf16, 132 SMs); NVLink4 900 GB/s bidirectional; DGX H100 CX-7 400G per GPU"},
      {"h200", "hopper", 989, 132, 140.4, 4.8, 450, 64, 400, 1,
       "H200 SXM data sheet (141 GB HBM3e, 4.8 TB/s); same compute and NVLink as H100; DGX H200 CX-7 400G per GPU"},
      {"b200", "blackwell", 2250, 148, 179, 8.0, 900, 64, 400, 1,
       "HGX/DGX B200 data sheet (2.25 PFLOP/s dense bf16, 180 GB); NVLink5 1.8 TB/s bidirectional; CX-7 400G per GPU"},
      {"gb200", "blackwell", 2500, 148, 185, 8.0, 900, 64, 400, 1,
       "GB200 NVL72 data sheet (2.5 PFLOP/s dense bf16, 186 GB per GPU); NVLink5 1.8 TB/s; 4x CX-7 400G per tray"},
  };
  return gpus;
}

const GpuPerf* find_gpu(std::string_view name) {
  for (const auto& g : gpu_catalogue())
    if (g.name == name) return &g;
  return nullptr;
}

const GpuPerf* gpu_for_device_name(std::string_view n) {
  const auto has = [n](std::string_view part) { return n.find(part) != std::string_view::npos; };
  // The runtime's names (nvidia-smi --query-gpu=name prints the same): "NVIDIA H100 80GB HBM3" (SXM5),
  // "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB",
  // "NVIDIA B200", "NVIDIA GB200".
  if (has("PCIe") || has("NVL")) return nullptr;
  if (has("GB200")) return find_gpu("gb200");
  if (has("B200")) return find_gpu("b200");
  if (has("H200")) return find_gpu("h200");
  if (has("H100") && (has("HBM3") || has("SXM"))) return find_gpu("h100-sxm");
  if (has("A100") && has("SXM4-80GB")) return find_gpu("a100-80gb");
  return nullptr;
}

namespace {
// What every generation shares: the tile shape (NVIDIA "Matrix Multiplication Background" guide: cuBLAS's
// largest tiles are 256×128 / 128×256), n½, NCCL's latencies (src/graph/tuning.cc, ncclTopoTuneModel:
// ring/Simple baseLat 8.4 µs, hwLat per step NVLink 3.4, PCI 5.7, NET 9.6 µs) and the memory reserve. Only the
// efficiencies are fitted per generation.
CostConstants with_efficiencies(double matmul, double attention, double network, double overlap) {
  CostConstants c;
  c.matmul_efficiency = matmul;
  c.attention_efficiency = attention;
  c.gemm_half_size = 128;
  c.gemm_tile_rows = 128;
  c.gemm_tile_cols = 256;
  c.network_efficiency = network;
  c.overlap_cost = overlap;
  c.collective_base_latency_s = 8.4e-6;
  c.hop_latency_nvlink_s = 3.4e-6;
  c.hop_latency_pcie_s = 5.7e-6;
  c.hop_latency_network_s = 9.6e-6;
  c.reserve_gib = 4.0;
  return c;
}
}  // namespace

const CostConstants& cost_constants(std::string_view generation) {
  // Fitted on some published runs and checked on others (docs/planner.md, "Constants" and "Validation").
  // Hopper: η_mm and η_attn fitted on Llama 3 405B (paper Table 4, three rows); η_net and overlap as before.
  static const CostConstants hopper = with_efficiencies(0.61, 0.45, 0.80, 0.15);
  // Ampere: η_net and overlap fitted on torchtitan's Llama 3 70B on 64 A100 (full recomputation), whose gap
  // was ZeRO-3 traffic over the assumed network; one figure cannot fit more, so η_mm and η_attn keep the values
  // the model had before (0.70, 0.50).
  static const CostConstants ampere = with_efficiencies(0.70, 0.50, 0.95, 0.035);
  // Blackwell: no published bf16 run the model can express (docs/planner.md); hopper's, neither fitted nor
  // checked.
  static const CostConstants blackwell = hopper;
  if (generation == "ampere") return ampere;
  if (generation == "blackwell") return blackwell;
  return hopper;  // hopper, and a GPU outside the catalogue
}

double gemm_efficiency(const Hardware& hw, double m, double n, double k, double count) {
  return gemm_efficiency(hw, hw.constants, m, n, k, count);
}

double gemm_efficiency(const Hardware& hw, const CostConstants& c, double m, double n, double k, double count) {
  double waves = 1.0;
  if (hw.sms > 0) {
    auto quantized = [&](double rows, double cols) {
      rows = std::min(rows, m), cols = std::min(cols, n);  // a thin GEMM gets a thin tile; n½ charges it
      const double tiles = count * std::ceil(m / rows) * std::ceil(n / cols);
      return count * m * n / (rows * cols) / (std::ceil(tiles / hw.sms) * hw.sms);
    };
    waves = std::max(quantized(c.gemm_tile_rows, c.gemm_tile_cols), quantized(c.gemm_tile_cols, c.gemm_tile_rows));
  }
  const double small = std::min({m, n, k});
  return c.matmul_efficiency * waves * small / (small + c.gemm_half_size);
}

namespace {
std::string catalogue_names() {
  std::string s;
  for (const auto& g : gpu_catalogue()) s += (s.empty() ? "" : ", ") + g.name;
  return s;
}
}  // namespace

Hardware resolve_hardware(const ClusterSpec& spec, int gpus_per_node, int nvlink_domain_gpus,
                          std::string_view node_type_gpu, int node_type_nics) {
  std::string key = !spec.gpu.empty() ? spec.gpu : std::string(node_type_gpu);
  const GpuPerf* g = find_gpu(key);
  Hardware hw;
  if (g) {
    hw.gpu = g->name;
    hw.generation = g->generation;
    hw.bf16_tflops = g->bf16_tflops;
    hw.sms = g->sms;
    hw.memory_gib = g->memory_gib;
    hw.hbm_tbps = g->hbm_tbps;
    hw.nvlink_gbps = g->nvlink_gbps;
    hw.pcie_gbps = g->pcie_gbps;
    hw.nic_gbit = g->nic_gbps;
    hw.nics_per_node = g->nics_per_gpu * gpus_per_node;
  } else {
    // Without a catalogue entry every figure must come from the template.
    bool complete = spec.gpu_bf16_tflops > 0 && spec.gpu_memory_gib > 0 && spec.nic_gbps > 0;
    if (!complete) {
      const std::string what = spec.gpu.empty()
                                   ? "cluster.node_type '" + spec.node_type + "' names no GPU model the planner knows"
                                   : "cluster.gpu '" + key + "' is not in the planner's catalogue";
      throw ConfigError(what + "; set cluster.gpu to one of " + catalogue_names() +
                        ", or give cluster.gpu_bf16_tflops, gpu_memory_gib and nic_gbps");
    }
    hw.gpu = key.empty() ? "custom" : key;
    hw.hbm_tbps = 2.0;  // only the optimizer step reads it; a conservative HBM figure
    hw.pcie_gbps = 32;
  }
  if (node_type_nics > 0) hw.nics_per_node = node_type_nics;
  if (spec.gpu_bf16_tflops > 0) hw.bf16_tflops = spec.gpu_bf16_tflops;
  if (spec.gpu_sms > 0) hw.sms = spec.gpu_sms;
  if (spec.gpu_memory_gib > 0) hw.memory_gib = spec.gpu_memory_gib;
  if (spec.nvlink_gbps > 0) hw.nvlink_gbps = spec.nvlink_gbps;
  if (spec.nics_per_node > 0) hw.nics_per_node = spec.nics_per_node;
  if (spec.nic_gbps > 0) hw.nic_gbit = spec.nic_gbps;
  if (hw.nics_per_node <= 0) hw.nics_per_node = gpus_per_node;
  hw.gpus_per_node = gpus_per_node;
  hw.nvlink_domain_gpus = std::max(1, nvlink_domain_gpus);
  hw.nic_gbps_per_gpu = hw.nics_per_node * hw.nic_gbit / 8.0 / std::max(1, gpus_per_node);
  hw.constants = cost_constants(hw.generation);
  return hw;
}

}  // namespace meshrun::planner
