#include "meshrun/train/parallel/zero.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;

ParamStore::ParamStore(const ParamTable& table, int zero_stage, Comm& dp, device::Backend& be)
    : ParamStore(table, zero_stage, std::vector<Comm*>(table.units.size(), &dp), be) {}

ParamStore::ParamStore(const ParamTable& table, int zero_stage, std::vector<Comm*> groups, device::Backend& be)
    : table_(table), stage_(zero_stage), groups_(std::move(groups)), be_(be), prec_(be.precision()) {
  if (zero_stage < 0 || zero_stage > 3) throw std::invalid_argument("parallel.zero_stage must be 0, 1, 2 or 3");
  const std::size_t nu = table.units.size();
  if (groups_.size() != nu) throw std::invalid_argument("ParamStore: one group (or nullptr) per unit");
  padded_.resize(nu);
  shard_.resize(nu);
  params_.resize(nu);
  master_.resize(nu);
  gathered_.resize(nu);
  grads_.resize(nu);
  m_.resize(nu);
  v_.resize(nu);
  unit_reduce_.resize(nu);
  reduce_posted_.assign(nu, false);
  grad_ends_.assign(nu, 0);
  gathers_.resize(nu);
  auto zeroed = [&](std::int64_t n, DType t) {
    Buf b = be_.alloc(n, t);
    be_.zero(b);
    return b;
  };
  std::int64_t max_padded = 0;
  for (std::size_t u = 0; u < nu; ++u) {
    if (!groups_[u]) continue;  // another pipeline stage's unit: no memory here
    const int nranks = groups_[u]->size();
    shard_[u] = (table.units[u].size + nranks - 1) / nranks;
    padded_[u] = shard_[u] * nranks;
    max_padded = std::max(max_padded, padded_[u]);
    const std::int64_t optim_len = stage_ == 0 ? padded_[u] : shard_[u];
    params_[u] = zeroed(stage_ == 3 ? shard_[u] : padded_[u], prec_.param);
    if (prec_.has_master()) master_[u] = zeroed(optim_len, prec_.optim);
    grads_[u] = zeroed(stage_ >= 2 ? shard_[u] : padded_[u], prec_.grad);
    m_[u] = zeroed(optim_len, prec_.optim);
    v_[u] = zeroed(optim_len, prec_.optim);
  }
  for (int b = 0; b < (stage_ >= 2 ? 2 : 1); ++b) {
    scratch_[b] = zeroed(max_padded, prec_.grad);
    track(scratch_[b].bytes());
  }
}

ParamStore::~ParamStore() {
  // Nothing may still be in flight on a buffer released here.
  for (Request& r : scatter_) r.wait();
  for (Request& r : unit_reduce_) r.wait();
  for (Request& r : gathers_) r.wait();
  for (auto* list : {&params_, &master_, &gathered_, &grads_, &m_, &v_})
    for (Buf& b : *list)
      if (b.p) be_.release(b);
  for (Buf& b : scratch_)
    if (b.p) be_.release(b);
}

