#include "meshrun/train/parallel/zero.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;

template <class T>
ParamStore<T>::ParamStore(const ParamTable& table, int zero_stage, Comm& dp)
    : ParamStore(table, zero_stage, std::vector<Comm*>(table.units.size(), &dp)) {}

template <class T>
ParamStore<T>::ParamStore(const ParamTable& table, int zero_stage, std::vector<Comm*> groups)
    : table_(table), stage_(zero_stage), groups_(std::move(groups)) {
  if (zero_stage < 0 || zero_stage > 3) throw std::invalid_argument("parallel.zero_stage must be 0, 1, 2 or 3");
  const std::size_t nu = table.units.size();
  if (groups_.size() != nu) throw std::invalid_argument("ParamStore: one group (or nullptr) per unit");
  padded_.resize(nu);
  shard_.resize(nu);
  params_.resize(nu);
  gathered_.resize(nu);
  grads_.resize(nu);
  m_.resize(nu);
  v_.resize(nu);
  unit_reduce_.resize(nu);
  reduce_posted_.assign(nu, false);
  grad_ends_.assign(nu, 0);
  gathers_.resize(nu);
  std::int64_t max_padded = 0;
  for (std::size_t u = 0; u < nu; ++u) {
    if (!groups_[u]) continue;  // another pipeline stage's unit: no memory here
    const int nranks = groups_[u]->size();
    shard_[u] = (table.units[u].size + nranks - 1) / nranks;
    padded_[u] = shard_[u] * nranks;
    max_padded = std::max(max_padded, padded_[u]);
    params_[u].assign(static_cast<std::size_t>(stage_ == 3 ? shard_[u] : padded_[u]), T(0));
    grads_[u].assign(static_cast<std::size_t>(stage_ >= 2 ? shard_[u] : padded_[u]), T(0));
    m_[u].assign(static_cast<std::size_t>(stage_ == 0 ? padded_[u] : shard_[u]), T(0));
    v_[u].assign(m_[u].size(), T(0));
  }
  for (int b = 0; b < (stage_ >= 2 ? 2 : 1); ++b) {
    scratch_[b].assign(static_cast<std::size_t>(max_padded), T(0));
    track(static_cast<std::int64_t>(scratch_[b].size() * sizeof(T)));
  }
}

