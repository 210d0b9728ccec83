// Equivalence of parallel layouts with the 1-process run, under `mpirun -np 8`.
//
// For tp ∈ {1,2,4} × dp ∈ {1,2,4} (tp·dp ≤ 8), ZeRO 0-3, sequence parallelism off/on, 10 steps of a small
// Llama: the loss and gradient norm of every step, the reduced gradients of step 1 and the final
// parameters are compared with a single process that uses the same micro-batch size (initialization is
// keyed by global element index, so both start from the same weights).
//
// Which comparison holds, and why:
//  * BIT-EXACT when tp = 1 and each data-parallel rank runs one micro-batch per step: every gradient is
//    then ((g_0 + g_1) + g_2) + ... over micro-batches in both runs (the single process accumulates in
//    micro-batch order; the parallel run's fixed-order reduction adds rank 0's, then rank 1's, ...),
//    the optimizer is elementwise, and the clip factor comes from the norm rounded to fp32.
//  * BIT-EXACT between ZeRO stages of one layout: stage 1 vs 0 always (reduce-scatter + all-gather is
//    the all-reduce, element for element); stages 2-3 vs 0 with one micro-batch per rank (with more,
//    stages 2-3 reduce each micro-batch as it finishes, which regroups the sum).
//  * Otherwise the summation order differs: row-parallel layers and the vocab-parallel cross-entropy
//    split inner products and sums over tensor-parallel shards; several micro-batches per rank regroup
//    the gradient sum; sequence parallelism sums norm-weight gradients per row slice. Then
//      - fp32: the loss and global gradient norm of every step (clipping is active in the first steps, so
//        the norm sets the update), the reduced gradient of step 1 and the final parameters after 10 steps
//        at peak lr 3e-4, per tensor, within relative 1e-6. The bound on parameters depends on the learning
//        rate: Adam divides each update by sqrt(v), so where a gradient's history nearly cancels in m, a
//        1e-7 rounding difference in the gradient becomes a larger relative difference in the update
//        (measured: 1.5e-5 after 10 steps at lr 1e-2, 1.7e-6 at 1e-3, ≤ 1e-6 at 3e-4, a realistic peak).
//      - fp64 (the same layouts, training.dtype = fp64): loss, step-1 gradients and final parameters
//        within relative 1e-12 (measured ≤ 1.6e-14): the parallel computation is the serial one up to
//        rounding.
//    Loss: max over steps of |Δ|/|ref|. Gradients, parameters: max over tensors of ‖Δ‖₂/‖ref‖₂.
// Negative tests: a skipped tensor-parallel all-reduce and a wrong data-parallel shard must each fail.
//
// On the strict backend (MESHRUN_STRICT_BACKEND=1: trainer.strict.equivalence, slower per run: two
// mprotect calls per buffer per backend call) the program runs a subset that still reaches every
// communication and host-access path once: fp32 everywhere but one fp64 layout (the trainer's double
// instantiation); tp2 x dp2 with sequence parallelism and dp2 with gradient accumulation, each at every ZeRO
// stage; the pipeline schedules GPipe, 1F1B with dp, interleaved, ZB, ZB with tp, dp, ZeRO-3 and SP, ZBV alone and
// with dp and ZeRO-3, DualPipeV at pp4; CP ring
// and all-gather alone, with tp + SP, dp + ZeRO-3 and pp; MoE with ep = dp, edp = 2 ZeRO-3, tp + SP, pp ZB, cp
// and the skewed router; one router_aux = "hf" layout; the blend. Not the negative tests and the activation
// accounting, which check the comparisons and counters, not the device seam; the plain run covers the rest.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/data/indexed_dataset.hpp"
#include "meshrun/train/data/samples.hpp"
#include "meshrun/train/run/trainer.hpp"
#include "meshrun/comm/mpi.hpp"

using meshrun::comm::make_mpi_groups;

using namespace meshrun;
using namespace meshrun::train;

namespace {

// Fault injection for the negative tests (test-only decorator over a real communicator).
enum class Fault { none, skip_tp_all_reduce, rotate_dp_all_gather, stage_skips_layer, contiguous_cp_split, ring_drops_block,
                   moe_drop_token, moe_wrong_rank, rotate_cp_all_to_all };

class FaultyComm final : public ForwardingComm {
 public:
  FaultyComm(std::unique_ptr<Comm> inner, Fault f) : ForwardingComm(std::move(inner)), f_(f) {}
  void all_reduce(Buf b, ReduceOp op) override {
    if (f_ == Fault::skip_tp_all_reduce && op == ReduceOp::sum) return;  // "forgot" the row-parallel sum
    inner().all_reduce(b, op);
  }
  void all_gather(Buf s, Buf r) override {
    inner().all_gather(s, r);
    if (f_ != Fault::rotate_dp_all_gather) return;
    // Every rank puts block r+1 where block r belongs: a shard written to the wrong place.
    const std::size_t bytes = static_cast<std::size_t>(s.bytes());
    char* p = static_cast<char*>(r.p);
    std::rotate(p, p + bytes, p + bytes * size());
  }
  // Every CP all-to-all delivers what rank s sent to where rank s+1's block belongs (equal blocks: context
  // parallelism's head exchange).
  void all_to_all(Buf s, const std::int64_t* sc, Buf r, const std::int64_t* rc) override {
    inner().all_to_all(s, sc, r, rc);
    if (f_ != Fault::rotate_cp_all_to_all) return;
    std::int64_t total = 0, block = 0;
    for (int i = 0; i < size(); ++i) total += rc[i], block = std::max(block, rc[i]);
    char* p = static_cast<char*>(r.p);
    const std::size_t e = static_cast<std::size_t>(dtype_size(r.t));
    std::rotate(p, p + static_cast<std::size_t>(block) * e, p + static_cast<std::size_t>(total) * e);
  }
  // The first K/V block a rank receives around the CP ring arrives as zeros (a dropped block).
  Request irecv(Buf b, int peer, int tag) override {
    Request r = inner().irecv(b, peer, tag);
    if (f_ != Fault::ring_drops_block || ++recvs_ != 1) return r;
    auto lost = std::make_unique<ZeroAfterWait>();
    lost->inner = std::move(r);
    lost->buf = b.p;
    lost->bytes = static_cast<std::size_t>(b.bytes());
    return Request(std::move(lost));
  }

