// Table and JSON renderings of estimates and search results.
#include <cstdio>
#include <ostream>
#include <string>

#include "meshrun/json.hpp"
#include "meshrun/planner.hpp"

namespace meshrun::planner {
namespace {

constexpr double kGiB = double(1 << 30);

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

const char* drop_key(Drop d) {
  switch (d) {
    case Drop::heads_tp: return "heads_tp";
    case Drop::tp_nvlink: return "tp_nvlink";
    case Drop::seq_cp: return "seq_cp";
    case Drop::cp_alltoall: return "cp_alltoall";
    case Drop::batch_dp: return "batch_dp";
    case Drop::layers_pp: return "layers_pp";
    case Drop::microbatches: return "microbatches";
    case Drop::schedule_size: return "schedule_size";
    case Drop::memory: return "memory";
    case Drop::validator: return "validator";
    case Drop::count_: break;
  }
  return "?";
}

std::string setting_line(const Estimate& e) {
  const Layout& l = e.layout;
  std::string s = "tp=" + std::to_string(l.tp) + " cp=" + std::to_string(l.cp) + " pp=" + std::to_string(l.pp) +
                  " dp=" + std::to_string(l.dp) + " ep=" + std::to_string(l.ep) + "  order " + l.order.str() +
                  "\n              schedule " + pipeline_schedule_name(e.schedule);
  if (e.layout.virtual_stages > 1) s += " (" + std::to_string(l.virtual_stages) + " virtual stages)";
  s += ", micro-batch " + std::to_string(e.micro_batch_size) + " × " + std::to_string(e.micro_batches) +
       ", ZeRO-" + std::to_string(l.zero_stage) + ", recompute " + recompute_name(e.recompute) +
       ", sequence parallel " + (l.sequence_parallel ? "on" : "off");
  return s;
}

void layout_json(JsonWriter& j, const Estimate& e) {
  const Layout& l = e.layout;
  j.key("layout").begin_object();
  j.field("tp", l.tp).field("cp", l.cp).field("pp", l.pp).field("dp", l.dp).field("ep", l.ep);
  j.field("order", l.order.str()).field("virtual_stages", l.virtual_stages).field("zero_stage", l.zero_stage);
  j.field("sequence_parallel", l.sequence_parallel).field("pipeline_schedule", pipeline_schedule_name(e.schedule));
  j.field("micro_batch_size", e.micro_batch_size).field("micro_batches", e.micro_batches);
  j.field("recompute", recompute_name(e.recompute));
  j.end_object();
}

void estimate_object(JsonWriter& j, const Estimate& e) {
  j.begin_object();
  layout_json(j, e);
  j.key("hardware").begin_object();
  j.field("gpu", e.hardware.gpu).field("generation", e.hardware.generation);
  j.field("bf16_tflops", e.hardware.bf16_tflops).field("sms", e.hardware.sms);
  j.field("memory_gib", e.hardware.memory_gib).field("nvlink_gbps", e.hardware.nvlink_gbps);
  j.field("network_gbps_per_gpu", e.hardware.nic_gbps_per_gpu);
  if (!e.hardware.calibration.empty()) j.field("calibration", e.hardware.calibration);
  j.end_object();
  j.key("links").begin_object();
  j.field("tp", link_name(e.links.tp)).field("cp", link_name(e.links.cp)).field("pp", link_name(e.links.pp));
  j.field("dp", link_name(e.links.dp)).field("ep", link_name(e.links.ep)).field("edp", link_name(e.links.edp));
  j.end_object();
  const MemoryParts& m = e.memory;
  j.key("memory_gib_per_gpu").begin_object();
  j.field("total", m.total() / kGiB).field("params", m.params / kGiB).field("grads", m.grads / kGiB);
  j.field("optimizer", m.optimizer / kGiB).field("activations", m.activations / kGiB);
  j.field("logits", m.logits / kGiB).field("workspace", m.workspace / kGiB);
  j.field("comm_buffers", m.comm_buffers / kGiB).field("reserve", m.reserve / kGiB);
  j.field("capacity", e.memory_capacity_gib).field("stage", e.memory_stage);
  j.end_object();
  j.field("fits", e.fits);
  j.key("overflow");
  if (e.fits) j.null(); else j.value(e.overflow);
  const TimeParts& t = e.time;
  j.field("step_time_s", e.step_time_s);
  j.key("step_time_parts_s").begin_object();
  j.field("compute", t.compute).field("recompute", t.recompute).field("tp_comm", t.tp_comm);
  j.field("cp_comm", t.cp_comm).field("ep_comm", t.ep_comm).field("pp_bubble", t.pp_bubble);
  j.field("dp_comm", t.dp_comm).field("optimizer", t.optimizer);
  if (t.host > 0) j.field("host", t.host);                          // CPU runs only
  if (t.shared_cores > 0) j.field("shared_cores", t.shared_cores);  // CPU ranks outnumbering the CPUs only
  j.end_object();
  // compute split by kernel group (what --calibrate compares with meshrun-train's kernel_ms), not added again
  j.key("compute_parts_s").begin_object();
  j.field("matmul", t.compute_parts.matmul).field("attention", t.compute_parts.attention);
  j.field("elementwise", t.compute_parts.elementwise);
  j.end_object();
  j.field("tokens_per_s_per_gpu", e.tokens_per_s_per_gpu).field("tflops_per_gpu", e.tflops_per_gpu);
  j.field("mfu", e.mfu).field("model_flops_per_step", e.model_flops_per_step);
  j.field("params_total", e.params_total);
  j.field("first_stage_layers", e.first_stage_layers).field("last_stage_layers", e.last_stage_layers);
  j.field("expert_imbalance", e.expert_imbalance);
  j.end_object();
}

}  // namespace

void print_estimate_table(std::ostream& os, const Estimate& e) {
  const Hardware& hw = e.hardware;
  os << "Estimate (cost model: docs/planner.md)\n";
  os << "  setting     " << setting_line(e) << "\n";
  if (hw.gpu == "cpu")
    os << "  hardware    cpu (meshrun-train's CPU backend): " << fmt("%.1f", hw.bf16_tflops * 1000)
       << " GFLOP/s matmul and " << fmt("%.1f", hw.hbm_tbps * 1000) << " GB/s memory per rank, MPI "
       << fmt("%.1f", hw.pcie_gbps) << " GB/s, " << fmt("%.1f", hw.memory_gib) << " GiB per rank\n";
  else
    os << "  hardware    " << hw.gpu << " (" << hw.generation << " constants): " << fmt("%.0f", hw.bf16_tflops)
       << " TFLOP/s bf16" << (hw.sms > 0 ? " on " + std::to_string(hw.sms) + " SMs" : std::string()) << ", "
       << fmt("%.1f", hw.memory_gib) << " GiB, NVLink " << fmt("%.0f", hw.nvlink_gbps) << " GB/s, network "
       << fmt("%.1f", hw.nic_gbps_per_gpu) << " GB/s per GPU\n";
  if (!hw.calibration.empty()) os << "  calibration " << hw.calibration << "\n";
  os << "  links       tp " << link_name(e.links.tp) << ", cp " << link_name(e.links.cp) << ", pp "
     << link_name(e.links.pp) << ", dp·cp " << link_name(e.links.dp) << ", ep " << link_name(e.links.ep) << "\n";
  os << "  parameters  " << fmt("%.4g", double(e.params_total)) << " (" << e.first_stage_layers
     << " layers on the first stage, " << e.last_stage_layers << " on the last)\n";
  if (e.expert_imbalance != 1)
    os << "  routing     expert imbalance " << fmt("%.3g", e.expert_imbalance)
       << " (planner.expert_imbalance): the busiest rank's expert GEMMs, all-to-all and expert buffers × it\n";
  const MemoryParts& m = e.memory;
  os << "  memory per GPU, " << e.memory_stage << " stage (GiB)\n";
  auto mem = [&](const char* name, double bytes) {
    os << "    " << name << std::string(24 - std::string(name).size(), ' ') << pad(fmt("%.2f", bytes / kGiB), 9)
       << "\n";
  };
  mem("parameters", m.params);
  mem("gradients", m.grads);
  mem("optimizer state", m.optimizer);
  mem("activations", m.activations);
  mem("logits", m.logits);
  mem("workspaces", m.workspace);
  mem("ZeRO-3 gathered weights", m.comm_buffers);
  mem("reserve", m.reserve);
  os << "    total                   " << pad(fmt("%.2f", m.total() / kGiB), 9) << " of "
     << fmt("%.1f", e.memory_capacity_gib) << (e.fits ? "  fits\n" : "  DOES NOT FIT\n");
  if (!e.fits) os << "    overflow: " << e.overflow << "\n";
  const TimeParts& t = e.time;
  os << "  step time (s)\n";
  auto sec = [&](const char* name, double s) {
    os << "    " << name << std::string(24 - std::string(name).size(), ' ') << pad(fmt("%.3f", s), 9) << "\n";
  };
  sec("compute", t.compute);
  sec("recompute", t.recompute);
  sec("tp communication", t.tp_comm);
  sec("cp communication", t.cp_comm);
  sec("ep communication", t.ep_comm);
  sec("pipeline bubble", t.pp_bubble);
  sec("dp communication", t.dp_comm);
  sec("optimizer step", t.optimizer);
  if (t.host > 0) sec("host, outside kernels", t.host);
  if (t.shared_cores > 0) sec("ranks sharing CPUs", t.shared_cores);
  sec("step", e.step_time_s);
  os << "  throughput  " << fmt("%.0f", e.tokens_per_s_per_gpu) << " tokens/s per GPU, "
     << fmt("%.0f", e.tflops_per_gpu) << " TFLOP/s per GPU, MFU " << fmt("%.1f", 100 * e.mfu) << "%\n";
}

std::string estimate_json(const Estimate& e) {
  std::string out;
  JsonWriter j(out);
  estimate_object(j, e);
  return out;
}

void print_search_table(std::ostream& os, const SearchResult& r) {
  int64_t shapes_dropped = 0;
  for (int64_t d : r.dropped_meshes) shapes_dropped += d;
  os << "Search: " << r.world << " GPUs, " << r.meshes << " valid mesh shapes (" << shapes_dropped << " dropped), "
     << r.settings << " settings, " << r.feasible << " fit (" << r.feasible_meshes << " shapes), "
     << fmt("%.3f", r.elapsed_s) << " s\n";
  if (!r.top.empty() && !r.top.front().hardware.calibration.empty())
    os << "  calibration " << r.top.front().hardware.calibration << "\n";
  for (int i = 0; i < kDropReasons; ++i) {
    if (r.dropped_meshes[i]) os << "  dropped " << r.dropped_meshes[i] << " shapes: " << drop_reason(Drop(i)) << "\n";
    if (r.dropped_settings[i])
      os << "  dropped " << r.dropped_settings[i] << " settings: " << drop_reason(Drop(i)) << "\n";
  }
  if (r.top.empty()) {
    // Settings skipped for their schedule's length are not known not to fit: say so, not "add GPUs" alone.
    if (const int64_t big = r.dropped_settings[int(Drop::schedule_size)]; big > 0) {
      os << "  no setting left: " << big << " settings were skipped, their schedules over the " << kMaxScheduleSlots
         << " micro-batch × chunk slots the planner simulates (lower training.global_batch_size to search them)";
      if (const int64_t mem = r.dropped_settings[int(Drop::memory)]; mem > 0)
        os << "; " << mem << " do not fit in GPU memory";
      os << "\n";
    } else
      os << "  no setting fits: add GPUs, use GPUs with more memory, or shorten the sequence\n";
    return;
  }
  os << "   #  tp  cp  pp     dp  ep  schedule     v  mb  zero  recompute  mem GiB   step s  vs best  tok/s/GPU  "
        "TFLOP/s    MFU\n";
  int rank = 0;
  for (const Estimate& e : r.top) {
    const Layout& l = e.layout;
    char line[256];
    std::snprintf(line, sizeof line,
                  "  %2d %3d %3d %3d %6d %3d  %-11s %2d %3d  %4d  %-9s %8.1f %8.3f %+7.1f%% %10.0f %8.0f %5.1f%%\n",
                  ++rank, l.tp, l.cp, l.pp, l.dp, l.ep, pipeline_schedule_name(e.schedule), l.virtual_stages,
                  e.micro_batch_size, l.zero_stage, recompute_name(e.recompute), e.memory.total() / kGiB,
                  e.step_time_s, 100 * (e.step_time_s / r.top.front().step_time_s - 1), e.tokens_per_s_per_gpu,
                  e.tflops_per_gpu, 100 * e.mfu);
    os << line;
  }
  if (r.config_rank > 0)
    os << "  the template's own shape ranks " << r.config_rank << " of " << r.feasible_meshes << ", "
       << fmt("%.1f", 100 * r.config_gap) << "% slower than the best"
       << (r.top.front().hardware.gpu == "cpu"
               ? " (the calibrated CPU model's accuracy: docs/planner.md, Calibration)\n"
               : " (the published checks agree within ±10%)\n");
  else
    os << "  the template's own shape is not among the feasible ones\n";
}

std::string search_json(const SearchResult& r) {
  std::string out;
  JsonWriter j(out);
  j.begin_object();
  j.field("world", r.world).field("elapsed_s", r.elapsed_s).field("meshes", r.meshes).field("settings", r.settings);
  j.field("feasible", r.feasible).field("feasible_meshes", r.feasible_meshes);
  j.field("config_rank", r.config_rank).field("config_gap", r.config_gap);
  if (!r.top.empty() && !r.top.front().hardware.calibration.empty())
    j.field("calibration", r.top.front().hardware.calibration);
  j.key("dropped").begin_array();
  for (int i = 0; i < kDropReasons; ++i) {
    if (!r.dropped_meshes[i] && !r.dropped_settings[i]) continue;
    j.begin_object().field("reason", drop_key(Drop(i))).field("why", drop_reason(Drop(i)));
    j.field("meshes", r.dropped_meshes[i]).field("settings", r.dropped_settings[i]).end_object();
  }
  j.end_array();
  j.key("top").begin_array();
  for (const Estimate& e : r.top) estimate_object(j, e);
  j.end_array();
  j.end_object();
  return out;
}

}  // namespace meshrun::planner