template <class T>
template <class F>
void ParamStore<T>::blocked(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  exposed_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <class T>
double ParamStore<T>::take_comm_exposed_ms() {
  const double ms = exposed_ms_;
  exposed_ms_ = 0;
  return ms;
}

template <class T>
void ParamStore<T>::poll() {
  for (Request& r : scatter_) r.test();
  for (Request& r : unit_reduce_) r.test();
  for (Request& r : gathers_) r.test();
}

template <class T>
void ParamStore<T>::require_held(int u) const {
  if (u < 0 || u >= static_cast<int>(groups_.size()) || !groups_[u])
    throw std::logic_error("ParamStore: unit " + std::to_string(u) + " is not held by this rank's pipeline stages");
}

template <class T>
void ParamStore<T>::track(std::int64_t delta) {
  transient_ += delta;
  transient_peak_ = std::max(transient_peak_, transient_);
}

template <class T>
void ParamStore<T>::prefetch(int u) {
  if (stage_ < 3 || u < 0 || u >= static_cast<int>(groups_.size()) || !groups_[u] || !gathered_[u].empty()) return;
  std::vector<T>& g = gathered_[u];
  g.resize(static_cast<std::size_t>(padded_[u]));
  track(static_cast<std::int64_t>(g.size() * sizeof(T)));
  gathers_[u] = groups_[u]->iall_gather(params_[u].data(), g.data(), shard_[u]);
}

template <class T>
const T* ParamStore<T>::acquire(int u) {
  require_held(u);
  if (stage_ < 3) return params_[u].data();
  poll();
  prefetch(u);  // gathers now unless a prefetch already did
  if (gathers_[u].pending()) blocked([&] { gathers_[u].wait(); });
  return gathered_[u].data();
}

template <class T>
void ParamStore<T>::release(int u) {
  if (stage_ < 3 || gathered_[u].empty()) return;
  track(-static_cast<std::int64_t>(gathered_[u].size() * sizeof(T)));
  std::vector<T>().swap(gathered_[u]);  // really free it
}

template <class T>
T* ParamStore<T>::grad_begin(int u) {
  require_held(u);
  poll();
  if (stage_ >= 2) {
    cur_ ^= 1;
    finish_scatter(cur_);  // the older of the two in flight: its buffer is reused now
  }
  std::fill(scratch_[cur_].begin(), scratch_[cur_].begin() + padded_[u], T(0));
  return scratch_[cur_].data();
}

template <class T>
void ParamStore<T>::finish_scatter(int b) {
  const int u = scatter_unit_[b];
  if (u < 0) return;
  if (scatter_[b].pending()) blocked([&] { scatter_[b].wait(); });
  T* g = grads_[u].data();
  const T* own = scratch_[b].data() + shard_begin(u);
  for (std::int64_t i = 0; i < shard_[u]; ++i) g[i] += own[i];
  scatter_unit_[b] = -1;
}

template <class T>
void ParamStore<T>::grad_end(int u) {
  T* s = scratch_[cur_].data();
  if (stage_ < 2) {
    // Its reduction already reads the gradient: a further micro-batch would race with it.
    if (reduce_posted_[u]) throw std::logic_error("ParamStore: unit " + std::to_string(u) + " got more micro-batch gradients than zero_grads announced");
    T* g = grads_[u].data();
    for (std::int64_t i = 0; i < padded_[u]; ++i) g[i] += s[i];
    if (++grad_ends_[u] == microbatches_) {  // the unit's last micro-batch: its reduction can start
      unit_reduce_[u] = groups_[u]->ireduce_scatter(g, g + shard_begin(u), shard_[u]);
      reduce_posted_[u] = true;
    }
    return;
  }
  scatter_[cur_] = groups_[u]->ireduce_scatter(s, s + shard_begin(u), shard_[u]);
  scatter_unit_[cur_] = u;
}

template <class T>
void ParamStore<T>::zero_grads(int microbatches) {
  for (Request& r : unit_reduce_) r.wait();  // nothing may still read or write the buffers zeroed here
  finish_scatter(cur_ ^ 1);
  finish_scatter(cur_);
  std::fill(reduce_posted_.begin(), reduce_posted_.end(), false);
  for (auto& g : grads_) std::fill(g.begin(), g.end(), T(0));
  microbatches_ = microbatches;
  std::fill(grad_ends_.begin(), grad_ends_.end(), 0);
}

template <class T>
void ParamStore<T>::reduce_grads() {
  finish_scatter(cur_ ^ 1);  // oldest first
  finish_scatter(cur_);
  if (stage_ >= 2) return;
  for (std::size_t uu = 0; uu < grads_.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!groups_[u]) continue;
    T* g = grads_[u].data();
    if (!reduce_posted_[u]) unit_reduce_[u] = groups_[u]->ireduce_scatter(g, g + shard_begin(u), shard_[u]);
    reduce_posted_[u] = false;
    if (unit_reduce_[u].pending()) blocked([&] { unit_reduce_[u].wait(); });
    // Stage 0 completes the all-reduce (= reduce-scatter + all-gather, the same bits as Comm::all_reduce).
    if (stage_ == 0 && groups_[u]->size() > 1) blocked([&] { groups_[u]->all_gather(g + shard_begin(u), g, shard_[u]); });
  }
}

template <class T>
const T* ParamStore<T>::grad_shard(int u) const {
  require_held(u);
  return stage_ >= 2 ? grads_[u].data() : grads_[u].data() + shard_begin(u);
}

template <class T>
double ParamStore<T>::grad_sumsq(int u, const std::vector<bool>& include) const {
  require_held(u);
  const T* g = grad_shard(u);
  const std::int64_t lo = shard_begin(u), hi = lo + shard_[u];
  double s = 0;
  const auto& ts = table_.units[u].tensors;
  for (std::size_t t = 0; t < ts.size(); ++t) {
    if (!include[t]) continue;
    const std::int64_t a = std::max(lo, ts[t].offset), b = std::min(hi, ts[t].offset + ts[t].numel());
    if (a < b) s += kc::sum_squares(g + (a - lo), b - a);
  }
  return s;
}

