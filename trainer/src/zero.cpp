#include "meshrun/train/zero.hpp"

#include <algorithm>
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
  scratch_.assign(static_cast<std::size_t>(max_padded), T(0));
  track(static_cast<std::int64_t>(scratch_.size() * sizeof(T)));
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
const T* ParamStore<T>::acquire(int u) {
  require_held(u);
  if (stage_ < 3) return params_[u].data();
  std::vector<T>& g = gathered_[u];
  if (g.empty()) {
    g.resize(static_cast<std::size_t>(padded_[u]));
    track(static_cast<std::int64_t>(g.size() * sizeof(T)));
    groups_[u]->all_gather(params_[u].data(), g.data(), shard_[u]);
  }
  return g.data();
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
  std::fill(scratch_.begin(), scratch_.begin() + padded_[u], T(0));
  return scratch_.data();
}

template <class T>
void ParamStore<T>::grad_end(int u) {
  T* g = grads_[u].data();
  if (stage_ < 2) {
    for (std::int64_t i = 0; i < padded_[u]; ++i) g[i] += scratch_[i];
    return;
  }
  T* own = scratch_.data() + shard_begin(u);
  groups_[u]->reduce_scatter(scratch_.data(), own, shard_[u]);
  for (std::int64_t i = 0; i < shard_[u]; ++i) g[i] += own[i];
}

template <class T>
void ParamStore<T>::zero_grads() {
  for (auto& g : grads_) std::fill(g.begin(), g.end(), T(0));
}

template <class T>
void ParamStore<T>::reduce_grads() {
  for (std::size_t u = 0; u < grads_.size(); ++u) {
    if (!groups_[u]) continue;
    if (stage_ == 0) groups_[u]->all_reduce(grads_[u].data(), padded_[u]);
    if (stage_ == 1) groups_[u]->reduce_scatter(grads_[u].data(), grads_[u].data() + shard_begin(int(u)), shard_[u]);
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
    if (stage_ == 1 || stage_ == 2) groups_[u]->all_gather(p, params_[u].data(), shard_[u]);
  }
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
