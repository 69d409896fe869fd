#include "kernels/pass_plan.h"

#include <algorithm>

#include "core/attention/unit_states.h"
#include "core/tensor/dtype.h"
#include "kernels/math/split_merge.h"
#include "kernels/math/widen.h"

namespace attnaudit {
namespace cuda_internal {
namespace {

int64_t Align16(int64_t x) { return (x + 15) / 16 * 16; }

bool Fits(const PassParams& params, int64_t bytes) {
  const int64_t need = PassSharedBytes(params);
  return need >= 0 && need <= bytes;
}

}  // namespace

void PoolStrides(KvLayout layout, const SnapshotDims& d, int64_t* row,
                 int64_t* head) {
  *row = layout == KvLayout::kNHD ? d.kv_heads * d.head_dim : d.head_dim;
  *head = layout == KvLayout::kNHD ? d.head_dim : d.page_size * d.head_dim;
}

int CopyWidth(int64_t k_row_bytes, int64_t v_row_bytes) {
  for (int w : {16, 8, 4}) {
    if (k_row_bytes % w == 0 && v_row_bytes % w == 0) return w;
  }
  return 1;
}

PassParams BaseParams(const PreparedAttention& p, const PassInputs& in) {
  const SnapshotDims& d = p.dims;
  PassParams params;
  params.k_base = in.k;
  params.v_base = in.v;
  params.k_dtype = static_cast<int>(p.k_dtype);
  params.v_dtype = static_cast<int>(p.v_dtype);
  PoolStrides(p.k_layout, d, &params.k_row_stride, &params.k_head_stride);
  PoolStrides(p.v_layout, d, &params.v_row_stride, &params.v_head_stride);
  params.positions = in.positions;
  params.q = in.q;
  params.query_positions = in.query_positions;
  params.k_scale = in.k_scale;
  params.queries = d.queries;
  params.q_heads = d.q_heads;
  params.kv_heads = d.kv_heads;
  params.head_dim = d.head_dim;
  params.max_run = d.page_size;
  params.softmax_scale = p.softmax_scale;
  params.softcap = p.softcap;
  params.window = p.window;
  params.window_inclusive = p.window_inclusive ? 1 : 0;
  params.unit_base = in.unit_base;
  params.copy_width = CopyWidth(d.head_dim * DTypeSize(p.k_dtype),
                                d.head_dim * DTypeSize(p.v_dtype));
  return params;
}

std::vector<int64_t> UnitBase(const PreparedAttention& p) {
  std::vector<int64_t> base(p.units.size() + 1, 0);
  for (size_t b = 0; b < p.units.size(); ++b) {
    base[b + 1] = base[b] + static_cast<int64_t>(p.units[b].size());
  }
  return base;
}

PoolRuns PlanPoolRuns(const PreparedAttention& p) {
  const SnapshotDims& d = p.dims;
  const int64_t page_elems = d.page_size * d.kv_heads * d.head_dim;
  PoolRuns out;
  out.row_runs.push_back(0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t L = p.layout->seq_lens[b];
    const int64_t blocks = (L + d.page_size - 1) / d.page_size;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t page = p.layout->block_pages[b][blk];
      PassRun run;
      run.k_offset = page * page_elems * DTypeSize(p.k_dtype);
      run.v_offset = page * page_elems * DTypeSize(p.v_dtype);
      run.pos_offset = page * d.page_size;
      run.n =
          static_cast<int32_t>(std::min(d.page_size, L - blk * d.page_size));
      run.unit_begin = static_cast<int32_t>(out.units.size());
      for (int32_t u = p.block_unit_begin[b][blk];
           u < p.block_unit_begin[b][blk + 1]; ++u) {
        const KvUnit& unit = p.units[b][u];
        out.units.push_back({u, unit.first, unit.count, 0});
      }
      run.unit_end = static_cast<int32_t>(out.units.size());
      out.runs.push_back(run);
    }
    out.row_runs.push_back(static_cast<int32_t>(out.runs.size()));
  }
  return out;
}

int64_t TotalUnits(const PreparedAttention& p) {
  int64_t n = 0;
  for (const auto& row : p.units) n += static_cast<int64_t>(row.size());
  return n;
}

TreeShape TreeShapeOf(const PreparedAttention& p) {
  int64_t most = 0;
  for (const auto& row : p.units) {
    most = std::max<int64_t>(most, static_cast<int64_t>(row.size()));
  }
  TreeShape t;
  t.block = kmath::TreeBlockUnits(most);
  t.blocks = std::max<int64_t>(1, (most + t.block - 1) / t.block);
  return t;
}

PassLayout MakePassLayout(const PassParams& p) {
  const int64_t D = p.head_dim;
  const int64_t S = p.runs_per_stage;
  const int64_t T = S * p.max_run;  // stage tokens; also its most units
  const int64_t group = TileHeads(p);
  const int64_t qpb = p.queries_per_block;
  const int64_t rows = group * qpb;
  const bool r64 = p.reference || p.store_r_states;
  const bool p32 = p.store_p_states;
  PassLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t here = at;
    at += Align16(bytes);
    return static_cast<int32_t>(here);
  };
  l.raw_k = take(T * D * kmath::ElemBytes(p.k_dtype));
  l.raw_v = take(T * D * kmath::ElemBytes(p.v_dtype));
  l.k32 = take(T * D * 4);
  l.v32 = take(T * D * 4);
  l.k64 = take(p.k_dtype == kmath::kElemF64 ? T * D * 8 : 0);
  l.v64 = take(p.v_dtype == kmath::kElemF64 ? T * D * 8 : 0);
  l.q32 = take(p32 ? rows * D * 4 : 0);
  l.q64 = take(r64 ? rows * D * 8 : 0);
  l.vis = take(qpb * T * 4);
  l.vcount = take(qpb * S * 4);
  l.run_n = take(S * 4);
  l.tok = take(T * 4);
  l.units = take(T * static_cast<int64_t>(sizeof(PassUnit)));
  l.s32 = take(p32 ? rows * T * 4 : 0);
  l.e32 = take(p32 ? rows * T * 4 : 0);
  l.s64 = take(r64 ? rows * T * 8 : 0);
  l.e64 = take(p.reference ? rows * T * 8 : 0);
  l.re64 = take(p.store_r_states ? rows * T * 8 : 0);
  l.r_acc = take(p.reference ? rows * D * 8 : 0);
  l.r_m = take(p.reference ? rows * 8 : 0);
  l.r_l = take(p.reference ? rows * 8 : 0);
  l.total = at < (int64_t{1} << 31) ? static_cast<int32_t>(at) : -1;
  return l;
}

