// Performance catalogue of GPU models and the constants of the planner's cost model.
// Placement facts (GPUs per node, NVLink domain, NIC count) belong to mesh's node types; the figures here
// are what the estimate needs: dense bf16 peak, memory, link bandwidths. Every value can be overridden in the
// template's [cluster] section (gpu, gpu_memory_gib, gpu_bf16_tflops, gpu_sms, nvlink_gbps, nics_per_node,
// nic_gbps).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "meshrun/job.hpp"

namespace meshrun::planner {

struct GpuPerf {
  std::string name;        // catalogue key, e.g. "h100-sxm"
  std::string generation;  // architecture whose cost constants apply: "ampere", "hopper", "blackwell"
  double bf16_tflops;      // dense bf16 tensor-core peak, TFLOP/s
  int sms;                 // streaming multiprocessors: one GEMM output tile each at a time
  double memory_gib;       // HBM capacity as the driver reports it, GiB
  double hbm_tbps;         // HBM bandwidth, TB/s
  double nvlink_gbps;      // NVLink bandwidth per GPU per direction, GB/s
  double pcie_gbps;        // host link per direction, GB/s (used for intra-node traffic without NVLink)
  double nic_gbps;         // typical scale-out NIC speed, Gbit/s
  int nics_per_gpu;        // typical NICs per GPU on the vendor's reference node
  std::string source;      // where the figures come from
};
const std::vector<GpuPerf>& gpu_catalogue();
const GpuPerf* find_gpu(std::string_view name);
// The catalogue entry of a device as the CUDA runtime names it ("NVIDIA H100 80GB HBM3" -> h100-sxm), or
// nullptr where the name does not say which entry it is: an H100 PCIe or NVL, an H200 NVL or an A100 40GB have
// other peaks and are not catalogued.
const GpuPerf* gpu_for_device_name(std::string_view device_name);

// The cost model's constants, one set per GPU generation (fitted on published runs, docs/planner.md
// "Constants"). The same for every model: nothing here is tuned per model.
struct CostConstants {
  double matmul_efficiency = 0.0;     // fraction of bf16 peak that large GEMMs reach
  double attention_efficiency = 0.0;  // fraction of bf16 peak that fused (flash) attention reaches, fwd+bwd
  double gemm_half_size = 0.0;        // GEMM dimension at which efficiency halves: η·n/(n + n½)
  // Output tile of one SM in cuBLAS's large bf16 kernels (either orientation): a GEMM runs in waves of
  // one tile per SM, and a last wave that leaves SMs idle costs a full wave (wave quantization).
  double gemm_tile_rows = 0.0;
  double gemm_tile_cols = 0.0;
  double network_efficiency = 0.0;    // fraction of link bandwidth NCCL collectives achieve (NVLink and NICs)
  double overlap_cost = 0.0;          // compute slowdown per second of communication hidden behind it (the
                                      // communication kernels occupy SMs and HBM bandwidth)
  // Latency of an NCCL ring collective over n ranks on g islands (NVLink domains, else nodes), NCCL's own
  // tuning model (ring, Simple protocol): base + (n − g)·hop(intra) + (g − 1)·hop(network) per all-gather or
  // reduce-scatter, twice the steps for an all-reduce; a point-to-point transfer is base + one hop.
  double collective_base_latency_s = 0.0;
  double hop_latency_nvlink_s = 0.0;
  double hop_latency_pcie_s = 0.0;
  double hop_latency_network_s = 0.0;
  double reserve_gib = 0.0;           // per GPU: CUDA context, NCCL buffers, allocator fragmentation
  double memory_efficiency = 1.0;     // share of the memory bandwidth the elementwise kernels and the optimizer reach
  // More ranks than CPUs on a node (meshrun-train on CPU): each collective or transfer waits for a peer
  // that is not running, about a scheduler time slice. 0 on GPUs (a rank per GPU).
  double shared_core_latency_s = 0.0;
  // Host time per layer and micro-batch outside kernels and communication (meshrun-train's CPU backend: its
  // own copies and bookkeeping); on GPUs such gaps are part of the efficiencies, so 0.
  double layer_overhead_s = 0.0;
  // Seconds per attention score (query-key pair) outside the matmul FLOPs, forward and again backward: the
  // softmax's exponential and rescaling, which meshrun-train's CPU kernel pays per score whatever the head
  // dimension. 0 on GPUs, where the fitted attention efficiency holds it.
  double attention_score_s = 0.0;
  // Host time per routed assignment (token × top_k) per MoE layer and micro-batch outside kernels:
  // meshrun-train's CPU backend decides the dispatch on the host (copies the router's choices, sorts the
  // assignments by expert, builds the send order). 0 on GPUs, where routing runs in kernels.
  double routing_assignment_s = 0.0;
  // Bytes moved per parameter of the rank per step outside kernels, at the elementwise kernels' memory rate:
  // meshrun-train's CPU backend zeroes the gradients and copies the weights into the compute precision each
  // step (measured on one rank: 1.05 ms for tiny, 37.8 ms for the mid model, about proportional to their
  // parameters). 0 on GPUs.
  double host_bytes_per_param = 0.0;
};
// The constants of a GPU generation ("ampere", "hopper", "blackwell"); any other name (a GPU outside the
// catalogue) gets hopper's.
const CostConstants& cost_constants(std::string_view generation);

// The hardware an estimate runs on, after catalogue lookup and [cluster] overrides.
struct Hardware {
  std::string gpu;                    // catalogue key, or "cpu" (meshrun-train's CPU backend, from a calibration file)
  std::string generation = "hopper";  // whose cost constants apply; a GPU outside the catalogue: hopper's; "cpu"
  CostConstants constants = cost_constants("hopper");  // the generation's, with a calibration file's on top
  std::string calibration;            // the calibration file read, "" = none
  double bf16_tflops = 0;
  int sms = 0;                 // 0 = unknown: GEMMs are not wave-quantized
  double memory_gib = 0;
  double hbm_tbps = 0;
  double nvlink_gbps = 0;      // per GPU per direction
  double pcie_gbps = 0;
  double nic_gbps_per_gpu = 0; // scale-out bandwidth per GPU, GB/s (bytes!), = nics·Gbit/s / 8 / gpus_per_node
  // A collective's bus bandwidth over a point-to-point's on the same link: 1 on GPUs (NCCL's rings run at
  // link speed, network_efficiency covers the rest); measured on CPUs (collective_gbps / link_gbps).
  double collective_link_ratio = 1.0;
  int nics_per_node = 0;
  double nic_gbit = 0;         // per NIC
  int gpus_per_node = 0;
  int nvlink_domain_gpus = 1;
  // Ranks per CPU of a node when ranks outnumber CPUs (meshrun-train on CPU), else 1: the node's CPUs then
  // run every rank's kernels in turn (cost_time.cpp, shared_cores).
  double core_share = 1;
};

// Share of the bf16 peak one GEMM reaches: count equal problems (a grouped GEMM: MoE experts) of m×n
// outputs and depth k. η_mm · wave quantization (tiles of gemm_tile_rows × gemm_tile_cols, either
// orientation, no larger than the output; one per SM per wave; partial tiles count whole) · n/(n + n½) for
// the smallest dimension n. The first form uses hw.constants.
double gemm_efficiency(const Hardware& hw, double m, double n, double k, double count = 1);
double gemm_efficiency(const Hardware& hw, const CostConstants& c, double m, double n, double k, double count = 1);

// Resolves cluster.gpu (else the node type's GPU) in the catalogue and applies the overrides; constants are
// the generation's (a calibration file's go on top: planner_calibration.hpp).
// Throws meshrun::ConfigError with one actionable line when the GPU is unknown.
Hardware resolve_hardware(const ClusterSpec& spec, int gpus_per_node, int nvlink_domain_gpus,
                          std::string_view node_type_gpu, int node_type_nics);

}  // namespace meshrun::planner