template <class F>
void ParamStore::blocked(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  exposed_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double ParamStore::take_comm_exposed_ms() {
  const double ms = exposed_ms_;
  exposed_ms_ = 0;
  return ms;
}

void ParamStore::poll() {
  for (Request& r : scatter_) r.test();
  for (Request& r : unit_reduce_) r.test();
  for (Request& r : gathers_) r.test();
}

void ParamStore::require_held(int u) const {
  if (u < 0 || u >= static_cast<int>(groups_.size()) || !groups_[u])
    throw std::logic_error("ParamStore: unit " + std::to_string(u) + " is not held by this rank's pipeline stages");
}

void ParamStore::track(std::int64_t delta) {
  transient_ += delta;
  transient_peak_ = std::max(transient_peak_, transient_);
}

void ParamStore::prefetch(int u) {
  if (stage_ < 3 || u < 0 || u >= static_cast<int>(groups_.size()) || !groups_[u] || gathered_[u].p) return;
  gathered_[u] = be_.alloc(padded_[u], prec_.param);
  track(gathered_[u].bytes());
  gathers_[u] = groups_[u]->iall_gather(params_[u], gathered_[u]);
}

Buf ParamStore::acquire(int u) {
  require_held(u);
  if (stage_ < 3) return params_[u];
  poll();
  prefetch(u);  // gathers now unless a prefetch already did
  if (gathers_[u].pending()) blocked([&] { gathers_[u].wait(); });
  return gathered_[u];
}

void ParamStore::release(int u) {
  if (stage_ < 3 || !gathered_[u].p) return;
  track(-gathered_[u].bytes());
  be_.release(gathered_[u]);  // really free it
}

Buf ParamStore::grad_begin(int u) {
  require_held(u);
  poll();
  if (stage_ >= 2) {
    cur_ ^= 1;
    finish_scatter(cur_);  // the older of the two in flight: its buffer is reused now
  }
  const Buf g = scratch_[cur_].at(0, padded_[u]);
  be_.zero(g);
  return g;
}

void ParamStore::finish_scatter(int b) {
  const int u = scatter_unit_[b];
  if (u < 0) return;
  if (scatter_[b].pending()) blocked([&] { scatter_[b].wait(); });
  be_.add(grads_[u], scratch_[b].at(shard_begin(u), shard_[u]));
  scatter_unit_[b] = -1;
}

void ParamStore::grad_end(int u) {
  const Buf s = scratch_[cur_].at(0, padded_[u]);
  if (stage_ < 2) {
    // Its reduction already reads the gradient: a further micro-batch would race with it.
    if (reduce_posted_[u]) throw std::logic_error("ParamStore: unit " + std::to_string(u) + " got more micro-batch gradients than zero_grads announced");
    be_.add(grads_[u], s);
    if (++grad_ends_[u] == microbatches_) {  // the unit's last micro-batch: its reduction can start
      unit_reduce_[u] = groups_[u]->ireduce_scatter(grads_[u], grad_shard(u), ReduceOp::sum);
      reduce_posted_[u] = true;
    }
    return;
  }
  scatter_[cur_] = groups_[u]->ireduce_scatter(s, s.at(shard_begin(u), shard_[u]), ReduceOp::sum);
  scatter_unit_[cur_] = u;
}

void ParamStore::zero_grads(int microbatches) {
  for (Request& r : unit_reduce_) r.wait();  // nothing may still read or write the buffers zeroed here
  finish_scatter(cur_ ^ 1);
  finish_scatter(cur_);
  std::fill(reduce_posted_.begin(), reduce_posted_.end(), false);
  for (const Buf& g : grads_)
    if (g.p) be_.zero(g);
  microbatches_ = microbatches;
  std::fill(grad_ends_.begin(), grad_ends_.end(), 0);
}

void ParamStore::reduce_grads() {
  finish_scatter(cur_ ^ 1);  // oldest first
  finish_scatter(cur_);
  if (stage_ >= 2) return;
  for (std::size_t uu = 0; uu < grads_.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!groups_[u]) continue;
    if (!reduce_posted_[u]) unit_reduce_[u] = groups_[u]->ireduce_scatter(grads_[u], grad_shard(u), ReduceOp::sum);
    reduce_posted_[u] = false;
    if (unit_reduce_[u].pending()) blocked([&] { unit_reduce_[u].wait(); });
    // Stage 0 completes the all-reduce (= reduce-scatter + all-gather, the same bits as Comm::all_reduce).
    if (stage_ == 0 && groups_[u]->size() > 1) blocked([&] { groups_[u]->all_gather(grad_shard(u), grads_[u]); });
  }
}

Buf ParamStore::grad_shard(int u) const {
  require_held(u);
  return stage_ >= 2 ? grads_[u] : grads_[u].at(shard_begin(u), shard_[u]);
}

Buf ParamStore::optim_params(int u) const { return prec_.has_master() ? master_[u] : params_[u]; }

double ParamStore::grad_sumsq(int u, const std::vector<bool>& include) const {
  const Buf g = grad_shard(u);
  const std::int64_t lo = shard_begin(u), hi = lo + shard_[u];
  std::vector<Buf> parts;
  const auto& ts = table_.units[u].tensors;
  for (std::size_t t = 0; t < ts.size(); ++t) {
    if (!include[t]) continue;
    const std::int64_t a = std::max(lo, ts[t].offset), b = std::min(hi, ts[t].offset + ts[t].numel());
    if (a < b) parts.push_back(g.at(a - lo, b - a));
  }
  return be_.sum_squares(parts);
}

void ParamStore::adam_step(kc::AdamW hp) {
  const double wd = hp.weight_decay;
  std::vector<Request> gathers;  // stages 1-2: each unit's parameters go out while the next one updates
  std::vector<device::AdamTensor> decayed, plain;
  for (std::size_t uu = 0; uu < params_.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!groups_[u]) continue;
    // Stage 0 updates the whole unit (each data-parallel rank redundantly, identical bits); the other
    // stages their shard. Elementwise, so both give the same values for the same elements.
    const std::int64_t lo = stage_ == 0 ? 0 : shard_begin(u);
    const std::int64_t len = stage_ == 0 ? padded_[u] : shard_[u];
    const Buf p = stage_ == 3 ? params_[u] : params_[u].at(lo, len);  // the kernels' weights of the range
    const Buf master = prec_.has_master() ? master_[u] : p;            // indexed like m and v
    const Buf g = stage_ == 0 ? grads_[u] : grad_shard(u);
    // The unit's tensors in two multi-tensor calls: matrices with weight decay, norm weights without.
    decayed.clear();
    plain.clear();
    for (const TensorSlot& t : table_.units[u].tensors) {
      const std::int64_t a = std::max(lo, t.offset), b = std::min(lo + len, t.offset + t.numel());
      if (a >= b) continue;
      const std::int64_t o = a - lo, n = b - a;
      (t.is_vector ? plain : decayed)
          .push_back({master.at(o, n), m_[u].at(o, n), v_[u].at(o, n), g.at(o, n), prec_.has_master() ? p.at(o, n) : Buf{}});
    }
    hp.weight_decay = wd;
    if (!decayed.empty()) be_.adamw(decayed, hp);
    hp.weight_decay = 0.0;
    if (!plain.empty()) be_.adamw(plain, hp);
    if (stage_ == 1 || stage_ == 2) {
      gathers.push_back(groups_[u]->iall_gather(p, params_[u]));
      for (Request& r : gathers) r.test();
    }
  }
  for (Request& r : gathers)
    if (r.pending()) blocked([&] { r.wait(); });
}