int64_t PassSharedBytes(const PassParams& params) {
  return MakePassLayout(params).total;
}

bool FitPassToSharedMemory(PassParams* params, int64_t max_shared,
                           int64_t max_stage_runs) {
  params->runs_per_stage = 1;
  params->head_tiles = 1;
  int64_t qpb = std::max<int64_t>(1, params->queries);
  for (; qpb >= 1; qpb = qpb == 1 ? 0 : (qpb + 1) / 2) {
    params->queries_per_block = qpb;
    if (Fits(*params, max_shared)) break;
  }
  if (qpb < 1) {
    // One query position of the whole group is too much: tile the heads.
    params->queries_per_block = 1;
    const int64_t group = params->q_heads / params->kv_heads;
    int64_t tiles = 2;
    for (; tiles <= group; ++tiles) {
      params->head_tiles = tiles;
      if (Fits(*params, max_shared)) break;
    }
    if (tiles > group) {
      params->head_tiles = 1;
      return false;
    }
    // The fewest tiles of that many heads (no tile left empty).
    params->head_tiles = (group + TileHeads(*params) - 1) / TileHeads(*params);
  }
  // Two blocks on a multiprocessor (its shared memory is the opt-in block
  // limit plus 1 KB, less 1 KB reserved per block): one block's barriers
  // and one-thread steps leave it idle otherwise.
  const int64_t half = max_shared / 2 - 1024;
  int64_t most = std::max<int64_t>(
      1, kPassStageTokens / std::max<int64_t>(1, params->max_run));
  if (max_stage_runs > 0) most = std::min(most, max_stage_runs);
  for (int64_t runs = most; runs > 1; --runs) {
    params->runs_per_stage = runs;
    if (Fits(*params, half)) break;
  }
  if (!Fits(*params, half)) params->runs_per_stage = 1;
  return true;
}

KernelGrid FusedPassGrid(const PassParams& params) {
  const int64_t chunks = (params.queries + params.queries_per_block - 1) /
                         params.queries_per_block;
  KernelGrid grid;
  grid.x = static_cast<uint32_t>(params.rows * params.splits);
  grid.y = static_cast<uint32_t>(params.kv_heads);
  grid.z = static_cast<uint32_t>(chunks * params.head_tiles);
  return grid;
}

void PlanSplits(const PoolRuns& plan, int multiprocessors, int64_t max_splits,
                int64_t free_bytes, PassParams* params) {
  const int64_t chunks = (params->queries + params->queries_per_block - 1) /
                         params->queries_per_block;
  int64_t max_row_runs = 0;
  for (size_t b = 0; b + 1 < plan.row_runs.size(); ++b) {
    max_row_runs = std::max<int64_t>(max_row_runs,
                                     plan.row_runs[b + 1] - plan.row_runs[b]);
  }
  // About eight blocks per multiprocessor: several waves of those that fit
  // at once, so uneven rows leave a short tail.
  params->splits = kmath::SplitsFor(
      params->rows * params->kv_heads * chunks * params->head_tiles,
      max_row_runs, 8 * int64_t{multiprocessors});
  if (max_splits > 0) params->splits = std::min(params->splits, max_splits);
  if (params->splits <= 1) return;
  const int64_t extra = kmath::SplitExtraBytes(
      params->splits, params->rows * params->queries * params->q_heads,
      params->head_dim, params->reference != 0);
  if (extra > free_bytes / 2) {
    params->splits = 1;
    return;
  }
  // Query indices count from row 0, whatever row_begin.
  params->r_split_stride =
      (params->row_begin + params->rows) * params->queries * params->q_heads;
}

