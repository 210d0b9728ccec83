// Parameter, gradient and optimizer-state storage of one rank, for ZeRO stages 0-3. A rank holds only
// the units of its pipeline stages; each unit is reduced and sharded over its own replica group (dense
// units: the dp_cp group, since context-parallel ranks share weights too; expert units will use the
// expert-data-parallel group).
//
// Every held unit's flat buffer is padded to a multiple of its group's size N; rank r owns elements
// [r·s, (r+1)·s), s = padded/N.
//   stage 0: full params, full grads, full Adam m/v; grads all-reduced.
//   stage 1: full params, full grads, m/v of the shard; grads reduce-scattered, shard updated, params
//            all-gathered.
//   stage 2: as 1, but gradients live only as shards: each micro-batch's unit gradient is
//            reduce-scattered as soon as the unit's backward is done (one unit-sized scratch).
//   stage 3: as 2, and parameters live only as shards: a unit is all-gathered for its forward and again
//            for its backward, and freed after use.
// With one micro-batch per rank all four stages compute identical bits (same fixed-order sums).
//
// Communication runs under compute on the non-blocking collectives of Comm, without changing any sum:
//   stages 2-3: a unit's reduce-scatter is posted when its backward is done and completed when its
//            scratch buffer comes round again (two alternate) or at reduce_grads; the shard is added to
//            the accumulated gradient then, oldest first, so in micro-batch order as before.
//   stages 0-1: a unit's reduce-scatter is posted after its last micro-batch's backward (zero_grads
//            says how many there are), stage 0's all-gather follows in reduce_grads.
//   stage 3:  prefetch(u) posts the all-gather of the unit computed next while this one computes.
//   stages 1-2: adam_step posts each unit's all-gather after its update and waits for them at the end.
// Every buffer is the backend's (parameters in Precision::param, gradients in ::grad, Adam moments and,
// where the kernels' weights are narrower, master weights in ::optim; the master is sharded like the
// moments), and every operation on them is a backend call or a collective: nothing here reads tensor
// memory from the host except the explicit host copies for initialization, checkpoints and tests.
// Open MPI moves non-blocking collectives only inside MPI calls, so the store tests its pending requests
// at every unit boundary. comm_exposed_ms is the wall time this store spent blocked on data-parallel
// communication: waiting for those requests plus the collectives that still block (stage 0's gradient
// all-gather). It does not include TP/CP/PP traffic.
#pragma once
#include <cstdint>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/kernels/cpu.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/model/params.hpp"

namespace meshrun::train {

struct MemoryReport {  // bytes held by this rank
  std::int64_t params = 0, grads = 0, optimizer = 0;
  std::int64_t transient_peak = 0;  // gradient scratch + gathered units (ZeRO-3), at their peak
  std::int64_t total() const { return params + grads + optimizer + transient_peak; }
};

class ParamStore {
 public:
  // groups[u]: the replica group of unit u, or nullptr where this rank does not hold the unit.
  ParamStore(const ParamTable& table, int zero_stage, std::vector<Comm*> groups, device::Backend& be);
  // Every unit, one group (a single pipeline stage).
  ParamStore(const ParamTable& table, int zero_stage, Comm& dp, device::Backend& be);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  int stage() const { return stage_; }
  bool holds(int u) const { return groups_[u] != nullptr; }
  Comm& group(int u) const { return *groups_[u]; }
  const ParamTable& table() const { return table_; }
  device::Backend& backend() const { return be_; }

  // Full local parameters of unit u for compute (param dtype; ZeRO-3 gathers them, release frees them).
  Buf acquire(int u);
  void release(int u);
  // ZeRO-3: starts gathering unit u (the next one to be acquired) so it arrives during the current
  // unit's compute; a no-op at other stages, for units not held or already gathered.
  void prefetch(int u);

  // Gradients of one micro-batch: grad_begin returns a zeroed unit-sized buffer (grad dtype), grad_end
  // folds it into the accumulated gradient (stages 2-3: reduce-scatter first).
  Buf grad_begin(int u);
  void grad_end(int u);

