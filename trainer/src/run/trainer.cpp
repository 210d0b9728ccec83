#include "meshrun/train/run/trainer.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "meshrun/train/checkpoint/hf_model.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"
#include "meshrun/train/run/trace.hpp"

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;

double lr_at(const TrainingSpec& t, int s) {
  if (s < t.warmup_steps) return t.lr * static_cast<double>(s + 1) / t.warmup_steps;
  const int decay = t.decay_horizon() - t.warmup_steps;  // lr_decay_steps, not steps: an extended run keeps its schedule
  if (decay <= 1) return t.lr;
  const double progress = static_cast<double>(s - t.warmup_steps) / (decay - 1);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

std::string check_train_setup(const JobConfig& cfg, const Layout& layout) {
  // Every rule of a meshrun-train job, each written once in mesh: the dry run, the launcher and the plugin hold a
  // template's job to the same set. On CPU the "cluster" is what MPI gives: one shared-memory node of every rank.
  std::vector<Problem> problems;
  const Cluster cluster = resolve_cluster(single_node_spec(static_cast<int>(layout.world())), &problems);
  if (problems.empty()) problems = check_rules(cfg, layout, cluster, RuleSet::trainer);
  return problems.empty() ? std::string() : problems.front().message;
}

ScheduleSpec schedule_spec(const JobConfig& cfg, const Layout& layout, const BatchGeometry& geometry) {
  ScheduleSpec spec;
  spec.kind = parse_pipeline_schedule(cfg.parallel.pipeline_schedule).value_or(PipelineSchedule::one_f_one_b);
  spec.pp = layout.pp;
  spec.virtual_stages = layout.virtual_stages;
  spec.microbatches = static_cast<int>(geometry.microbatches);
  return spec;
}

namespace {
ChunkPlacement placement_of(const JobConfig& cfg) { return chunk_placement(cfg.parallel.pipeline_schedule); }
BatchGeometry geometry_or_throw(const JobConfig& cfg, const Layout& layout) {
  std::string why;
  auto g = batch_geometry(cfg.training, layout, &why);
  if (!g) throw std::invalid_argument(why);
  return *g;
}
std::vector<int> layers_or_throw(const JobConfig& cfg, const Layout& layout) {
  auto v = chunk_layers(cfg.model.layers, layout.pp * layout.virtual_stages);
  if (!v) throw std::invalid_argument("model.layers cannot be split into pp·virtual_stages pipeline chunks");
  return *v;
}
}  // namespace

// training.device = "cuda": the CUDA backend on the task's device (MESHRUN_CUDA_DEVICE among the visible ones, else
// default_device: the node-local rank at world > 1),
// with Precision::cuda's dtypes. Otherwise the CPU backend of the trainer's type (training.dtype); the strict one
// (a test instrument) when MESHRUN_STRICT_BACKEND=1.
std::unique_ptr<device::Backend> make_backend(const TrainingSpec& t, const std::string& dtype, int default_device) {
  if (t.device == "cuda") {
    std::string why;
    const int visible = device::cuda_device_count(&why);
    if (visible == 0) throw std::invalid_argument("training.device = \"cuda\": " + why);
    return device::make_cuda_backend(
        device::Precision::for_run(t.device, t.dtype, t.param_dtype, t.grad_dtype, t.optim_dtype),
        device::task_cuda_device(visible, default_device));
  }
  return device::strict_backend_requested() ? device::make_strict_cpu_backend(dtype) : device::make_cpu_backend(dtype);
}

template <class T>
std::vector<Comm*> Trainer<T>::unit_groups() const {
  std::vector<Comm*> g(table_.units.size(), nullptr);
  Comm& edp = groups_[GroupKind::edp];
  const int ep = grid_.layout().ep;
  for (std::size_t u = 0; u < g.size(); ++u) {
    if (unit_owner_[u] != coord_.pp) continue;
    const int uu = static_cast<int>(u);
    if (!table_.is_expert_unit(uu)) {
      g[u] = &dp_;  // dense units replicate over dp·cp
    } else {
      // Expert j of a layer lives on EP rank j / (E/ep) and replicates over the expert-data-parallel group.
      const int j = (uu - table_.expert_unit(0, 0)) % table_.experts;
      if (j / (table_.experts / ep) == coord_.ep) g[u] = &edp;
    }
  }
  return g;
}

template <class T>
Trainer<T>::Trainer(const JobConfig& cfg, const RankGrid& grid, int rank, const Groups& groups,
                    const TestFaults& faults, std::unique_ptr<device::Backend> backend)
    : cfg_(cfg),
      grid_(grid),
      coord_(grid.coords(rank)),
      backend_(backend ? std::move(backend)
                       : make_backend(cfg.training,
                                      std::is_same_v<T, double> ? "fp64" : cfg.training.dtype == "bf16" ? "bf16" : "fp32")),
      host_access_groups_(groups.device_memory                  ? Groups{}
                          : device::strict_backend_requested() ? bracket_groups(groups, *backend_)
                          : !backend_->host_addressable()      ? device_local_groups(groups, *backend_)
                                                               : Groups{}),
      groups_(!groups.device_memory && (device::strict_backend_requested() || !backend_->host_addressable())
                  ? host_access_groups_
                  : groups),
      tp_(groups_[GroupKind::tp]),
      dp_(groups_[GroupKind::dp_cp]),
      pp_(groups_[GroupKind::pp]),
      geometry_(geometry_or_throw(cfg, grid.layout())),
      table_(build_param_table(cfg.model, grid.layout().tp, coord_.tp)),
      chunks_(chunk_units(table_, layers_or_throw(cfg, grid.layout()))),
      unit_owner_(table_.units.size(), 0),
      store_(table_, grid.layout().zero_stage,
             [&] {
               if (faults.edit_chunks) faults.edit_chunks(chunks_);
               for (const ChunkUnits& c : chunks_)
                 for (int u : c.units) unit_owner_[u] = chunk_rank(c.chunk, grid.layout().pp, placement_of(cfg));
               for (int u = table_.head_unit() + 1; u < static_cast<int>(table_.units.size()); ++u)
                 unit_owner_[u] = unit_owner_[table_.layer_unit(table_.expert_layer(u))];  // experts: their layer's stage
               return unit_groups();
             }(),
             *backend_),
      dims_(LayerDims::make(cfg.model, geometry_, grid.layout().tp, coord_.tp)),
      tpctx_{&tp_, geometry_.sequence_parallel, dims_.n, dims_.nl, dims_.h} {
  const Layout& l = grid.layout();
  tpctx_.be = backend_.get();
  const Recompute recompute = parse_recompute(cfg.training.recompute);
  ws_.resize(*backend_, dims_, tpctx_.gathers(), recompute);
  const std::vector<std::int32_t> seq_pos = geometry_.cp_positions(coord_.cp);
  std::vector<std::int32_t> pos;
  for (std::int64_t b = 0; b < geometry_.micro_batch_size; ++b) pos.insert(pos.end(), seq_pos.begin(), seq_pos.end());
  pos_ = device::DeviceBuffer(*backend_, static_cast<std::int64_t>(pos.size()), DType::i32);
  backend_->upload(pos_, pos.data());
  ids_host_.assign(static_cast<std::size_t>(dims_.n), 0);
  targets_host_.assign(static_cast<std::size_t>(dims_.n), 0);
  read_pos_ = seq_pos;
  if (faults.contiguous_cp_tokens)
    for (std::int64_t i = 0; i < geometry_.tokens_per_cp_rank; ++i)
      read_pos_[i] = static_cast<std::int32_t>(coord_.cp * geometry_.tokens_per_cp_rank + i);
  // Context parallelism: the CP group, its ring neighbours from mesh, every CP rank's positions.
  cpctx_.cp = &groups_[GroupKind::cp];
  const std::optional<CpComm> cp_mode = parse_cp_comm(cfg.parallel.cp_comm);
  if (!cp_mode) throw std::logic_error("parallel.cp_comm = \"" + cfg.parallel.cp_comm + "\" reached the trainer (validate_trainer's cp-comm refuses it)");
  cpctx_.mode = *cp_mode;
  cpctx_.a2a = cp_alltoall_group(cfg.parallel, l.cp);
  const auto cp_peers = grid.ring_peers(rank, Axis::cp);
  cpctx_.prev = grid.index_in_group(cp_peers.prev, GroupKind::cp);
  cpctx_.next = grid.index_in_group(cp_peers.next, GroupKind::cp);
  if (cpctx_.mode == CpComm::alltoall_ring && l.cp > 1) {  // the ring across the all-to-all groups (mesh's)
    const CpAlltoallPlace place = cp_alltoall_place(l.cp, cpctx_.a2a, cpctx_.rank());
    cpctx_.prev = place.prev;
    cpctx_.next = place.next;
  }
  for (int r = 0; r < l.cp; ++r) cpctx_.pos.push_back(geometry_.cp_positions(r));
  cpctx_.seq = geometry_.tokens_per_cp_rank;
  cpctx_.mbs = geometry_.micro_batch_size;
  cpctx_.hq = dims_.hq;
  cpctx_.hkv = dims_.hkv;
  cpctx_.dh = dims_.dh;
  cpctx_.resize(*backend_);
  // Expert parallelism: the EP group of this stage and TP rank (mesh's expert grid, ETP = TP).
  if (table_.experts > 0) {
    epctx_.be = backend_.get();
    epctx_.ep = &groups_[GroupKind::ep];
    if (epctx_.ep->rank() != coord_.ep) throw std::logic_error("the EP communicator's rank differs from the rank map's ep");
    epctx_.cp = &groups_[GroupKind::cp];
    epctx_.experts = table_.experts;
    epctx_.top_k = table_.top_k;
    epctx_.local = table_.experts / l.ep;
    epctx_.ffn = (cfg.model.moe_ffn_hidden > 0 ? cfg.model.moe_ffn_hidden : cfg.model.ffn_hidden) / l.tp;
    epctx_.tokens = static_cast<std::int64_t>(geometry_.micro_batch_size) * geometry_.seq_len;
    epctx_.aux_coef = cfg.model.aux_loss_coef() * static_cast<double>(geometry_.micro_batch_size) /
                      static_cast<double>(cfg.training.global_batch_size);  // mean over the step's micro-batches
    epctx_.pooled = cfg.model.router_aux == "hf";
    epctx_.layers = table_.layers;
    if (epctx_.pooled && l.pp > 1) throw std::logic_error("router_aux = hf with pp > 1 reached the trainer (validate_trainer's router-aux-pp refuses it)");
    epctx_.stats = &moe_stats_;
    epctx_.keep_hact = recompute == Recompute::none;
    epctx_.fault_drop_token = faults.moe_drop_token;
    epctx_.fault_wrong_rank = faults.moe_wrong_rank;
    epctx_.observe_logits = faults.router_logits;
    moe_stats_.reset(table_.layers, table_.experts, pooled_microbatches());
  }
  const int nchunks = l.pp * l.virtual_stages;
  std::vector<Stage*> by_chunk(static_cast<std::size_t>(nchunks), nullptr);
  for (const ChunkUnits& c : chunks_) {
    if (chunk_rank(c.chunk, l.pp, placement_of(cfg)) != coord_.pp) continue;
    stages_.push_back(std::make_unique<Stage>(c, dims_, tpctx_, cpctx_, table_, store_, ws_, pos_,
                                                 table_.experts > 0 ? &epctx_ : nullptr, recompute));
    by_chunk[c.chunk] = stages_.back().get();
  }
  if (const std::string why = check_schedule_spec(schedule_spec(cfg, l, geometry_)); !why.empty())
    throw std::invalid_argument(why);
  schedule_ = generate_schedule(schedule_spec(cfg, l, geometry_));
  // The runtime executes the table as given and pairs transfers by their per-peer order: a table that fails
  // the validator would hang or mis-pair, so it is refused before the first step (a bug in the generator).
  if (const std::vector<std::string> problems = validate_schedule(schedule_); !problems.empty())
    throw std::logic_error("the generated pipeline schedule is invalid (" + std::to_string(problems.size()) +
                           " problems), first: " + problems.front());
  const auto peers = grid.ring_peers(rank, Axis::pp);
  runtime_ = std::make_unique<PipelineRuntime>(by_chunk, pp_, grid.index_in_group(peers.prev, GroupKind::pp),
                                               grid.index_in_group(peers.next, GroupKind::pp), placement_of(cfg),
                                               sends_known_received(schedule_)[coord_.pp],
                                               sends_known_received(schedule_, /*forward_only=*/true)[coord_.pp]);
}

template <class T>
std::int64_t Trainer<T>::activation_bytes() const {
  std::int64_t n = ws_.bytes() + cpctx_.bytes();
  for (const auto& s : stages_) n += s->allocated_bytes();
  return n;
}

template <class T>
std::int64_t Trainer<T>::saved_activation_bytes() const {
  std::int64_t n = 0;
  for (const auto& s : stages_) n += s->allocated_bytes();
  return n;
}

template <class T>
void Trainer<T>::init_params() {
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    if (!store_.holds(static_cast<int>(u))) continue;
    std::vector<T> buf(static_cast<std::size_t>(table_.units[u].size));
    init_unit(buf.data(), table_.units[u], cfg_.training.seed, cfg_.model.layers);
    store_.write_unit<T>(static_cast<int>(u), buf.data());
  }
}