template <class T>
std::vector<T> ParamStore::read_unit(int u) {
  require_held(u);
  const std::int64_t n = table_.units[u].size;
  std::vector<T> full(static_cast<std::size_t>(padded_[u]));
  const Buf src = optim_params(u);
  if (src.n == padded_[u]) {
    be_.download(full.data(), src);
  } else {  // a shard: gathered into a temporary of the whole unit
    Buf all = be_.alloc(padded_[u], src.t);
    groups_[u]->all_gather(src, all);
    be_.download(full.data(), all);
    be_.release(all);
  }
  full.resize(static_cast<std::size_t>(n));
  return full;
}

// dst := the elements [lo, lo + dst.n) of full (n elements), zero beyond them.
template <class T>
void ParamStore::upload_padded(Buf dst, const T* full, std::int64_t lo, std::int64_t n) const {
  // Straight from the caller's values (no host copy: at 100M parameters a zero-filled copy per buffer cost
  // more than reading the checkpoint); only the padding past the unit's end is zeroed.
  const std::int64_t real = std::clamp<std::int64_t>(n - lo, 0, dst.n);
  if (real > 0) be_.upload(dst.at(0, real), full + lo);
  if (real < dst.n) be_.zero(dst.at(real, dst.n - real));
}

template <class T>
void ParamStore::write_unit(int u, const T* full) {
  require_held(u);
  const std::int64_t n = table_.units[u].size;
  if (prec_.has_master()) {
    upload_padded(master_[u], full, stage_ == 0 ? 0 : shard_begin(u), n);
    // The kernels' weights are the master rounded (round to nearest-even), as after every update.
    upload_padded(params_[u], full, stage_ == 3 ? shard_begin(u) : 0, n);
    return;
  }
  upload_padded(params_[u], full, stage_ == 3 ? shard_begin(u) : 0, n);
}

template <class T>
std::vector<T> ParamStore::read_grad_shard(int u) const {
  std::vector<T> out(static_cast<std::size_t>(shard_[u]));
  be_.download(out.data(), grad_shard(u));
  return out;
}

template <class T>
void ParamStore::read_region(int u, Region r, T* out) const {
  require_held(u);
  const std::int64_t lo = shard_begin(u), n = shard_[u];
  switch (r) {
    case Region::params: {
      const Buf p = optim_params(u);
      be_.download(out, p.n == n ? p : p.at(lo, n));
      return;
    }
    case Region::exp_avg: be_.download(out, stage_ == 0 ? m_[u].at(lo, n) : m_[u]); return;
    case Region::exp_avg_sq: be_.download(out, stage_ == 0 ? v_[u].at(lo, n) : v_[u]); return;
  }
}

template <class T>
void ParamStore::write_state(int u, const T* params, const T* exp_avg, const T* exp_avg_sq) {
  if (params) write_unit(u, params);
  const std::int64_t n = table_.units[u].size;
  const std::int64_t lo = stage_ == 0 ? 0 : shard_begin(u);
  if (exp_avg) upload_padded(m_[u], exp_avg, lo, n);
  if (exp_avg_sq) upload_padded(v_[u], exp_avg_sq, lo, n);
}

template <class T>
T* ParamStore::state_in_place(int u, Region r) {
  require_held(u);
  if (!be_.host_addressable()) return nullptr;
  const bool whole = r == Region::params ? stage_ < 3 && !prec_.has_master() : stage_ == 0;
  const Buf& b = r == Region::params ? params_[u] : r == Region::exp_avg ? m_[u] : v_[u];
  if (!whole || b.t != device::dtype_of<T>() || b.n < table_.units[u].size) return nullptr;
  return static_cast<T*>(b.p);
}

MemoryReport ParamStore::memory() const {
  MemoryReport r;
  for (std::size_t u = 0; u < params_.size(); ++u) {
    r.params += params_[u].bytes();
    r.grads += grads_[u].bytes();
    r.optimizer += m_[u].bytes() + v_[u].bytes() + master_[u].bytes();
  }
  r.transient_peak = transient_peak_;
  return r;
}

#define MESHRUN_STORE_INSTANTIATE(T)                                                   \
  template std::vector<T> ParamStore::read_unit<T>(int);                               \
  template void ParamStore::write_unit<T>(int, const T*);                              \
  template std::vector<T> ParamStore::read_grad_shard<T>(int) const;                   \
  template void ParamStore::read_region<T>(int, Region, T*) const;                     \
  template void ParamStore::write_state<T>(int, const T*, const T*, const T*);            \
  template T* ParamStore::state_in_place<T>(int, Region);
MESHRUN_STORE_INSTANTIATE(float)
MESHRUN_STORE_INSTANTIATE(double)
#undef MESHRUN_STORE_INSTANTIATE

}  // namespace meshrun::train
