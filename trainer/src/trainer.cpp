#include "meshrun/train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "meshrun/train/safetensors.hpp"

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;

double lr_at(const TrainingSpec& t, int s) {
  if (s < t.warmup_steps) return t.lr * static_cast<double>(s + 1) / t.warmup_steps;
  const int decay = t.steps - t.warmup_steps;
  if (decay <= 1) return t.lr;
  const double progress = static_cast<double>(s - t.warmup_steps) / (decay - 1);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

std::string check_train_setup(const JobConfig& cfg, const Layout& layout) {
  const auto& t = cfg.training;
  const auto& m = cfg.model;
  if (layout.cp != 1) return "parallel.cp = " + std::to_string(layout.cp) + ": the bundled trainer does not run context parallelism yet; set parallel.cp = 1";
  if (layout.pp != 1) return "parallel.pp = " + std::to_string(layout.pp) + ": the bundled trainer does not run pipeline parallelism yet; set parallel.pp = 1";
  if (layout.ep != 1 || m.experts > 0) return "mixture-of-experts models (model.experts, parallel.ep) are not in the bundled trainer yet; use a dense model";
  if (m.mlp != "swiglu") return "model.mlp = \"" + m.mlp + "\": the bundled trainer builds the Llama SwiGLU MLP; set model.mlp = \"swiglu\"";
  if (m.tied_embeddings) return "model.tied_embeddings = true is not supported (Llama's lm_head is untied); set it to false";
  if (t.dtype != "fp32" && t.dtype != "fp64") return "training.dtype = \"" + t.dtype + "\": the CPU trainer computes in \"fp32\" or \"fp64\"";
  if (t.seq_len <= 0 || t.steps < 0 || t.micro_batch_size <= 0 || t.global_batch_size <= 0)
    return "training.seq_len, micro_batch_size and global_batch_size must be positive and steps >= 0";
  const long per = static_cast<long>(layout.dp) * layout.cp * t.micro_batch_size;
  if (t.global_batch_size % per != 0)
    return "training.global_batch_size (" + std::to_string(t.global_batch_size) + ") must be a multiple of dp × micro_batch_size (" +
           std::to_string(per) + "); change one of them";
  if (layout.sequence_parallel && (static_cast<long>(t.micro_batch_size) * t.seq_len) % layout.tp != 0)
    return "sequence parallelism needs micro_batch_size × seq_len divisible by parallel.tp; change seq_len";
  return "";
}

template <class T>
Trainer<T>::Trainer(const JobConfig& cfg, const RankGrid& grid, int rank, const Groups& groups)
    : cfg_(cfg),
      coord_(grid.coords(rank)),
      groups_(groups),
      tp_(groups[GroupKind::tp]),
      dp_(groups[GroupKind::dp_cp]),  // context-parallel ranks share weights: reduce over dp·cp
      table_(build_param_table(cfg.model, grid.layout().tp, coord_.tp)),
      store_(table_, grid.layout().zero_stage, dp_),
      model_(ModelDims::from(cfg.model), table_, tp_, grid.layout().sequence_parallel, cfg.training.seq_len,
             cfg.training.micro_batch_size) {
  const std::int64_t n = static_cast<std::int64_t>(cfg.training.micro_batch_size) * cfg.training.seq_len;
  ids_.resize(static_cast<std::size_t>(n));
  targets_.resize(static_cast<std::size_t>(n));
}

template <class T>
void Trainer<T>::init_params() {
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    std::vector<T> buf(static_cast<std::size_t>(table_.units[u].size));
    init_unit(buf.data(), table_.units[u], cfg_.training.seed, cfg_.model.layers);
    store_.write_unit(static_cast<int>(u), buf.data());
  }
}

template <class T>
std::vector<std::pair<std::string, std::vector<T>>> Trainer<T>::gather_params() {
  std::vector<std::vector<T>> units;
  for (std::size_t u = 0; u < table_.units.size(); ++u) units.push_back(store_.read_unit(static_cast<int>(u)));
  return assemble(units);
}

template <class T>
std::vector<std::pair<std::string, std::vector<T>>> Trainer<T>::gather_grads() {
  std::vector<std::vector<T>> units;
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    const int uu = static_cast<int>(u);
    std::vector<T> full(static_cast<std::size_t>(store_.shard_len(uu) * dp_.size()));
    dp_.all_gather(store_.grad_shard(uu), full.data(), store_.shard_len(uu));
    full.resize(static_cast<std::size_t>(table_.units[u].size));
    units.push_back(std::move(full));
  }
  return assemble(units);
}