  // Starts a step; microbatches = grad_end calls each unit gets in it (0: unknown, no early reduction).
  void zero_grads(int microbatches = 0);
  // After the last micro-batch: completes each held unit's reduction (stage 0 all-reduce, 1 reduce-scatter).
  void reduce_grads();
  // Σ g² over this rank's shard of unit u, tensors with include[t] only, in tensor order (double).
  double grad_sumsq(int u, const std::vector<bool>& include) const;
  // AdamW on this rank's shard (stage 0: everything); weight decay only on matrices. Then stages 1-2
  // all-gather the parameters.
  void adam_step(kernels::cpu::AdamW hp);

  // Host copies, for initialization, checkpoints and tests (T: float or double). The parameters are
  // the optimizer's (the master copy where there is one).
  // Whole unit (collective over the unit's group at stage 3, and wherever the master is sharded).
  template <class T> std::vector<T> read_unit(int u);
  template <class T> void write_unit(int u, const T* full);
  // This rank's reduced gradient of its shard region (index 0 = element shard_begin(u) of the unit).
  template <class T> std::vector<T> read_grad_shard(int u) const;
  std::int64_t shard_len(int u) const { return shard_[u]; }
  // Checkpoints: this rank's ZeRO shard region [shard_begin(u), shard_begin(u) + shard_len(u)) of unit u's
  // parameters and Adam moments (at stage 0 too, so every element is written once per TP block).
  enum class Region { params, exp_avg, exp_avg_sq };
  template <class T> void read_region(int u, Region r, T* out) const;
  // Restores unit u from full local buffers (the unit's unpadded size): parameters as write_unit, the
  // moments as this rank holds them (stage 0 whole, else its shard). No communication.
  // A null pointer leaves that part as it is (loaded in place through state_in_place).
  template <class T> void write_state(int u, const T* params, const T* exp_avg, const T* exp_avg_sq);
  // Where part r of unit u lives whole, unpadded at its start, as T in host memory (a host-addressable
  // backend, stage 0 for the moments, stages 0-2 for the parameters, no master copy): its address, so a
  // checkpoint load reads into it directly; nullptr where the load must stage and call write_state.
  template <class T> T* state_in_place(int u, Region r);
  std::int64_t shard_begin(int u) const { return static_cast<std::int64_t>(groups_[u]->rank()) * shard_[u]; }

  MemoryReport memory() const;
  // Milliseconds blocked on data-parallel communication since the last call (see above); resets.
  double take_comm_exposed_ms();

 private:
  void track(std::int64_t delta_bytes);
  void poll();
  void finish_scatter(int b);  // completes scratch buffer b's reduce-scatter and accumulates its shard
  template <class F>
  void blocked(F&& f);  // runs f, counting its time as exposed communication
  void require_held(int u) const;
  Buf grad_shard(int u) const;
  Buf optim_params(int u) const;  // what AdamW updates: the master, or the parameters themselves
  template <class T> void upload_padded(Buf dst, const T* full, std::int64_t lo, std::int64_t n) const;

  const ParamTable& table_;
  int stage_;
  std::vector<Comm*> groups_;
  device::Backend& be_;
  device::Precision prec_;
  std::vector<std::int64_t> padded_, shard_;
  std::vector<Buf> params_;     // per held unit: full (stage <3) or shard (stage 3); empty if not held
  std::vector<Buf> master_;     // where param is narrower than optim: full (stage 0) or shard
  std::vector<Buf> gathered_;   // stage 3: gathered units while acquired
  std::vector<Buf> grads_;      // per unit: full (stage <2) or shard (stage >=2)
  std::vector<Buf> m_, v_;      // Adam moments: full (stage 0) or shard
  Buf scratch_[2];              // one micro-batch's gradient of one unit (stages 2-3: two, alternating)
  int cur_ = 0;                 // the scratch buffer in use
  Request scatter_[2];          // stages 2-3: each scratch buffer's reduce-scatter in flight
  int scatter_unit_[2] = {-1, -1};
  std::vector<Request> unit_reduce_;  // stages 0-1: the unit's gradient reduce-scatter
  std::vector<bool> reduce_posted_;
  std::vector<int> grad_ends_;        // grad_end calls of the unit in this step
  int microbatches_ = 0;
  std::vector<Request> gathers_;      // stage 3: the unit's all-gather into gathered_
  double exposed_ms_ = 0;
  std::int64_t transient_ = 0, transient_peak_ = 0;
};

}  // namespace meshrun::train