 private:
  struct ZeroAfterWait final : Request::Pending {
    Request inner;
    void* buf = nullptr;
    std::size_t bytes = 0;
    void wait() override {
      inner.wait();
      std::memset(buf, 0, bytes);
    }
  };
  Fault f_;
  int recvs_ = 0;
};

struct Run {
  std::vector<double> losses, grad_norms;
  std::vector<std::pair<std::string, std::vector<double>>> params;  // fp32 values widened exactly
  std::vector<std::pair<std::string, std::vector<double>>> grads1;  // reduced gradient of step 1
  std::int64_t memory = 0;     // params + grads + optimizer state
  std::int64_t transient = 0;  // peak of gradient scratch and gathered units
  std::int64_t saved_activations = 0;        // rank 0's stages: activation slots and backward buffers
  std::vector<std::int64_t> attention_pairs;  // per rank of the layout (gathered on its rank 0)
  std::vector<double> aux_losses;             // MoE load-balancing loss of every step
  double tokens_max1 = 0, tokens_mean1 = 0;   // MoE: assignments per (layer, expert) in step 1
  std::int64_t a2a_bytes1 = 0;                // MoE: rank 0's all-to-all bytes in step 1
  std::vector<double> eval_losses;            // training.eval_interval's validation losses on data.valid
};

struct Case {
  int tp = 1, dp = 1, zero = 0, mbs = 1;
  bool sp = false;
  bool fp64 = false;
  std::string order = "tp-cp-ep-dp-pp";
  int pp = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  int cp = 1;
  std::string cp_comm = "ring";
  int cp_alltoall = 0;  // alltoall+ring's group
  int ep = 1;
  bool skew_router = false;  // MoE: router weights zeroed at the start (all tokens tie: experts 0..k-1)
  int ranks() const { return tp * dp * pp * cp; }
  std::string str() const {
    char b[160];
    std::snprintf(b, sizeof b, "%s tp=%d dp=%d zero=%d sp=%s mbs=%d", fp64 ? "fp64" : "fp32", tp, dp, zero,
                  sp ? "on" : "off", mbs);
    std::string out = b;
    if (pp > 1) {
      std::snprintf(b, sizeof b, " pp=%d %s", pp, schedule.c_str());
      out += b;
      if (virtual_stages > 1) out += " V=" + std::to_string(virtual_stages);
    }
    if (cp > 1) out += " cp=" + std::to_string(cp) + " " + cp_comm;
    if (cp_alltoall > 0) out += " groups of " + std::to_string(cp_alltoall);
    if (ep > 1) out += " ep=" + std::to_string(ep);
    if (skew_router) out += " skewed router";
    return out;
  }
};

// comm == MPI_COMM_NULL: the single-process reference (no MPI communicators at all).
template <class T>
Run train_run(JobConfig cfg, const Case& c, MPI_Comm comm, Fault fault = Fault::none) {
  cfg.training.micro_batch_size = c.mbs;
  cfg.parallel.pipeline_schedule = c.schedule;
  cfg.parallel.cp_comm = c.cp_comm;
  cfg.parallel.cp_alltoall = c.cp_alltoall;
  Layout layout;
  layout.cp = c.cp;
  layout.tp = c.tp;
  layout.dp = c.dp;
  layout.pp = c.pp;
  layout.ep = c.ep;
  // What resolve_layout does: zbv and dualpipev run virtual_stages = 1 as their two chunks per rank.
  layout.virtual_stages = scheduled_virtual_stages(*parse_pipeline_schedule(c.schedule), c.virtual_stages);
  layout.zero_stage = c.zero;
  layout.sequence_parallel = c.sp;
  std::string err;
  layout.order = *parse_order(c.order, &err);
  const RankGrid grid(layout);
  int rank = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
  Groups groups = comm == MPI_COMM_NULL ? make_local_groups() : make_mpi_groups(comm, grid);
  if (fault == Fault::skip_tp_all_reduce) {
    auto& g = groups.by_kind[static_cast<int>(GroupKind::tp)];
    g = std::make_unique<FaultyComm>(std::move(g), fault);
  }
  if (fault == Fault::rotate_dp_all_gather) {
    auto& g = groups.by_kind[static_cast<int>(GroupKind::dp_cp)];
    g = std::make_unique<FaultyComm>(std::move(g), fault);
  }
  if (fault == Fault::ring_drops_block || fault == Fault::rotate_cp_all_to_all) {
    auto& g = groups.by_kind[static_cast<int>(GroupKind::cp)];
    g = std::make_unique<FaultyComm>(std::move(g), fault);
  }
  // What meshrun-train reads: data.path or data.blend, and data.valid.
  const std::unique_ptr<SampleSource> sched = open_samples(training_samples(cfg, cfg.data.path));
  const std::unique_ptr<SampleSource> valid = cfg.data.valid.empty() ? nullptr : open_samples(validation_samples(cfg, cfg.data.path));
  typename Trainer<T>::TestFaults faults;
  if (fault == Fault::stage_skips_layer)  // the second chunk forgets its first decoder layer
    faults.edit_chunks = [](std::vector<ChunkUnits>& chunks) { chunks.at(1).units.erase(chunks.at(1).units.begin()); };
  faults.contiguous_cp_tokens = fault == Fault::contiguous_cp_split;
  faults.moe_drop_token = fault == Fault::moe_drop_token;
  faults.moe_wrong_rank = fault == Fault::moe_wrong_rank;
  Trainer<T> t(cfg, grid, rank, groups, faults);
  t.init_params();
  if (c.skew_router)
    for (int l = 0; l < t.table().layers; ++l) {
      const int u = t.table().layer_unit(l);
      if (!t.holds(u)) continue;
      std::vector<T> w = t.store().template read_unit<T>(u);
      const TensorSlot& r = t.table().units[u].tensors[kRouter];
      std::fill(w.begin() + r.offset, w.begin() + r.offset + r.numel(), T(0));
      t.store().write_unit(u, w.data());
    }
  Run r;
  for (int s = 0; s < cfg.training.steps; ++s) {
    const StepStats st = t.step(s, *sched);
    if (valid && (s + 1) % cfg.training.eval_interval == 0)
      r.eval_losses.push_back(t.evaluate(*valid, cfg.training.eval_batches));
    r.losses.push_back(st.loss);
    r.grad_norms.push_back(st.grad_norm);
    r.aux_losses.push_back(st.aux_loss);
    if (s == 0) {
      r.tokens_max1 = st.expert_tokens_max;
      r.tokens_mean1 = st.expert_tokens_mean;
      r.a2a_bytes1 = st.a2a_bytes;
    }
    if (s == 0)
      for (auto& [name, v] : t.gather_grads()) r.grads1.emplace_back(name, std::vector<double>(v.begin(), v.end()));
  }
  for (auto& [name, v] : t.gather_params()) r.params.emplace_back(name, std::vector<double>(v.begin(), v.end()));
  r.memory = t.memory().total() - t.memory().transient_peak;
  r.transient = t.memory().transient_peak;
  r.saved_activations = t.saved_activation_bytes();
  std::int64_t pairs = t.attention_pairs();
  int size = 1;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &size);
  r.attention_pairs.resize(static_cast<std::size_t>(size));
  if (comm != MPI_COMM_NULL)
    MPI_Gather(&pairs, 1, MPI_INT64_T, r.attention_pairs.data(), 1, MPI_INT64_T, 0, comm);
  else
    r.attention_pairs[0] = pairs;
  return r;
}