template <class T>
std::vector<std::pair<std::string, std::vector<T>>> Trainer<T>::gather_params() {
  std::vector<std::vector<T>> units(table_.units.size());
  for (std::size_t u = 0; u < table_.units.size(); ++u)
    if (store_.holds(static_cast<int>(u))) units[u] = store_.read_unit<T>(static_cast<int>(u));
  return assemble(units);
}

template <class T>
std::vector<std::pair<std::string, std::vector<T>>> Trainer<T>::gather_grads() {
  std::vector<std::vector<T>> units(table_.units.size());
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    const int uu = static_cast<int>(u);
    if (!store_.holds(uu)) continue;
    Comm& g = store_.group(uu);
    std::vector<T> full(static_cast<std::size_t>(store_.shard_len(uu) * g.size()));
    const std::vector<T> shard = store_.read_grad_shard<T>(uu);
    g.all_gather(shard.data(), full.data(), store_.shard_len(uu));
    full.resize(static_cast<std::size_t>(table_.units[u].size));
    units[u] = std::move(full);
  }
  return assemble(units);
}

template <class T>
std::vector<std::pair<std::string, std::vector<T>>> Trainer<T>::assemble(const std::vector<std::vector<T>>& units) {
  std::vector<std::pair<std::string, std::vector<T>>> out;
  const int p = tp_.size();
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    const bool held = store_.holds(static_cast<int>(u));
    for (const TensorSlot& t : table_.units[u].tensors) {
      std::vector<T> full(static_cast<std::size_t>(t.rows * t.cols));
      if (held) {
        const T* local = units[u].data() + t.offset;
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
      }
      // An expert's EP rank gives it to the other EP ranks of its stage.
      if (table_.is_expert_unit(static_cast<int>(u))) {
        const int j = (static_cast<int>(u) - table_.expert_unit(0, 0)) % table_.experts;
        groups_[GroupKind::ep].broadcast(host_buf(full.data(), static_cast<std::int64_t>(full.size())),
                                         j / (table_.experts / grid_.layout().ep));
      }
      // The pipeline rank holding the unit gives it to the others (pp rank r is rank r of the pp group).
      pp_.broadcast(host_buf(full.data(), static_cast<std::int64_t>(full.size())), unit_owner_[u]);
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
  // A Hugging Face model directory (its config.json checked against [model]) or one safetensors file.
  std::unique_ptr<HfModelDir> dir;
  std::unique_ptr<SafetensorsFile> file;
  if (is_hf_model_dir(path)) {
    dir = std::make_unique<HfModelDir>(path, cfg_.model);
  } else {
    file = std::make_unique<SafetensorsFile>(path);
  }
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    if (!store_.holds(static_cast<int>(u))) continue;
    std::vector<T> buf(static_cast<std::size_t>(table_.units[u].size));
    for (const TensorSlot& t : table_.units[u].tensors) {
      const std::vector<T> full = dir ? dir->read<T>(t.name, t.shape()) : file->read<T>(t.name, t.shape());
      for (std::int64_t i = 0; i < t.numel(); ++i) buf[t.offset + i] = full[t.global_index(i)];
    }
    store_.write_unit<T>(static_cast<int>(u), buf.data());
  }
}