template <class T>
void ParamStore<T>::adam_step(kc::AdamW hp) {
  const double wd = hp.weight_decay;
  std::vector<Request> gathers;  // stages 1-2: each unit's parameters go out while the next one updates
  for (std::size_t uu = 0; uu < params_.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!groups_[u]) continue;
    // Stage 0 updates the whole unit (each data-parallel rank redundantly, identical bits); the other
    // stages their shard. Elementwise, so both give the same values for the same elements.
    const std::int64_t lo = stage_ == 0 ? 0 : shard_begin(u);
    const std::int64_t len = stage_ == 0 ? padded_[u] : shard_[u];
    T* p = stage_ == 3 ? params_[u].data() : params_[u].data() + lo;
    const T* g = stage_ == 0 ? grads_[u].data() : grad_shard(u);
    for (const TensorSlot& t : table_.units[u].tensors) {
      const std::int64_t a = std::max(lo, t.offset), b = std::min(lo + len, t.offset + t.numel());
      if (a >= b) continue;
      hp.weight_decay = t.is_vector ? 0.0 : wd;  // no decay on norm weights
      kc::adamw_update(p + (a - lo), m_[u].data() + (a - lo), v_[u].data() + (a - lo), g + (a - lo), b - a, hp);
    }
    if (stage_ == 1 || stage_ == 2) {
      gathers.push_back(groups_[u]->iall_gather(p, params_[u].data(), shard_[u]));
      for (Request& r : gathers) r.test();
    }
  }
  for (Request& r : gathers)
    if (r.pending()) blocked([&] { r.wait(); });
}

template <class T>
std::vector<T> ParamStore<T>::read_unit(int u) {
  require_held(u);
  std::vector<T> full(static_cast<std::size_t>(padded_[u]));
  if (stage_ < 3) {
    std::copy(params_[u].begin(), params_[u].end(), full.begin());
  } else {
    groups_[u]->all_gather(params_[u].data(), full.data(), shard_[u]);
  }
  full.resize(static_cast<std::size_t>(table_.units[u].size));
  return full;
}

template <class T>
void ParamStore<T>::write_unit(int u, const T* full) {
  require_held(u);
  const std::int64_t n = table_.units[u].size;
  if (stage_ < 3) {
    std::copy(full, full + n, params_[u].begin());
    return;
  }
  const std::int64_t lo = shard_begin(u);
  for (std::int64_t i = 0; i < shard_[u]; ++i) params_[u][i] = (lo + i < n) ? full[lo + i] : T(0);
}

template <class T>
const T* ParamStore<T>::param_region(int u) const {
  require_held(u);
  return stage_ == 3 ? params_[u].data() : params_[u].data() + shard_begin(u);
}

template <class T>
const T* ParamStore<T>::exp_avg_region(int u) const {
  require_held(u);
  return stage_ == 0 ? m_[u].data() + shard_begin(u) : m_[u].data();
}

template <class T>
const T* ParamStore<T>::exp_avg_sq_region(int u) const {
  require_held(u);
  return stage_ == 0 ? v_[u].data() + shard_begin(u) : v_[u].data();
}

template <class T>
void ParamStore<T>::write_state(int u, const T* params, const T* exp_avg, const T* exp_avg_sq) {
  write_unit(u, params);
  const std::int64_t n = table_.units[u].size;
  const std::int64_t lo = stage_ == 0 ? 0 : shard_begin(u);
  for (std::size_t i = 0; i < m_[u].size(); ++i) {
    const std::int64_t g = lo + static_cast<std::int64_t>(i);
    m_[u][i] = g < n ? exp_avg[g] : T(0);
    v_[u][i] = g < n ? exp_avg_sq[g] : T(0);
  }
}

template <class T>
MemoryReport ParamStore<T>::memory() const {
  MemoryReport r;
  for (std::size_t u = 0; u < params_.size(); ++u) {
    r.params += static_cast<std::int64_t>(params_[u].size() * sizeof(T));
    r.grads += static_cast<std::int64_t>(grads_[u].size() * sizeof(T));
    r.optimizer += static_cast<std::int64_t>((m_[u].size() + v_[u].size()) * sizeof(T));
  }
  r.transient_peak = transient_peak_;
  return r;
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace meshrun::train