bool PlanPoolPass(const PreparedAttention& p, const PassInputs& in,
                  const PoolRuns& plan, AttentionPasses passes,
                  bool unit_states, bool r_states, const PassDevice& device,
                  PassParams* params, PassWants* wants) {
  *params = BaseParams(p, in);
  params->rows = p.dims.batch;
  wants->reference = passes != AttentionPasses::kReplayOnly;
  wants->replay = passes != AttentionPasses::kReferenceOnly;
  params->reference = wants->reference ? 1 : 0;
  params->specialized = device.specialized ? 1 : 0;
  params->store_p_states = wants->replay || unit_states ? 1 : 0;
  params->store_r_states = unit_states && r_states ? 1 : 0;
  if (!FitPassToSharedMemory(params, device.max_shared,
                             device.max_stage_runs)) {
    return false;
  }
  PlanSplits(plan, device.multiprocessors, device.max_splits, device.free_bytes,
             params);
  return true;
}

PassOutputCounts CountPassOutputs(const PreparedAttention& p,
                                  const PassParams& params) {
  const SnapshotDims& d = p.dims;
  PassOutputCounts n;
  n.queries = d.batch * d.queries * d.q_heads;
  if (params.store_p_states || params.store_r_states) {
    n.states = TotalUnits(p) * d.queries * d.q_heads;
  }
  if (params.store_p_states) n.tree_roots = n.queries * TreeShapeOf(p).blocks;
  if (params.splits > 1 && params.reference) {
    n.r_parts = params.splits * n.queries;
  }
  return n;
}

void BindOutputs(const PassOutputs& out, PassParams* params) {
  const bool split = params->splits > 1;
  params->r_acc = split ? out.r_part_acc : out.r_acc;
  params->r_m = split ? out.r_part_m : out.r_m;
  params->r_l = split ? out.r_part_l : out.r_l;
  params->p_state_present = out.p_state_present;
  params->p_state_out = out.p_state_out;
  params->p_state_lse = out.p_state_lse;
  params->r_state_out = out.r_state_out;
  params->r_state_lse = out.r_state_lse;
  params->kv_non_finite = out.kv_non_finite;
}

SplitMergeParams MergeParamsOf(const PreparedAttention& p,
                               const PassParams& params, const PassWants& wants,
                               const PassOutputs& out) {
  SplitMergeParams m;
  m.row_begin = params.row_begin;
  m.rows = params.rows;
  m.queries = params.queries;
  m.q_heads = params.q_heads;
  m.head_dim = params.head_dim;
  if (wants.replay) {
    m.unit_base = params.unit_base;
    m.p_state_out = out.p_state_out;
    m.p_state_lse = out.p_state_lse;
    m.p_state_present = out.p_state_present;
    m.p_out = out.p_out;
    m.p_lse = out.p_lse;
    const TreeShape tree = TreeShapeOf(p);
    m.tree_block = tree.block;
    m.tree_blocks = tree.blocks;
    m.tree_out = out.tree_out;
    m.tree_lse = out.tree_lse;
  }
  if (wants.reference && params.splits > 1) {
    m.splits = params.splits;
    m.r_split_stride = params.r_split_stride;
    m.r_part_acc = out.r_part_acc;
    m.r_part_m = out.r_part_m;
    m.r_part_l = out.r_part_l;
    m.r_acc = out.r_acc;
    m.r_m = out.r_m;
    m.r_l = out.r_l;
  }
  return m;
}

void FinishPassOutputs(const PreparedAttention& p, const PassWants& wants,
                       const double* r_acc, const double* r_m,
                       const double* r_l, float* p_out, const float* p_lse,
                       AttentionResults* res) {
  const SnapshotDims& d = p.dims;
  const int64_t queries = d.batch * d.queries * d.q_heads;
  const int64_t D = d.head_dim;
  for (int64_t qi = 0; qi < queries; ++qi) {
    const int64_t h = qi % d.q_heads;
    if (wants.reference) {
      FinishReferenceState(p, h, &r_acc[qi * D], r_m[qi], r_l[qi],
                           &res->reference_out[qi * D],
                           &res->reference_lse[qi]);
    }
    if (wants.replay) {
      FinishReplayState(p, h, &p_out[qi * D], p_lse[qi],
                        &res->replay_out[qi * D], &res->replay_lse[qi]);
    }
  }
}

}  // namespace cuda_internal
}  // namespace attnaudit