template <class T>
StepStats Trainer<T>::step(int s, const SampleSource& data) {
  const auto t0 = std::chrono::steady_clock::now();
  const TrainingSpec& tr = cfg_.training;
  const BatchGeometry& g = geometry_;
  const double inv_tokens = loss_normalizer(tr);
  const std::int64_t S = g.seq_len, Sl = g.tokens_per_cp_rank;

  // Micro-batch j of this data-parallel rank: of each of its sequences, the tokens of this CP rank.
  auto load = [&](int j, Buf mb_ids, Buf mb_targets) {
    for (std::int64_t b = 0; b < g.micro_batch_size; ++b)
      data.tokens(g.sequence_index(s, coord_.dp, j, b), read_pos_.data(), Sl, ids_host_.data() + b * Sl,
                  targets_host_.data() + b * Sl);
    backend_->upload(mb_ids, ids_host_.data());
    backend_->upload(mb_targets, targets_host_.data());
  };

  StepStats st;
  if (table_.experts > 0) moe_stats_.reset(table_.layers, table_.experts, pooled_microbatches());
  store_.zero_grads(static_cast<int>(g.microbatches));
  // The phases of a traced step (--trace; nothing recorded otherwise): pipeline, grad_sync, norm_loss, optimizer.
  trace::Span pipeline_phase("pipeline");
  const std::vector<double> losses =
      runtime_->run(schedule_.ranks[coord_.pp], static_cast<int>(g.microbatches), load, inv_tokens, &st.pipeline);
  pipeline_phase.end();
  trace::Span sync_phase("grad_sync");
  store_.reduce_grads();
  sync_phase.end();
  trace::Span norm_phase("norm_loss");

  // Global gradient norm over every unit of every stage: per unit, each data-parallel rank its ZeRO
  // shard region (summed over the unit's group), each tensor-parallel shard once (replicated tensors
  // only from tp rank 0); units of other stages are zero here and come from their stage (adding zeros
  // is exact); then the units in table order. Double sums in a fixed order.
  std::vector<double> sq(table_.units.size(), 0.0);
  for (std::size_t u = 0; u < table_.units.size(); ++u) {
    const int uu = static_cast<int>(u);
    if (!store_.holds(uu)) continue;
    std::vector<bool> include;
    for (const TensorSlot& t : table_.units[u].tensors) include.push_back(t.split != Split::replicated || tp_.rank() == 0);
    sq[u] = store_.grad_sumsq(uu, include);
    store_.group(uu).all_reduce(&sq[u], 1);
  }
  if (table_.experts > 0) {  // an expert's unit is held on one EP rank of its stage: the others add zeros
    std::vector<double> e(sq.size(), 0.0);
    for (std::size_t u = 0; u < sq.size(); ++u)
      if (table_.is_expert_unit(static_cast<int>(u))) e[u] = sq[u];
    groups_[GroupKind::ep].all_reduce(e.data(), static_cast<std::int64_t>(e.size()));
    for (std::size_t u = 0; u < sq.size(); ++u)
      if (table_.is_expert_unit(static_cast<int>(u))) sq[u] = e[u];
  }
  tp_.all_reduce(sq.data(), static_cast<std::int64_t>(sq.size()));
  pp_.all_reduce(sq.data(), static_cast<std::int64_t>(sq.size()));
  double sumsq = 0;
  for (double x : sq) sumsq += x;
  // Loss: the last stage's micro-batches in order, summed over data-parallel ranks, then to every stage.
  double loss_sum = 0;
  for (double l : losses) loss_sum += l;
  dp_.all_reduce(&loss_sum, 1);
  pp_.all_reduce(&loss_sum, 1);
  // The clip factor comes from the norm rounded to fp32, so layouts whose double sums differ in the
  // last bits (different shard boundaries) still agree on it.
  const double norm = std::sqrt(sumsq);
  const double norm_for_clip = static_cast<float>(norm);
  const double clip = (tr.grad_clip > 0 && norm_for_clip > tr.grad_clip) ? tr.grad_clip / norm_for_clip : 1.0;

  norm_phase.end();
  st.step = s + 1;
  st.lr = lr_at(tr, s);
  kc::AdamW hp{st.lr, tr.beta1, tr.beta2, tr.adam_eps, tr.weight_decay, s + 1, clip};
  trace::Span optimizer_phase("optimizer");
  store_.adam_step(hp);
  optimizer_phase.end();

  if (table_.experts > 0) {
    // "hf": the micro-batches' pooled aux (all layers) counts as layer 0's.
    if (epctx_.pooled) moe_stats_.aux[0] = pooled_aux_loss(epctx_);
    // Every CP rank of a sequence computed the same aux (its statistics were summed over CP), every TP
    // rank too: count CP rank 0's, per layer summed over data-parallel ranks (in rank = micro-batch
    // order) and stages, then the layers in order: the single process's sum with one micro-batch per rank.
    const std::size_t L = moe_stats_.aux.size();
    std::vector<double> agg(L + moe_stats_.expert_tokens.size(), 0.0);
    if (coord_.cp == 0) {
      for (std::size_t l = 0; l < L; ++l) agg[l] = moe_stats_.aux[l];
      for (std::size_t i = 0; i < moe_stats_.expert_tokens.size(); ++i) agg[L + i] = static_cast<double>(moe_stats_.expert_tokens[i]);
    }
    dp_.all_reduce(agg.data(), static_cast<std::int64_t>(agg.size()));
    pp_.all_reduce(agg.data(), static_cast<std::int64_t>(agg.size()));
    for (std::size_t l = 0; l < L; ++l) st.aux_loss += agg[l];
    double mx = 0, sum = 0;
    for (std::size_t i = L; i < agg.size(); ++i) {
      mx = std::max(mx, agg[i]);
      sum += agg[i];
    }
    st.expert_tokens_max = mx;
    st.expert_tokens_mean = sum / static_cast<double>(agg.size() - L);
    st.expert_tokens.assign(agg.begin() + static_cast<std::ptrdiff_t>(L), agg.end());
    st.expert_rank_imbalance = expert_rank_imbalance(st.expert_tokens, table_.experts, epctx_.local);
    st.a2a_bytes = moe_stats_.a2a_bytes;
  }
  st.loss = loss_sum * inv_tokens;
  st.grad_norm = norm;  // unrounded (the metrics' value); the clip factor used its fp32 rounding
  st.comm_exposed_ms = store_.take_comm_exposed_ms();
  st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  st.tokens_per_s = static_cast<double>(g.global_batch * S) / (st.ms / 1000.0);
  return st;
}

