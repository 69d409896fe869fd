#include "tests/unit/kernels/host_pass.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/pass_plan.h"
// The kernels' source, last: it needs CUDA's spellings.
#include "tests/unit/kernels/simt_cuda_builtins.h"
// clang-format off
#include "kernels/attention_device.inc"
// clang-format on

namespace attnaudit {
namespace testing {
namespace {

using cuda_internal::PassOutputs;
using cuda_internal::PassParams;

// Host stand-ins for the pool's buffers: what the backend does not clear
// starts as NaN, as if a previous job had left garbage there.
struct HostBuffers {
  std::vector<double> r_acc, r_m, r_l, r_part_acc, r_part_m, r_part_l;
  std::vector<double> r_state_out, r_state_lse;
  std::vector<float> p_out, p_lse, p_state_out, p_state_lse, tree_out, tree_lse;
  std::vector<unsigned char> p_state_present;
  int kv_non_finite = 0;
};

template <typename T>
T* Garbage(std::vector<T>* v, int64_t n) {
  v->assign(static_cast<size_t>(n), std::numeric_limits<T>::quiet_NaN());
  return n > 0 ? v->data() : nullptr;
}

// AllocateOutputs's buffers, on the host.
PassOutputs Allocate(const PreparedAttention& p, const PassParams& params,
                     const cuda_internal::PassWants& wants, HostBuffers* h) {
  const int64_t D = p.dims.head_dim;
  const cuda_internal::PassOutputCounts n =
      cuda_internal::CountPassOutputs(p, params);
  PassOutputs o;
  if (n.r_parts > 0) {
    o.r_part_acc = Garbage(&h->r_part_acc, n.r_parts * D);
    o.r_part_m = Garbage(&h->r_part_m, n.r_parts);
    o.r_part_l = Garbage(&h->r_part_l, n.r_parts);
  }
  if (params.store_p_states) {
    h->p_state_present.assign(static_cast<size_t>(n.states), 0);
    o.p_state_present = h->p_state_present.data();
    o.tree_out = Garbage(&h->tree_out, n.tree_roots * D);
    o.tree_lse = Garbage(&h->tree_lse, n.tree_roots);
    o.p_state_out = Garbage(&h->p_state_out, n.states * D);
    o.p_state_lse = Garbage(&h->p_state_lse, n.states);
  }
  if (wants.reference) {
    o.r_acc = Garbage(&h->r_acc, n.queries * D);
    o.r_m = Garbage(&h->r_m, n.queries);
    o.r_l = Garbage(&h->r_l, n.queries);
  }
  if (wants.replay) {
    o.p_out = Garbage(&h->p_out, n.queries * D);
    o.p_lse = Garbage(&h->p_lse, n.queries);
  }
  if (params.store_r_states) {
    o.r_state_out = Garbage(&h->r_state_out, n.states * D);
    o.r_state_lse = Garbage(&h->r_state_lse, n.states);
  }
  o.kv_non_finite = &h->kv_non_finite;
  return o;
}

template <typename T, typename V>
void CopyInto(const V& from, T* to) {
  if (to != nullptr) std::memcpy(to, from.data(), from.size() * sizeof(T));
}

template <typename T, typename V>
void CopyOut(const T* from, V* to) {
  if (from != nullptr) std::memcpy(to->data(), from, to->size() * sizeof(T));
}

}  // namespace

absl::StatusOr<HostPassRun> RunPassOnHost(const PreparedAttention& p,
                                          UnitStates* states,
                                          const HostPassOptions& options) {
  const SnapshotDims& d = p.dims;
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < d.num_pages * d.page_size; ++i) {
    positions.push_back(p.snapshot->slot_positions.IntAt(i));
  }
  const std::vector<int64_t> unit_base = cuda_internal::UnitBase(p);
  cuda_internal::PassInputs in;
  in.k = static_cast<const char*>(p.k_data);
  in.v = static_cast<const char*>(p.v_data);
  in.positions = positions.data();
  in.q = p.q.data();
  in.query_positions = p.query_positions.data();
  in.k_scale = p.k_scale.data();
  in.unit_base = unit_base.data();

  const cuda_internal::PoolRuns plan = cuda_internal::PlanPoolRuns(p);
  HostPassRun run;
  PassParams& params = run.params;
  cuda_internal::PassDevice device;
  device.max_shared = options.max_shared;
  device.multiprocessors = options.multiprocessors;
  device.free_bytes = options.free_bytes;
  device.max_splits = options.max_splits;
  device.max_stage_runs = options.max_stage_runs;
  device.specialized = options.specialized;
  cuda_internal::PassWants wants;
  if (!cuda_internal::PlanPoolPass(p, in, plan, options.passes,
                                   states != nullptr,
                                   states != nullptr && states->has_reference,
                                   device, &params, &wants)) {
    return absl::UnimplementedError("the pass does not fit shared memory");
  }
  params.runs = plan.runs.data();
  params.units = plan.units.data();
  params.row_runs = plan.row_runs.data();
  HostBuffers buffers;
  const PassOutputs out = Allocate(p, params, wants, &buffers);
  if (states != nullptr) {
    states->Reset(p.units, d, states->has_reference);
    CopyInto(states->p_out, out.p_state_out);
    CopyInto(states->p_lse, out.p_state_lse);
    CopyInto(states->r_out, out.r_state_out);
    CopyInto(states->r_lse, out.r_state_lse);
  }
  cuda_internal::BindOutputs(out, &params);

  simt::SetThreadOrder(options.order);
  simt::Launcher launcher;
  absl::Status s = cuda_internal::RunFusedPass(params, launcher);
  if (s.ok() && (wants.replay || params.splits > 1)) {
    cuda_internal::SplitMergeParams m =
        cuda_internal::MergeParamsOf(p, params, wants, out);
    m.tree_every_level = options.tree_every_level ? 1 : 0;
    s = cuda_internal::RunSplitMerge(m, launcher);
  }
  if (!s.ok()) return s;

  AttentionResults& res = run.results;
  const size_t n_out =
      static_cast<size_t>(d.batch * d.queries * d.q_heads * d.head_dim);
  const size_t n_lse = static_cast<size_t>(d.batch * d.queries * d.q_heads);
  res.reference_out.assign(n_out, 0.0);
  res.replay_out.assign(n_out, 0.0);
  res.reference_lse.assign(n_lse, 0.0);
  res.replay_lse.assign(n_lse, 0.0);
  cuda_internal::FinishPassOutputs(p, wants, out.r_acc, out.r_m, out.r_l,
                                   out.p_out, out.p_lse, &res);
  if (states != nullptr) {
    CopyOut(out.p_state_out, &states->p_out);
    CopyOut(out.p_state_lse, &states->p_lse);
    CopyOut(out.r_state_out, &states->r_out);
    CopyOut(out.r_state_lse, &states->r_lse);
  }
  res.kv_non_finite = buffers.kv_non_finite != 0;
  SummariseUnits(p, options.record_merge_orders, &res);
  run.launches = launcher.launches();
  return run;
}

absl::Status RunGatherOnHost(const cuda_internal::GatherParams& params) {
  simt::Launcher launcher;
  return cuda_internal::RunGather(params, launcher);
}

}  // namespace testing
}  // namespace attnaudit