struct Diff {
  bool bit_equal = true;
  double loss_rel = 0, param_rel = 0, grad_rel = 0;
};

// Max over tensors of ‖a − b‖₂ / ‖b‖₂; also folds bit equality into *equal.
double tensor_rel(const std::vector<std::pair<std::string, std::vector<double>>>& a,
                  const std::vector<std::pair<std::string, std::vector<double>>>& b, bool* equal) {
  double worst = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const auto& x = a[i].second;
    const auto& y = b[i].second;
    *equal = *equal && a[i].first == b[i].first && x.size() == y.size() &&
             std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
    double num = 0, den = 0;
    for (std::size_t j = 0; j < y.size(); ++j) {
      num += (x[j] - y[j]) * (x[j] - y[j]);
      den += y[j] * y[j];
    }
    worst = std::max(worst, den == 0 ? std::sqrt(num) : std::sqrt(num / den));
  }
  return worst;
}

Diff compare(const Run& a, const Run& ref) {
  Diff d;
  for (std::size_t s = 0; s < ref.losses.size(); ++s) {
    d.bit_equal = d.bit_equal && std::memcmp(&a.losses[s], &ref.losses[s], sizeof(double)) == 0;
    d.loss_rel = std::max(d.loss_rel, std::abs(a.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]));
    // The global gradient norm is held to the loss's bound; its fp32 rounding (which sets the clip factor) to
    // the bits: the reported norm is unrounded, and its last bits depend on the shard boundaries of the sums.
    d.bit_equal = d.bit_equal && static_cast<float>(a.grad_norms[s]) == static_cast<float>(ref.grad_norms[s]);
    d.loss_rel = std::max(d.loss_rel, std::abs(a.grad_norms[s] - ref.grad_norms[s]) / ref.grad_norms[s]);
    // The MoE load-balancing loss too (zero for dense models).
    d.bit_equal = d.bit_equal && a.aux_losses[s] == ref.aux_losses[s];
    if (ref.aux_losses[s] != 0)
      d.loss_rel = std::max(d.loss_rel, std::abs(a.aux_losses[s] - ref.aux_losses[s]) / std::abs(ref.aux_losses[s]));
  }
  d.param_rel = tensor_rel(a.params, ref.params, &d.bit_equal);
  d.grad_rel = tensor_rel(a.grads1, ref.grads1, &d.bit_equal);
  // Validation losses, held to the loss's bound (a run without data.valid has none).
  d.bit_equal = d.bit_equal && a.eval_losses.size() == ref.eval_losses.size();
  for (std::size_t i = 0; i < std::min(a.eval_losses.size(), ref.eval_losses.size()); ++i) {
    d.bit_equal = d.bit_equal && std::memcmp(&a.eval_losses[i], &ref.eval_losses[i], sizeof(double)) == 0;
    d.loss_rel = std::max(d.loss_rel, std::abs(a.eval_losses[i] - ref.eval_losses[i]) / std::abs(ref.eval_losses[i]));
  }
  if (a.eval_losses.size() != ref.eval_losses.size()) d.loss_rel = HUGE_VAL;
  return d;
}

// The validation losses alone (the rest of the runs may differ).
Diff compare_eval(const Run& a, const Run& ref) {
  Run y = ref;
  y.eval_losses = a.eval_losses;
  return compare(y, ref);
}