template <class T>
std::vector<std::pair<std::string, std::vector<T>>> Trainer<T>::assemble(const std::vector<std::vector<T>>& units) {
  std::vector<std::pair<std::string, std::vector<T>>> out;
  const int p = tp_.size();
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    const std::vector<T>& unit = units[u];
    for (const TensorSlot& t : table_.units[u].tensors) {
      std::vector<T> full(static_cast<std::size_t>(t.rows * t.cols));
      const T* local = unit.data() + t.offset;
      if (t.split == Split::replicated || p == 1) {
        std::copy(local, local + t.numel(), full.begin());
      } else {
        std::vector<T> blocks(static_cast<std::size_t>(t.numel() * p));
        tp_.all_gather(local, blocks.data(), t.numel());
        if (t.split == Split::rows) {
          full = std::move(blocks);  // row blocks in rank order are the global tensor
        } else {
          for (int q = 0; q < p; ++q)
            for (std::int64_t r = 0; r < t.rows; ++r)
              for (std::int64_t c = 0; c < t.local_cols; ++c)
                full[r * t.cols + q * t.local_cols + c] = blocks[(q * t.rows + r) * t.local_cols + c];
        }
      }
      out.emplace_back(t.name, std::move(full));
    }
  }
  return out;
}

template <class T>
void Trainer<T>::save(const std::string& path) {
  const auto params = gather_params();
  if (groups_.world->rank() == 0) {
    std::vector<TensorToWrite> w;
    std::size_t i = 0;
    for (const auto& u : table_.units)
      for (const TensorSlot& t : u.tensors) {
        const auto& data = params[i++].second;
        w.push_back({t.name, sizeof(T) == 4 ? "F32" : "F64", t.shape(), data.data(), data.size() * sizeof(T)});
      }
    write_safetensors(path, w, {{"format", "pt"}, {"producer", "meshrun-train"}});
  }
  groups_.world->barrier();
}

template <class T>
void Trainer<T>::load(const std::string& path) {
  const SafetensorsFile file(path);
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    std::vector<T> buf(static_cast<std::size_t>(table_.units[u].size));
    for (const TensorSlot& t : table_.units[u].tensors) {
      const std::vector<T> full = file.read<T>(t.name, t.shape());
      for (std::int64_t i = 0; i < t.numel(); ++i) buf[t.offset + i] = full[t.global_index(i)];
    }
    store_.write_unit(static_cast<int>(u), buf.data());
  }
}

template <class T>
StepStats Trainer<T>::step(int s, const BatchSchedule& data) {
  const auto t0 = std::chrono::steady_clock::now();
  const TrainingSpec& tr = cfg_.training;
  const std::int64_t B = tr.global_batch_size, S = tr.seq_len, mbs = tr.micro_batch_size;
  const std::int64_t per_rank = B / dp_.size(), micro_batches = per_rank / mbs;
  const double inv_tokens = loss_normalizer(tr);

  store_.zero_grads();
  double loss_sum = 0;
  for (std::int64_t j = 0; j < micro_batches; ++j) {
    for (std::int64_t b = 0; b < mbs; ++b) {
      const std::int64_t index = s * B + coord_.dp * per_rank + j * mbs + b;
      data.sequence(index, ids_.data() + b * S, targets_.data() + b * S);
    }
    loss_sum += model_.forward_backward(store_, ids_.data(), targets_.data(), inv_tokens);
  }
  store_.reduce_grads();

  // Global gradient norm: each tensor-parallel shard once, replicated tensors only from tp rank 0,
  // each data-parallel rank its ZeRO shard region; double sums in a fixed order.
  double sumsq = 0;
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    std::vector<bool> include;
    for (const TensorSlot& t : table_.units[u].tensors) include.push_back(t.split != Split::replicated || tp_.rank() == 0);
    sumsq += store_.grad_sumsq(static_cast<int>(u), include);
  }
  dp_.all_reduce(&sumsq, 1);
  tp_.all_reduce(&sumsq, 1);
  dp_.all_reduce(&loss_sum, 1);
  // The clip factor comes from the norm rounded to fp32, so layouts whose double sums differ in the
  // last bits (different shard boundaries) still agree on it.
  const double norm = static_cast<float>(std::sqrt(sumsq));
  const double clip = (tr.grad_clip > 0 && norm > tr.grad_clip) ? tr.grad_clip / norm : 1.0;

  StepStats st;
  st.step = s + 1;
  st.lr = lr_at(tr, s);
  kc::AdamW hp{st.lr, tr.beta1, tr.beta2, tr.adam_eps, tr.weight_decay, s + 1, clip};
  store_.adam_step(hp);

  st.loss = loss_sum * inv_tokens;
  st.grad_norm = norm;
  st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  st.tokens_per_s = static_cast<double>(B * S) / (st.ms / 1000.0);
  return st;
}

template class Trainer<float>;
template class Trainer<double>;

}  // namespace meshrun::train