template <class T>
double Trainer<T>::evaluate(const SampleSource& data, int batches) {
  const BatchGeometry& g = geometry_;
  const std::int64_t Sl = g.tokens_per_cp_rank;
  // Per batch as a step sums its loss (micro-batches in order, then data-parallel ranks, then stages), so a
  // layout whose training loss equals the single process's bit for bit has the same validation loss too.
  std::vector<double> sums(static_cast<std::size_t>(batches), 0.0);
  for (int b = 0; b < batches; ++b) {
    auto load = [&](int j, Buf mb_ids, Buf mb_targets) {
      for (std::int64_t r = 0; r < g.micro_batch_size; ++r)
        data.tokens(g.sequence_index(b, coord_.dp, j, r), read_pos_.data(), Sl, ids_host_.data() + r * Sl,
                    targets_host_.data() + r * Sl);
      backend_->upload(mb_ids, ids_host_.data());
      backend_->upload(mb_targets, targets_host_.data());
    };
    // The step's own action list, forward only.
    for (double l : runtime_->run(schedule_.ranks[coord_.pp], static_cast<int>(g.microbatches), load, 0.0, nullptr,
                                  /*forward_only=*/true))
      sums[static_cast<std::size_t>(b)] += l;
  }
  dp_.all_reduce(sums.data(), batches);
  pp_.all_reduce(sums.data(), batches);
  double loss = 0;
  for (double x : sums) loss += x * loss_normalizer(cfg_.training);
  return loss / batches;
}

double expert_rank_imbalance(const std::vector<double>& tokens, int experts, int local) {
  if (experts <= 0 || local <= 0 || tokens.empty()) return 0;
  const std::size_t E = static_cast<std::size_t>(experts), layers = tokens.size() / E;
  const int ranks = experts / local;
  double busiest = 0, mean = 0;
  for (std::size_t l = 0; l < layers; ++l) {
    double most = 0, all = 0;
    for (int r = 0; r < ranks; ++r) {
      double rows = 0;
      for (int j = 0; j < local; ++j) rows += tokens[l * E + static_cast<std::size_t>(r * local + j)];
      most = std::max(most, rows);
      all += rows;
    }
    busiest += most;
    mean += all / ranks;
  }
  return mean > 0 ? busiest / mean : 0;
}

template class Trainer<float>;
template class Trainer<double>;

}  // namespace meshrun::train