// Megatron indexed datasets from the license text (ids = bytes mod vocab, a document per line, EOS 0 after
// each), bytes [from, from + n): what a blend is tested on.
std::string make_indexed(const std::string& prefix, std::size_t from, std::size_t n, std::int64_t vocab) {
  std::ifstream is("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
  text = text.substr(from, n);
  IndexedDatasetWriter w(prefix, 8);
  std::vector<std::uint32_t> doc;
  for (char ch : text) {
    if (ch == '\n' && !doc.empty()) {
      doc.push_back(0);
      w.add_document(doc.data(), doc.size());
      doc.clear();
    } else if (ch != '\n') {
      doc.push_back(static_cast<std::uint32_t>(1 + static_cast<unsigned char>(ch) % (vocab - 1)));
    }
  }
  if (!doc.empty()) w.add_document(doc.data(), doc.size());
  w.finish();
  return prefix;
}

struct Tol {
  double loss, grad, param;
  const char* name;
};
constexpr Tol kFp32{1e-6, 1e-6, 1e-6, "rel <= 1e-6"};
constexpr Tol kFp64{1e-12, 1e-12, 1e-12, "rel <= 1e-12"};

struct Report {
  int rank = 0, failures = 0, checks = 0;
  // exact: bits must match; otherwise both relative differences within tol. expect_fail inverts
  // (negative test).
  void check(const std::string& what, const Diff& d, bool exact, const Tol& tol, bool expect_fail = false) {
    const bool ok = exact ? d.bit_equal : (d.loss_rel <= tol.loss && d.grad_rel <= tol.grad && d.param_rel <= tol.param);
    const bool pass = expect_fail ? !ok : ok;
    ++checks;
    if (!pass) ++failures;
    if (rank == 0)
      std::printf("%-4s %-58s %-18s loss %.1e  grad1 %.1e  param %.1e%s\n", pass ? "ok" : "FAIL", what.c_str(),
                  exact ? "bit-exact" : tol.name, d.loss_rel, d.grad_rel, d.param_rel,
                  expect_fail ? (ok ? "  (fault NOT detected)" : "  (fault detected)") : (d.bit_equal ? "  [bits equal]" : ""));
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = std::filesystem::temp_directory_path().string() + "/meshrun-trainer-test";
  const JobConfig cfg = test::small_config(test::make_token_file(dir, 64));
  Report rep;
  rep.rank = rank;
  const int B = cfg.training.global_batch_size;

  // Single-process references by (layers, sequence length, micro-batch size, fp64); rank 0 only.
  std::map<std::tuple<int, int, int, bool, int, bool, std::string, double>, Run> serial;
  auto reference_of = [&](const JobConfig& jc, int mbs, bool fp64, bool skew = false) -> const Run& {
    const auto key = std::make_tuple(jc.model.layers, jc.training.seq_len, mbs, fp64, jc.model.experts, skew, jc.model.router_aux,
                                     jc.model.aux_loss_coef());
    if (!serial.count(key)) {
      Case c{1, 1, 0, mbs, false, fp64};
      c.skew_router = skew;
      serial[key] = fp64 ? train_run<double>(jc, c, MPI_COMM_NULL) : train_run<float>(jc, c, MPI_COMM_NULL);
    }
    return serial[key];
  };
  auto reference = [&](int mbs, bool fp64) -> const Run& { return reference_of(cfg, mbs, fp64); };

  auto run_cfg = [&](const JobConfig& jc, const Case& c, Fault f = Fault::none) -> Run {
    // Ranks [0, tp·dp·pp) form the layout's communicator; the rest wait.
    const int need = c.ranks();
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank < need ? 0 : MPI_UNDEFINED, rank, &sub);
    Run r;
    if (sub != MPI_COMM_NULL) {
      r = c.fp64 ? train_run<double>(jc, c, sub, f) : train_run<float>(jc, c, sub, f);
      MPI_Comm_free(&sub);
    }
    return r;
  };
  auto run_on = [&](const Case& c, Fault f = Fault::none) -> Run { return run_cfg(cfg, c, f); };
  // MESHRUN_EQUIVALENCE_ONLY=blend runs the blend section alone (a quick check while working on data).
  const char* only = std::getenv("MESHRUN_EQUIVALENCE_ONLY");
  const bool only_blend = only && std::string(only) == "blend";
  const bool strict = device::strict_backend_requested();
  if (strict && rank == 0) std::printf("strict backend: the subset of layouts in this file's header\n");
  auto finish = [&] {
    if (rank == 0) std::printf("%d checks, %d failed\n", rep.checks, rep.failures);
    std::filesystem::remove(cfg.data.path);
    int code = rep.failures == 0 ? 0 : 1;
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return code;
  };
  // One CP layout on 16-token sequences against the single process (rank 0 judges, within the CP bounds);
  // with `balance`, also that every rank computed the same number of visible (query, key) pairs (the
  // runtime's own counter), `note` appended to that line.
  auto cp_case = [&](const JobConfig& jc, const Case& c, bool balance, const std::string& note) {
    if (c.ranks() > world) {
      if (rank == 0) std::printf("skip %s: needs %d ranks, have %d\n", c.str().c_str(), c.ranks(), world);
      return;
    }
    const Run r = run_cfg(jc, c);
    if (rank != 0) return;
    rep.check(c.str() + " vs 1 process", compare(r, reference_of(jc, 1, c.fp64)), false, c.fp64 ? kFp64 : kFp32);
    if (!balance) return;
    const auto& pr = r.attention_pairs;
    const bool equal = std::all_of(pr.begin(), pr.end(), [&](std::int64_t x) { return x == pr[0]; });
    ++rep.checks;
    if (!equal) ++rep.failures;
    std::printf("%-4s %s: attention pairs per rank equal (%lld each)%s\n", equal ? "ok" : "FAIL", c.str().c_str(),
                (long long)pr[0], note.c_str());
  };
  // All-to-all context parallelism, alone (`trainer_equivalence cp-alltoall`; the main run leaves it out):
  // "alltoall" (Ulysses: each rank attends heads/cp of its heads over whole sequences, in the single
  // process's own causal call) and "alltoall+ring" (all-to-all in groups of 2, a ring across the groups,
  // chunk pair by chunk pair), against the single process on 16-token sequences within the CP bounds (fp32
  // 1e-6, fp64 1e-12; the loss and the gradients still sum over the CP shards in another order). Small
  // config: 8 heads, 4 kv heads, so alltoall runs at cp 2 and 4 (and at cp 2 with tp 2).
  if (argc > 1 && std::string(argv[1]) == "cp-alltoall") {
    JobConfig cfg16 = cfg;
    cfg16.training.seq_len = 16;
    struct A2aCase {
      int cp, group, tp, dp, zero, pp;
      bool sp;
    };
    const A2aCase cases[] = {{2, 0, 1, 1, 0, 1, false}, {4, 0, 1, 1, 0, 1, false}, {2, 0, 2, 1, 0, 1, true},
                             {2, 0, 1, 2, 3, 1, false}, {2, 0, 1, 1, 0, 2, false}, {2, 0, 2, 2, 1, 1, true},
                             {4, 2, 1, 1, 0, 1, false}, {4, 2, 1, 2, 1, 1, false}, {4, 2, 2, 1, 0, 1, true}};
    for (const A2aCase& ac : cases)
      for (int fp64 = 0; fp64 <= (strict ? 0 : 1); ++fp64) {
        Case c{ac.tp, ac.dp, ac.zero, 1, ac.sp, fp64 == 1};
        c.cp = ac.cp;
        c.cp_comm = ac.group ? "alltoall+ring" : "alltoall";
        c.cp_alltoall = ac.group;
        c.pp = ac.pp;
        cp_case(cfg16, c, ac.tp == 1 && ac.dp == 1 && ac.pp == 1 && !fp64, "");
      }
    // The heads' exchange must put every row back where it came from: a CP all-to-all that delivers each
    // block one rank off, and a contiguous token split attended with zigzag positions, both fail.
    if (world >= 4 && !strict) {
      for (const char* mode : {"alltoall", "alltoall+ring"}) {
        Case c{1, 1, 0, 1, false, false};
        c.cp = std::string(mode) == "alltoall" ? 2 : 4;
        c.cp_comm = mode;
        c.cp_alltoall = std::string(mode) == "alltoall" ? 0 : 2;
        const Run rotated = run_cfg(cfg16, c, Fault::rotate_cp_all_to_all);
        const Run split = run_cfg(cfg16, c, Fault::contiguous_cp_split);
        if (rank == 0) {
          rep.check("NEGATIVE " + c.str() + ", all-to-all blocks one rank off", compare(rotated, reference_of(cfg16, 1, false)),
                    false, kFp32, true);
          rep.check("NEGATIVE " + c.str() + ", contiguous tokens with zigzag positions",
                    compare(split, reference_of(cfg16, 1, false)), false, kFp32, true);
        }
      }
    }
    return finish();
  }

  if (!only_blend) {

  // model.router_aux = "hf" (HF Mixtral's loss, statistics pooled over the layers of each micro-batch, a
  // micro-batch being mbs sequences of one data-parallel rank, all their tokens over the CP shards): every
  // layout against the single process, as the meshrun convention below (bit-exact where that one is, with
  // the same reasons), several micro-batches per rank (each its own pool), TP with SP, CP; pp > 1 is refused.
  // Negative: the "hf" run against the meshrun-convention reference differs. `router-aux-hf` runs only this.
  {
    JobConfig hf = cfg;
    hf.model.experts = 4;
    hf.model.top_k = 2;
    hf.model.moe_ffn_hidden = 32;
    hf.model.router_aux = "hf";
    hf.model.router_aux_loss_coef = 0.05;  // large, so the aux gradient shows in the parameters
    JobConfig hf16 = hf;
    hf16.training.seq_len = 16;
    struct HfCase {
      int dp, ep, tp, cp, zero, mbs;
      bool sp;
    };
    const HfCase hfs[] = {{2, 2, 1, 1, 0, B / 2, false}, {4, 4, 1, 1, 1, B / 4, false}, {2, 2, 1, 1, 0, B / 4, false},
                          {4, 2, 1, 1, 3, B / 4, false}, {2, 2, 2, 1, 1, B / 2, true},  {2, 2, 1, 2, 0, B / 2, false}};
    for (const HfCase& hc : hfs)
      for (int fp64 = 0; fp64 <= 1; ++fp64) {
        if (strict && &hc != &hfs[0]) continue;
        const bool exact = hc.tp == 1 && hc.cp == 1 && hc.dp == hc.ep && hc.mbs * hc.dp == B;
        if ((fp64 && exact) || (fp64 && strict)) continue;
        Case c{hc.tp, hc.dp, hc.zero, hc.mbs, hc.sp, fp64 == 1};
        c.ep = hc.ep;
        c.cp = hc.cp;
        const JobConfig& jc = hc.cp > 1 ? hf16 : hf;
        if (c.ranks() > world) continue;
        const Run r = run_cfg(jc, c);
        if (rank == 0) rep.check("router_aux hf " + c.str() + " vs 1 process", compare(r, reference_of(jc, hc.mbs, fp64 == 1)), exact,
                                 fp64 ? kFp64 : kFp32);
      }
    Case c{1, 2, 0, B / 2, false, false};
    c.ep = 2;
    const Run r = strict ? Run{} : run_cfg(hf, c);
    JobConfig meshrun_aux = hf;
    meshrun_aux.model.router_aux = "meshrun";
    if (rank == 0 && !strict)
      rep.check("NEGATIVE router_aux hf dp=2 ep=2 vs the meshrun convention's 1 process", compare(r, reference_of(meshrun_aux, B / 2, false)),
                false, kFp32, true);
    if (argc > 1 && std::string(argv[1]) == "router-aux-hf") return finish();
  }

  // Clipping must actually happen in the reference run, or the global-norm path is not being compared.
  if (rank == 0) {
    const Run& ref = reference(B, false);
    const int clipped = int(std::count_if(ref.grad_norms.begin(), ref.grad_norms.end(),
                                          [&](double n) { return n > cfg.training.grad_clip; }));
    ++rep.checks;
    if (clipped == 0) ++rep.failures;
    std::printf("%-4s gradient clipping active in %d of %d reference steps (clip %.2f)\n", clipped ? "ok" : "FAIL",
                clipped, cfg.training.steps, cfg.training.grad_clip);
  }

  struct Shape { int tp, dp; };
  const Shape shapes[] = {{1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {2, 4}, {4, 1}, {4, 2}};
  for (const Shape& sh : shapes) {
    if (sh.tp * sh.dp > world) {
      if (rank == 0) std::printf("skip tp=%d dp=%d: needs %d ranks, have %d\n", sh.tp, sh.dp, sh.tp * sh.dp, world);
      continue;
    }
    if (strict && !((sh.tp == 1 && sh.dp == 2) || (sh.tp == 2 && sh.dp == 2))) continue;
    // One micro-batch per rank (B/dp sequences), and for dp = 2 also gradient accumulation (mbs = 1).
    std::vector<int> mbss{B / sh.dp};
    if (sh.dp == 2) mbss.push_back(1);
    for (int mbs : mbss) {
      if (strict && (sh.tp == 1) != (mbs == 1)) continue;  // strict: tp2 x dp2 one micro-batch, dp2 accumulating
      const bool one_micro_batch = mbs * sh.dp == B;
      const bool exact_vs_serial = sh.tp == 1 && one_micro_batch;
      for (int sp = 0; sp <= (sh.tp > 1 ? 1 : 0); ++sp) {
        if (strict && sh.tp > 1 && sp == 0) continue;
        // fp64 only where fp32 cannot be bit-exact, to show the difference is rounding alone.
        for (int fp64 = 0; fp64 <= (exact_vs_serial ? 0 : 1); ++fp64) {
          if (strict && fp64 && !(sh.tp == 2 && sh.dp == 2 && mbs == B / 2 && sp == 1)) continue;
          const Tol& tol = fp64 ? kFp64 : kFp32;
          Run zero0;
          std::vector<std::int64_t> mem, tr;
          for (int z = 0; z <= 3; ++z) {
            const Case c{sh.tp, sh.dp, z, mbs, sp == 1, fp64 == 1};
            const Run r = run_on(c);
            if (rank != 0) continue;
            rep.check(c.str() + " vs 1 process", compare(r, reference(mbs, fp64)), exact_vs_serial, tol);
            if (z == 0) zero0 = r;
            else rep.check(c.str() + " vs zero=0", compare(r, zero0), z == 1 || one_micro_batch, tol);
            mem.push_back(r.memory);
            tr.push_back(r.transient);
          }
          if (rank == 0 && sh.dp > 1) {
            const bool drops = mem[0] > mem[1] && mem[1] > mem[2] && mem[2] > mem[3];
            ++rep.checks;
            if (!drops) ++rep.failures;
            std::printf("%-4s memory per rank, ZeRO 0 > 1 > 2 > 3 (tp=%d dp=%d): %lld > %lld > %lld > %lld bytes\n",
                        drops ? "ok" : "FAIL", sh.tp, sh.dp, (long long)mem[0], (long long)mem[1], (long long)mem[2],
                        (long long)mem[3]);
            // The overlap's price (zero.hpp): one unit-sized gradient scratch at ZeRO 0-1, two at 2-3, and
            // at 3 up to two gathered units (the one computing and the one prefetched).
            const bool bounded = tr[1] == tr[0] && tr[2] == 2 * tr[0] && tr[3] > tr[2] && tr[3] <= 4 * tr[0];
            ++rep.checks;
            if (!bounded) ++rep.failures;
            std::printf("%-4s transient peak per rank, ZeRO 0..3 (tp=%d dp=%d): %lld, %lld, %lld, %lld bytes "
                        "(s, s, 2s, (2s, 4s])\n",
                        bounded ? "ok" : "FAIL", sh.tp, sh.dp, (long long)tr[0], (long long)tr[1], (long long)tr[2],
                        (long long)tr[3]);
          }
        }
      }
    }
  }

  // Another rank order places the same groups on other ranks: identical numbers.
  if (world >= 4) {
    Case c{2, 2, 1, B / 2, true, false};
    const Run base = run_on(c);
    c.order = "dp-tp-cp-ep-pp";
    const Run other = run_on(c);
    if (rank == 0) rep.check(c.str() + " order dp-tp-cp-ep-pp vs tp-cp-ep-dp-pp", compare(other, base), true, kFp32);
  }

  // Negative tests: the same checks must catch a broken layout.
  if (world >= 2 && !strict) {
    const Run skipped = run_on(Case{2, 1, 0, B, false, false}, Fault::skip_tp_all_reduce);
    if (rank == 0)
      rep.check("NEGATIVE tp=2, row-parallel all-reduce skipped", compare(skipped, reference(B, false)), false, kFp32, true);
    const Run rotated = run_on(Case{1, 2, 1, B / 2, false, false}, Fault::rotate_dp_all_gather);
    if (rank == 0) {
      rep.check("NEGATIVE dp=2 zero=1, shards gathered to the wrong place", compare(rotated, reference(B / 2, false)),
                true, kFp32, true);
      rep.check("NEGATIVE same wrong shard, judged by tolerance", compare(rotated, reference(B / 2, false)), false,
                kFp32, true);
    }
  }

  // Pipeline parallelism, on 8 layers (pp = 4 with V = 2 is one layer per chunk), 8 micro-batches of one
  // sequence per data-parallel rank. Which comparison holds, and why:
  //  * BIT-EXACT against the same layout without a pipeline (pp = 1), for every schedule: a pipeline only
  //    moves where and when each unit's F, B and W run. Every generated table runs each chunk's B and W in
  //    ascending micro-batch order, so each unit accumulates ((g_0 + g_1) + g_2) + ... as with pp = 1;
  //    the loss is summed over micro-batches in order on the last stage; the gradient norm sums per unit
  //    and adds the other stages' units as exact zeros; fused BW and split B, W are the same operations.
  //  * Hence BIT-EXACT against the single process when tp = dp = 1, and otherwise within the bounds above
  //    (the reasons are those of the tp/dp layouts, not the pipeline's).
  JobConfig cfg8 = cfg;
  cfg8.model.layers = 8;
  struct PipeCase {
    int pp, tp, dp, zero;
    bool sp;
    const char* schedule;
    int virtual_stages;
  };
  const PipeCase pipes[] = {
      {2, 1, 1, 0, false, "gpipe", 1}, {2, 1, 1, 0, false, "1f1b", 1}, {2, 1, 1, 0, false, "interleaved", 2},
      {2, 1, 1, 0, false, "zb", 1},    {4, 1, 1, 0, false, "gpipe", 1}, {4, 1, 1, 0, false, "1f1b", 1},
      {4, 1, 1, 0, false, "interleaved", 2}, {4, 1, 1, 0, false, "zb", 1},
      {2, 2, 1, 0, false, "zb", 1},    {2, 1, 2, 1, false, "1f1b", 1}, {2, 1, 2, 3, false, "zb", 1},
      {2, 2, 1, 0, true, "interleaved", 2}, {2, 2, 2, 1, false, "1f1b", 1}, {2, 2, 2, 3, true, "zb", 1},
      // V schedules (two chunks per rank; virtual_stages 1 and 2 both mean two): pp2, pp2 × dp2, pp4.
      {2, 1, 1, 0, false, "zbv", 1},   {2, 1, 1, 0, false, "dualpipev", 2}, {4, 1, 1, 0, false, "zbv", 2},
      {4, 1, 1, 0, false, "dualpipev", 1}, {2, 1, 2, 3, false, "zbv", 1}, {2, 1, 2, 1, false, "dualpipev", 1},
      {2, 2, 1, 0, true, "dualpipev", 1},
  };
  std::map<std::string, Run> flat;  // the same layouts with pp = 1, by Case::str()
  // gpipe, interleaved, zb, zb tp, 1f1b dp, zb tp dp z3 sp, zbv, dualpipev pp4, zbv dp z3
  const std::vector<int> strict_pipes{0, 2, 3, 8, 9, 13, 14, 17, 18};
  for (const PipeCase& pc : pipes) {
    if (strict && std::find(strict_pipes.begin(), strict_pipes.end(), int(&pc - pipes)) == strict_pipes.end()) continue;
    for (int fp64 = 0; fp64 <= 1; ++fp64) {
      const bool exact_vs_serial = pc.tp == 1 && pc.dp == 1;
      if (fp64 && exact_vs_serial) continue;  // fp64 only where fp32 cannot be bit-exact
      if (fp64 && strict) continue;
      Case c{pc.tp, pc.dp, pc.zero, 1, pc.sp, fp64 == 1};
      if (c.ranks() * pc.pp > world) {
        if (rank == 0) std::printf("skip %s pp=%d: needs %d ranks, have %d\n", c.str().c_str(), pc.pp, c.ranks() * pc.pp, world);
        continue;
      }
      if (!flat.count(c.str())) flat[c.str()] = run_cfg(cfg8, c);
      Case p = c;
      p.pp = pc.pp;
      p.schedule = pc.schedule;
      p.virtual_stages = pc.virtual_stages;
      const Run r = run_cfg(cfg8, p);
      if (rank != 0) continue;
      const Tol& tol = fp64 ? kFp64 : kFp32;
      rep.check(p.str() + " vs pp=1", compare(r, flat[c.str()]), true, tol);
      rep.check(p.str() + " vs 1 process", compare(r, reference_of(cfg8, 1, fp64 == 1)), exact_vs_serial, tol);
    }
  }
  // Negative: the second stage skips its first decoder layer; both the exact and the tolerance check fail.
  if (world >= 2 && !strict) {
    Case c{1, 1, 0, 1, false, false};
    c.pp = 2;
    const Run skipped = run_cfg(cfg8, c, Fault::stage_skips_layer);
    if (rank == 0) {
      rep.check("NEGATIVE pp=2, stage 1 skips a layer", compare(skipped, reference_of(cfg8, 1, false)), true, kFp32, true);
      rep.check("NEGATIVE same skipped layer, judged by tolerance", compare(skipped, reference_of(cfg8, 1, false)),
                false, kFp32, true);
    }
  }

  // Context parallelism, on 16-token sequences (cp = 4: 8 zigzag chunks of 2 tokens). The CP ranks attend
  // their queries block by block and merge partial results through the log-sum-exp, a different summation
  // order from the single process's one pass over all keys, so every comparison is within the bounds (fp32
  // 1e-6, fp64 1e-12), none bit-exact. Ring and all-gather compute the same blocks in the same merge order,
  // so their step-1 losses (forward only) are identical bits; their dK/dV sums differ in order.
  JobConfig cfg16 = cfg;
  cfg16.training.seq_len = 16;
  struct CpCase {
    int cp, tp, dp, zero, pp;
    bool sp;
  };
  const CpCase cps[] = {{2, 1, 1, 0, 1, false}, {4, 1, 1, 0, 1, false}, {2, 2, 1, 0, 1, false}, {2, 2, 1, 0, 1, true},
                        {4, 2, 1, 0, 1, true},  {2, 1, 2, 1, 1, false}, {2, 1, 2, 3, 1, false}, {2, 1, 1, 0, 2, false},
                        {2, 2, 2, 1, 1, true},  {2, 2, 1, 0, 2, false}};
  const std::vector<int> strict_cps{0, 3, 6, 7};  // cp2; tp2 sp; dp2 zero3; pp2
  for (const CpCase& cc : cps)
    for (const char* mode : {"ring", "allgather"})
      for (int fp64 = 0; fp64 <= (strict ? 0 : 1); ++fp64) {
        if (strict && std::find(strict_cps.begin(), strict_cps.end(), int(&cc - cps)) == strict_cps.end()) continue;
        Case c{cc.tp, cc.dp, cc.zero, 1, cc.sp, fp64 == 1};
        c.cp = cc.cp;
        c.cp_comm = mode;
        c.pp = cc.pp;
        const auto naive = causal_pairs_per_rank(16, cc.cp, false);
        char note[96];
        std::snprintf(note, sizeof note, " with zigzag; a contiguous split would give max/min = %.1f",
                      double(*std::max_element(naive.begin(), naive.end())) / double(*std::min_element(naive.begin(), naive.end())));
        cp_case(cfg16, c, cc.tp == 1 && cc.dp == 1 && cc.pp == 1 && !fp64, note);
      }
  // Ring and all-gather: identical forward, so identical step-1 loss bits.
  if (world >= 4 && !strict) {
    Case a{1, 1, 0, 1, false, false};
    a.cp = 4;
    Case b = a;
    b.cp_comm = "allgather";
    const Run ra = run_cfg(cfg16, a), rb = run_cfg(cfg16, b);
    if (rank == 0) {
      const bool same = std::memcmp(&ra.losses[0], &rb.losses[0], sizeof(double)) == 0;
      ++rep.checks;
      if (!same) ++rep.failures;
      std::printf("%-4s cp=4 ring and allgather give the same step-1 loss bits (%.17g)\n", same ? "ok" : "FAIL", ra.losses[0]);
    }
  }
  // Saved activations per rank drop as 1/cp (every saved tensor is per row), from the trainer's accounting.
  if (world >= 4 && !strict) {
    std::vector<std::int64_t> saved;
    for (int cpn : {1, 2, 4})
      for (const char* mode : {"ring", "allgather"}) {
        Case c{1, 1, 0, 1, false, false};
        c.cp = cpn;
        c.cp_comm = mode;
        const Run r = run_cfg(cfg16, c);
        if (rank == 0) saved.push_back(r.saved_activations);
      }
    if (rank == 0) {
      const bool ok = saved[2] * 2 == saved[0] && saved[4] * 4 == saved[0] && saved[3] == saved[2] && saved[5] == saved[4];
      ++rep.checks;
      if (!ok) ++rep.failures;
      std::printf("%-4s saved activations per rank, cp = 1, 2, 4 (ring; allgather): %lld, %lld, %lld; %lld, %lld bytes\n",
                  ok ? "ok" : "FAIL", (long long)saved[0], (long long)saved[2], (long long)saved[4], (long long)saved[3],
                  (long long)saved[5]);
    }
  }
  // Negative: a contiguous token split attended with zigzag positions, and a ring that loses a K/V block.
  if (world >= 2 && !strict) {
    Case c{1, 1, 0, 1, false, false};
    c.cp = 2;
    const Run split = run_cfg(cfg16, c, Fault::contiguous_cp_split);
    const Run dropped = run_cfg(cfg16, c, Fault::ring_drops_block);
    if (rank == 0) {
      rep.check("NEGATIVE cp=2, contiguous tokens with zigzag positions", compare(split, reference_of(cfg16, 1, false)),
                false, kFp32, true);
      rep.check("NEGATIVE cp=2 ring, one K/V block lost", compare(dropped, reference_of(cfg16, 1, false)), false, kFp32, true);
    }
  }

  // Mixture of experts with expert parallelism (4 experts, top-2, expert width 32; mesh folds ep into the
  // dp·cp ranks). Which comparison holds, and why:
  //  * BIT-EXACT vs the single process when tp = pp = cp = 1, one micro-batch per data-parallel rank and
  //    edp = dp/ep = 1: routing is row-wise (same bits), the experts run the same per-row products on
  //    row segments (the GEMM sums each element over the contracted index in order, whatever the rows),
  //    the combine adds k in order, and an expert's gradient is the sum of its per-source segments, each
  //    into a zeroed buffer, in source (= micro-batch) order: ((0 + g_0) + g_1) + … as the single process
  //    accumulates micro-batches. ZeRO-1/3 only move the reduction (edp = 1: no expert reduction at all).
  //  * Otherwise within 1e-6 (fp32) / 1e-12 (fp64): edp > 1 reduces expert gradients as (g_0 + g_1) +
  //    (g_2 + g_3); several micro-batches per rank regroup per-source sums; tp splits the experts' inner
  //    products; cp sums the router statistics per shard; plus the dense reasons above.
  // The aux loss of every step is compared with the loss; the dropless proof zeroes the router so every
  // token ties and goes to experts 0 and 1 (both on EP rank 0) and must still match.
  JobConfig cfgm = cfg;
  cfgm.model.experts = 4;
  cfgm.model.top_k = 2;
  cfgm.model.moe_ffn_hidden = 32;
  JobConfig cfgm16 = cfgm;
  cfgm16.training.seq_len = 16;
  struct MoeCase {
    int dp, ep, tp, pp, cp, zero;
    bool sp, skew;
    const char* schedule = "1f1b";
  };
  const MoeCase moes[] = {{2, 2, 1, 1, 1, 0, false, false}, {4, 2, 1, 1, 1, 0, false, false}, {4, 4, 1, 1, 1, 0, false, false},
                          {2, 2, 1, 1, 1, 1, false, false}, {2, 2, 1, 1, 1, 3, false, false}, {4, 2, 1, 1, 1, 3, false, false},
                          {2, 2, 2, 1, 1, 0, false, false}, {2, 2, 2, 1, 1, 1, true, false},  {2, 2, 1, 2, 1, 0, false, false},
                          {2, 2, 1, 2, 1, 3, false, false, "zb"}, {2, 2, 1, 1, 2, 0, false, false},
                          {2, 2, 1, 1, 1, 0, false, true}};
  const std::vector<int> strict_moes{0, 5, 7, 9, 10, 11};  // ep=dp; edp2 zero3; tp sp; pp zb zero3; cp; skewed
  for (const MoeCase& mc : moes)
    for (int fp64 = 0; fp64 <= 1; ++fp64) {
      if (strict && std::find(strict_moes.begin(), strict_moes.end(), int(&mc - moes)) == strict_moes.end()) continue;
      const bool exact = mc.tp == 1 && mc.pp == 1 && mc.cp == 1 && mc.dp == mc.ep;
      if ((fp64 && exact) || (fp64 && strict)) continue;  // fp64 only where fp32 cannot be bit-exact
      const int mbs = mc.pp > 1 ? 1 : B / mc.dp;
      Case c{mc.tp, mc.dp, mc.zero, mbs, mc.sp, fp64 == 1};
      c.ep = mc.ep;
      c.pp = mc.pp;
      c.cp = mc.cp;
      c.skew_router = mc.skew;
      c.schedule = mc.schedule;
      const JobConfig& jc = mc.cp > 1 ? cfgm16 : cfgm;
      if (c.ranks() > world) continue;
      const Run r = run_cfg(jc, c);
      if (rank != 0) continue;
      const Run& ref = reference_of(jc, mbs, fp64 == 1, mc.skew);
      rep.check(c.str() + " vs 1 process", compare(r, ref), exact, fp64 ? kFp64 : kFp32);
      if (mc.skew && !fp64) {
        // Every token on experts 0 and 1 in step 1 (B·S assignments each), none dropped (the mean is
        // B·S·k/E), the same counts as the single process.
        const double tokens = double(B) * jc.training.seq_len;
        const bool ok = r.tokens_max1 == tokens && r.tokens_mean1 == tokens * 2 / 4 && ref.tokens_max1 == tokens &&
                        ref.tokens_mean1 == r.tokens_mean1 && r.a2a_bytes1 > 0;
        ++rep.checks;
        if (!ok) ++rep.failures;
        std::printf("%-4s skewed router, step 1: max %.0f (all %.0f tokens on one expert), mean %.0f assignments per "
                    "expert and layer, rank 0 sent %lld a2a bytes\n", ok ? "ok" : "FAIL", r.tokens_max1, tokens,
                    r.tokens_mean1, (long long)r.a2a_bytes1);
      }
    }
  // Negative: one routed token dropped, and one token sent to the wrong EP rank's expert, each detected.
  if (world >= 2 && !strict) {
    Case c{1, 2, 0, B / 2, false, false};
    c.ep = 2;
    const Run dropped = run_cfg(cfgm, c, Fault::moe_drop_token);
    const Run misrouted = run_cfg(cfgm, c, Fault::moe_wrong_rank);
    if (rank == 0) {
      rep.check("NEGATIVE dp=2 ep=2, one routed token dropped", compare(dropped, reference_of(cfgm, B / 2, false)), false,
                kFp32, true);
      rep.check("NEGATIVE dp=2 ep=2, a token sent to the wrong expert rank", compare(misrouted, reference_of(cfgm, B / 2, false)),
                false, kFp32, true);
    }
  }

  }  // !only_blend

  // A blend of two Megatron indexed datasets (weights 0.6 / 0.4, data.shuffle) with validation on a third every
  // 2 steps (2 batches each), on four layouts against the single process with the same micro-batch size. The
  // comparisons are those of the sections above (bit-exact with tp = 1 and one micro-batch per rank or a pure
  // pipeline; tp = 2 within the fp32 bound), now also for every validation loss: evaluation runs the step's
  // forward and sums its loss in the step's order. And evaluation must not change training: the same layout
  // without data.valid trains to the same bits.
  {
    long pid = ::getpid();  // rank 0's: every rank names the same files
    MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    const std::string base = dir + "/blend-" + std::to_string(pid);
    if (rank == 0) {
      make_indexed(base + "-web", 0, 6000, cfg.model.vocab);
      make_indexed(base + "-code", 6000, 6000, cfg.model.vocab);
      make_indexed(base + "-valid", 12000, 3000, cfg.model.vocab);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    JobConfig cfgb = cfg;
    cfgb.data.path.clear();
    cfgb.data.blend = {{0.6, base + "-web"}, {0.4, base + "-code.bin"}};
    cfgb.data.valid = {{1.0, base + "-valid"}};
    cfgb.training.eval_interval = 2;
    cfgb.training.eval_batches = 2;
    struct BlendCase {
      int tp, dp, pp, zero;
      bool sp;
      const char* schedule;
    };
    const BlendCase blends[] = {{1, 2, 1, 1, false, "1f1b"}, {2, 2, 1, 0, true, "1f1b"}, {1, 1, 2, 0, false, "zb"},
                                {2, 2, 2, 1, false, "1f1b"}};
    std::map<int, Run> refs;  // by micro-batch size
    for (const BlendCase& bc : blends) {
      Case c{bc.tp, bc.dp, bc.zero, bc.pp > 1 ? 1 : B / bc.dp, bc.sp, false};
      c.pp = bc.pp;
      c.schedule = bc.schedule;
      if (c.ranks() > world) continue;
      if (rank == 0 && !refs.count(c.mbs)) refs[c.mbs] = train_run<float>(cfgb, Case{1, 1, 0, c.mbs, false, false}, MPI_COMM_NULL);
      const Run r = run_cfg(cfgb, c);
      if (rank != 0) continue;
      const Run& ref = refs[c.mbs];
      const bool exact = bc.tp == 1 && (bc.pp > 1 || c.mbs * bc.dp == B);
      rep.check("blend " + c.str() + " vs 1 process", compare(r, ref), exact, kFp32);
      ++rep.checks;
      const bool evaluated = r.eval_losses.size() == 5 && ref.eval_losses.size() == 5 && ref.eval_losses[4] < ref.eval_losses[0];
      if (!evaluated) ++rep.failures;
      std::printf("%-4s blend %s: 5 validation losses, falling (%.6f ... %.6f; 1 process %.6f ... %.6f)\n",
                  evaluated ? "ok" : "FAIL", c.str().c_str(), r.eval_losses.empty() ? 0.0 : r.eval_losses.front(),
                  r.eval_losses.empty() ? 0.0 : r.eval_losses.back(), ref.eval_losses.empty() ? 0.0 : ref.eval_losses.front(),
                  ref.eval_losses.empty() ? 0.0 : ref.eval_losses.back());
    }
    // Training with and without evaluation: the same bits (losses, step-1 gradients, final parameters).
    if (world >= 4) {
      JobConfig no_eval = cfgb;
      no_eval.data.valid.clear();
      const Case c{2, 2, 1, B / 2, false, false};
      const Run with = run_cfg(cfgb, c);
      Run without = run_cfg(no_eval, c);
      if (rank == 0) {
        without.eval_losses = with.eval_losses;  // compared: everything else
        rep.check("blend " + c.str() + " trained with and without evaluation", compare(without, with), true, kFp32);
      }
    }
    // Negative: a pipeline stage that skips a layer changes the validation losses, and the check sees it.
    if (world >= 2) {
      Case c{1, 1, 0, 1, false, false};
      c.pp = 2;
      const Run skipped = run_cfg(cfgb, c, Fault::stage_skips_layer);
      if (rank == 0)
        rep.check("NEGATIVE blend pp=2, stage 1 skips a layer: validation losses", compare_eval(skipped, refs[1]), false,
                  kFp32, true);
    }
    // Negative: another blend (weights swapped) is another sample sequence: the losses differ.
    if (world >= 2) {
      JobConfig swapped = cfgb;
      swapped.data.blend = {{0.4, base + "-web"}, {0.6, base + "-code.bin"}};
      const Run other = run_cfg(swapped, Case{1, 2, 1, B / 2, false, false});
      if (rank == 0)
        rep.check("NEGATIVE blend weights swapped vs the 0.6/0.4 blend", compare(other, refs[B / 2]), false, kFp32, true);
    }
    if (rank == 0)
      for (const char* part : {"-web", "-code", "-valid"})
        for (const char* ext : {".bin", ".idx"}) std::filesystem::remove(base + part + ext);
  }

  return finish();
}
