// Phase 1 of snapshot validation: everything that can be decided from
// dtypes, shapes and byte counts alone. Runs before anything reads an
// element or allocates in proportion to the input, so a hostile header
// (a shape of 2^62 elements, a byte count that disagrees with the shape)
// is rejected for O(1) work.
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/validate/validate_internal.h"

namespace attnaudit {
namespace validate_internal {
namespace {

enum class Kind { kFloating, kInteger, kF32, kBool };

struct TensorRule {
  const char* field;
  const Tensor* tensor;
  bool required;
  Kind kind;
  int rank;               // -1: checked later (k_scale / v_scale: 0 or 1)
  const char* signature;  // what the rank message prints
};

std::vector<TensorRule> Rules(const Snapshot& s) {
  return {
      {"q", &s.q, true, Kind::kFloating, 4, "[B, Sq, Hq, D]"},
      {"k_pages", &s.k_pages, true, Kind::kFloating, 4,
       "[N, P, Hkv, D] (NHD) or [N, Hkv, P, D] (HND)"},
      {"v_pages", &s.v_pages, true, Kind::kFloating, 4,
       "[N, P, Hkv, D] (NHD) or [N, Hkv, P, D] (HND)"},
      {"block_table", &s.block_table, true, Kind::kInteger, 2, "[B, M]"},
      {"kv_seq_lens", &s.kv_seq_lens, true, Kind::kInteger, 1, "[B]"},
      {"query_positions", &s.query_positions, true, Kind::kInteger, 2,
       "[B, Sq]"},
      {"slot_positions", &s.slot_positions, true, Kind::kInteger, 2, "[N, P]"},
      {"key_rope_positions", &s.key_rope_positions, false, Kind::kInteger, 2,
       "[N, P]"},
      {"page_ids", &s.page_ids, false, Kind::kInteger, 1, "[N]"},
      {"k_scale", &s.k_scale, false, Kind::kF32, -1, "[] or [Hkv]"},
      {"v_scale", &s.v_scale, false, Kind::kF32, -1, "[] or [Hkv]"},
      {"sinks", &s.sinks, false, Kind::kF32, 1, "[Hq]"},
      {"cp.block_owners", &s.cp.block_owners, false, Kind::kInteger, 2,
       "[B, M]"},
      {"cp.rank_out", &s.cp.rank_out, false, Kind::kFloating, 5,
       "[world, B, Sq, Hq, D]"},
      {"cp.rank_lse", &s.cp.rank_lse, false, Kind::kFloating, 4,
       "[world, B, Sq, Hq]"},
      {"engine.out", &s.engine.out, false, Kind::kFloating, 4,
       "[B, Sq, Hq, D]"},
      {"engine.lse", &s.engine.lse, false, Kind::kFloating, 3, "[B, Sq, Hq]"},
      {"engine.logprobs", &s.engine.logprobs, false, Kind::kFloating, 2,
       "[B, Sq]"},
      {"selected_token_ids", &s.selected_token_ids, false, Kind::kInteger, 2,
       "[B, Sq]"},
      {"lm_head", &s.lm_head, false, Kind::kFloating, 2, "[V, Hq*D]"},
      {"active_mask", &s.active_mask, false, Kind::kBool, 2, "[B, Sq]"},
      {"pre_rope.q", &s.pre_rope.q, false, Kind::kFloating, 4,
       "[B, Sq, Hq, D]"},
      {"pre_rope.k", &s.pre_rope.k, false, Kind::kFloating, 4,
       "[B, Sq, Hkv, D]"},
      {"rope_table.inv_freq", &s.rope_table.inv_freq, false, Kind::kF32, 1,
       "[rotary_dim / 2]"},
      {"rope_table.positions", &s.rope_table.positions, false, Kind::kInteger,
       1, "[T]"},
      {"rope_table.cos", &s.rope_table.cos, false, Kind::kFloating, 2,
       "[T, rotary_dim / 2]"},
      {"rope_table.sin", &s.rope_table.sin, false, Kind::kFloating, 2,
       "[T, rotary_dim / 2]"},
  };
}

absl::Status CheckKind(const TensorRule& r) {
  const DType dt = r.tensor->dtype();
  switch (r.kind) {
    case Kind::kFloating:
      if (!IsFloating(dt)) {
        return Invalid(r.field, "must use a floating-point dtype, got ",
                       DTypeName(dt));
      }
      break;
    case Kind::kInteger:
      if (dt != DType::kI32 && dt != DType::kI64) {
        return Invalid(r.field, "must contain integers (i32 or i64), got ",
                       DTypeName(dt));
      }
      break;
    case Kind::kF32:
      if (dt != DType::kF32) {
        return Invalid(r.field, "must be f32, got ", DTypeName(dt));
      }
      break;
    case Kind::kBool:
      if (dt != DType::kBool) {
        return Invalid(r.field, "must be bool, got ", DTypeName(dt));
      }
      break;
  }
  if (r.rank >= 0 && r.tensor->rank() != r.rank) {
    return Invalid(r.field, "must have shape ", r.signature, ", got ",
                   ShapeString(r.tensor->shape()));
  }
  return absl::OkStatus();
}

// One expected dimension: a name for the message and a value, or -1 for
// "any size".
struct Dim {
  const char* name;
  int64_t value;
};

absl::Status ExpectShape(absl::string_view field, const Tensor& t,
                         std::initializer_list<Dim> dims) {
  bool ok = t.rank() == static_cast<int>(dims.size());
  std::vector<std::string> parts;
  int i = 0;
  for (const Dim& d : dims) {
    if (d.value >= 0) {
      parts.push_back(absl::StrCat(d.name, "=", d.value));
      if (ok && t.dim(i) != d.value) ok = false;
    } else {
      parts.push_back(d.name);
    }
    ++i;
  }
  if (ok) return absl::OkStatus();
  return Invalid(field, "shape ", ShapeString(t.shape()), " must be [",
                 absl::StrJoin(parts, ", "), "]");
}

absl::Status CheckLimit(absl::string_view field, absl::string_view what,
                        int64_t value, absl::string_view limit_name,
                        int64_t limit) {
  if (value <= limit) return absl::OkStatus();
  return Invalid(field, what, " ", value, " exceeds limits.", limit_name, "=",
                 limit);
}

// ExpectShape for an optional tensor: absent is fine.
absl::Status ExpectShapeIfPresent(absl::string_view field, const Tensor& t,
                                  std::initializer_list<Dim> dims) {
  if (!t.present()) return absl::OkStatus();
  return ExpectShape(field, t, dims);
}

// Presence first: the most useful message for an empty request.
absl::Status CheckPresence(const std::vector<TensorRule>& rules) {
  for (const TensorRule& r : rules) {
    if (r.required && !r.tensor->present()) {
      return Invalid(r.field, "is required but missing");
    }
  }
  return absl::OkStatus();
}

// Byte layouts and size caps, before any dim is trusted; then dtypes and
// ranks.
absl::Status CheckBytesAndKinds(const std::vector<TensorRule>& rules,
                                const ValidationLimits& limits) {
  int64_t total = 0;
  for (const TensorRule& r : rules) {
    const Tensor& t = *r.tensor;
    if (!t.present()) {
      if (!t.shape().empty() || !t.bytes().empty()) {
        return Invalid(r.field, "dtype is missing or unknown but shape ",
                       ShapeString(t.shape()), " and ", t.bytes().size(),
                       " bytes were given");
      }
      continue;
    }
    ATTNAUDIT_RETURN_IF_ERROR(t.CheckLayout(r.field, limits.max_tensor_bytes));
    const int64_t bytes = static_cast<int64_t>(t.bytes().size());
    total = bytes > std::numeric_limits<int64_t>::max() - total
                ? std::numeric_limits<int64_t>::max()
                : total + bytes;
  }
  if (total > limits.max_total_bytes) {
    return Invalid(
        "snapshot", "tensors total ", total,
        " bytes, more than limits.max_total_bytes=", limits.max_total_bytes);
  }
  for (const TensorRule& r : rules) {
    if (r.tensor->present()) ATTNAUDIT_RETURN_IF_ERROR(CheckKind(r));
  }
  return absl::OkStatus();
}

// kv_layout and q: [B, Sq, Hq, D], all positive and within the limits.
absl::Status CheckQuery(const Snapshot& s, const SnapshotDims& d,
                        const ValidationLimits& limits) {
  if (s.kv_layout != KvLayout::kNHD && s.kv_layout != KvLayout::kHND) {
    return Invalid("kv_layout", "unknown value ",
                   static_cast<int>(s.kv_layout));
  }
  for (int i = 0; i < 4; ++i) {
    if (s.q.dim(i) <= 0) {
      return Invalid("q", "shape ", ShapeString(s.q.shape()),
                     " must have positive dimensions [B, Sq, Hq, D]");
    }
  }
  ATTNAUDIT_RETURN_IF_ERROR(
      CheckLimit("q", "batch size", d.batch, "max_batch", limits.max_batch));
  // Rows are stamped with int32 indices; only reachable with lifted limits.
  if (d.batch > std::numeric_limits<int32_t>::max()) {
    return Invalid("q", "batch size ", d.batch, " exceeds the int32 range");
  }
  ATTNAUDIT_RETURN_IF_ERROR(CheckLimit("q", "queries per row", d.queries,
                                       "max_queries", limits.max_queries));
  ATTNAUDIT_RETURN_IF_ERROR(
      CheckLimit("q", "query heads", d.q_heads, "max_heads", limits.max_heads));
  return CheckLimit("q", "head dim", d.head_dim, "max_head_dim",
                    limits.max_head_dim);
}

// The page pools: K and V alike, page size, page count, KV heads, head dim
// and the GQA ratio.
absl::Status CheckPagePools(const Snapshot& s, const SnapshotDims& d,
                            const ValidationLimits& limits) {
  if (s.v_pages.dtype() != s.k_pages.dtype()) {
    return Invalid("v_pages", "dtype ", DTypeName(s.v_pages.dtype()),
                   " differs from k_pages dtype ",
                   DTypeName(s.k_pages.dtype()));
  }
  if (s.v_pages.shape() != s.k_pages.shape()) {
    return Invalid("v_pages", "shape ", ShapeString(s.v_pages.shape()),
                   " differs from k_pages shape ",
                   ShapeString(s.k_pages.shape()));
  }
  if (d.page_size <= 0) {
    return Invalid("k_pages", "page size must be a positive integer, got ",
                   d.page_size, " (shape ", ShapeString(s.k_pages.shape()),
                   ")");
  }
  ATTNAUDIT_RETURN_IF_ERROR(CheckLimit("k_pages", "page size", d.page_size,
                                       "max_page_size", limits.max_page_size));
  if (d.num_pages <= 0 || d.kv_heads <= 0) {
    return Invalid("k_pages", "shape ", ShapeString(s.k_pages.shape()),
                   " needs at least one page and one KV head");
  }
  if (d.num_pages > std::numeric_limits<int32_t>::max()) {
    return Invalid("k_pages", d.num_pages,
                   " pages exceed the int32 page index range");
  }
  const int64_t page_dim = s.k_pages.dim(3);
  if (page_dim != d.head_dim) {
    return Invalid("k_pages", "head dim ", page_dim,
                   " differs from q head dim ", d.head_dim);
  }
  if (d.q_heads % d.kv_heads != 0) {
    return Invalid("k_pages", "Hq=", d.q_heads,
                   " must be divisible by Hkv=", d.kv_heads);
  }
  return absl::OkStatus();
}

// The page table, lengths and positions.
absl::Status CheckTables(const Snapshot& s, const SnapshotDims& d,
                         const ValidationLimits& limits) {
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShape("block_table", s.block_table, {{"B", d.batch}, {"M", -1}}));
  ATTNAUDIT_RETURN_IF_ERROR(CheckLimit("block_table", "max blocks M",
                                       d.max_blocks, "max_blocks",
                                       limits.max_blocks));
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShape("kv_seq_lens", s.kv_seq_lens, {{"B", d.batch}}));
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShape("query_positions", s.query_positions,
                                        {{"B", d.batch}, {"Sq", d.queries}}));
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShape("slot_positions", s.slot_positions,
                  {{"N", d.num_pages}, {"P", d.page_size}}));
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShapeIfPresent("key_rope_positions", s.key_rope_positions,
                           {{"N", d.num_pages}, {"P", d.page_size}}));
  return ExpectShapeIfPresent("page_ids", s.page_ids, {{"N", d.num_pages}});
}

// fp8 scales (per tensor or per KV head) and attention sinks (per head).
absl::Status CheckScalesAndSinks(const Snapshot& s, const SnapshotDims& d) {
  for (const auto& [field, scale] :
       {std::pair<const char*, const Tensor*>{"k_scale", &s.k_scale},
        {"v_scale", &s.v_scale}}) {
    if (!scale->present()) continue;
    const bool per_tensor = scale->rank() == 0;
    const bool per_head = scale->rank() == 1 && scale->dim(0) == d.kv_heads;
    if (!per_tensor && !per_head) {
      return Invalid(field, "shape ", ShapeString(scale->shape()),
                     " must be [] (per tensor) or [Hkv=", d.kv_heads,
                     "] (per head)");
    }
  }
  return ExpectShapeIfPresent("sinks", s.sinks, {{"Hq", d.q_heads}});
}

// Context parallelism: the world size is a dimension of the rank tensors.
absl::Status CheckContextParallel(const Snapshot& s, const SnapshotDims& d,
                                  const ValidationLimits& limits) {
  const int64_t world = s.cp.world_size;
  if (world < 1) {
    return Invalid("cp.world_size", "must be >= 1, got ", world);
  }
  ATTNAUDIT_RETURN_IF_ERROR(CheckLimit("cp.world_size", "world size", world,
                                       "max_cp_world_size",
                                       limits.max_cp_world_size));
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShapeIfPresent("cp.block_owners", s.cp.block_owners,
                           {{"B", d.batch}, {"M", d.max_blocks}}));
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShapeIfPresent("cp.rank_out", s.cp.rank_out,
                                                 {{"world", world},
                                                  {"B", d.batch},
                                                  {"Sq", d.queries},
                                                  {"Hq", d.q_heads},
                                                  {"D", d.head_dim}}));
  return ExpectShapeIfPresent(
      "cp.rank_lse", s.cp.rank_lse,
      {{"world", world}, {"B", d.batch}, {"Sq", d.queries}, {"Hq", d.q_heads}});
}

// Engine outputs: shapes only (their values may legitimately drift).
absl::Status CheckEngineOutputs(const Snapshot& s, const SnapshotDims& d) {
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShapeIfPresent("engine.out", s.engine.out,
                                                 {{"B", d.batch},
                                                  {"Sq", d.queries},
                                                  {"Hq", d.q_heads},
                                                  {"D", d.head_dim}}));
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShapeIfPresent(
      "engine.lse", s.engine.lse,
      {{"B", d.batch}, {"Sq", d.queries}, {"Hq", d.q_heads}}));
  return ExpectShapeIfPresent("engine.logprobs", s.engine.logprobs,
                              {{"B", d.batch}, {"Sq", d.queries}});
}

// Selected-token log-prob inputs: ids, mask and the lm_head slice.
absl::Status CheckLogprobInputs(const Snapshot& s, const SnapshotDims& d,
                                const ValidationLimits& limits) {
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShapeIfPresent("selected_token_ids", s.selected_token_ids,
                           {{"B", d.batch}, {"Sq", d.queries}}));
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShapeIfPresent(
      "active_mask", s.active_mask, {{"B", d.batch}, {"Sq", d.queries}}));
  if (!s.lm_head.present()) return absl::OkStatus();
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShape(
      "lm_head", s.lm_head, {{"V", -1}, {"Hq*D", d.q_heads * d.head_dim}}));
  const int64_t vocab = s.lm_head.dim(0);
  if (vocab < 1) {
    return Invalid("lm_head", "vocabulary size must be positive, got ", vocab);
  }
  return CheckLimit("lm_head", "vocabulary size", vocab, "max_vocab",
                    limits.max_vocab);
}

// The rolling RoPE check's inputs and the engine's RoPE table. rotary_dim
// itself is checked with the rest of RoPE (config.cc); a bad one is
// reported there, not here as a table shape.
absl::Status CheckRopeInputs(const Snapshot& s, const SnapshotDims& d) {
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShapeIfPresent("pre_rope.q", s.pre_rope.q,
                                                 {{"B", d.batch},
                                                  {"Sq", d.queries},
                                                  {"Hq", d.q_heads},
                                                  {"D", d.head_dim}}));
  ATTNAUDIT_RETURN_IF_ERROR(ExpectShapeIfPresent("pre_rope.k", s.pre_rope.k,
                                                 {{"B", d.batch},
                                                  {"Sq", d.queries},
                                                  {"Hkv", d.kv_heads},
                                                  {"D", d.head_dim}}));
  const EngineRopeTable& t = s.rope_table;
  const bool rows = t.positions.present();
  for (const auto& [field, tensor] :
       {std::pair<const char*, const Tensor*>{"rope_table.cos", &t.cos},
        {"rope_table.sin", &t.sin}}) {
    if (tensor->present() != rows) {
      return Invalid(field, "rope_table.positions, cos and sin come together");
    }
  }
  const int64_t rotary = s.rope.rotary_dim > 0 ? s.rope.rotary_dim : d.head_dim;
  if (rotary > d.head_dim || rotary % 2 != 0) return absl::OkStatus();
  int64_t half = rotary / 2;
  const char* width = "rotary_dim / 2";
  // A full-head table on a partial-rotary config is the engine's bug (it
  // rotated every dim), which the table check reports as DRIFT
  // (rope-partial-rotary), not a malformed request: accepted, all of the
  // table at that width.
  const int64_t full = d.head_dim / 2;
  const bool wide = t.inv_freq.present()
                        ? t.inv_freq.rank() == 1 && t.inv_freq.dim(0) == full
                        : rows && t.cos.rank() == 2 && t.cos.dim(1) == full;
  if (rotary < d.head_dim && wide) {
    half = full;
    width = "head_dim / 2";
  }
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShapeIfPresent("rope_table.inv_freq", t.inv_freq, {{width, half}}));
  if (!rows) return absl::OkStatus();
  const int64_t n = t.positions.dim(0);
  ATTNAUDIT_RETURN_IF_ERROR(
      ExpectShape("rope_table.cos", t.cos, {{"T", n}, {width, half}}));
  return ExpectShape("rope_table.sin", t.sin, {{"T", n}, {width, half}});
}

}  // namespace

absl::Status CheckStructure(const Snapshot& s, const ValidationLimits& limits,
                            SnapshotDims* dims) {
  const std::vector<TensorRule> rules = Rules(s);
  ATTNAUDIT_RETURN_IF_ERROR(CheckPresence(rules));
  ATTNAUDIT_RETURN_IF_ERROR(CheckBytesAndKinds(rules, limits));
  const SnapshotDims d = DimsOf(s);
  ATTNAUDIT_RETURN_IF_ERROR(CheckQuery(s, d, limits));
  ATTNAUDIT_RETURN_IF_ERROR(CheckPagePools(s, d, limits));
  ATTNAUDIT_RETURN_IF_ERROR(CheckTables(s, d, limits));
  ATTNAUDIT_RETURN_IF_ERROR(CheckScalesAndSinks(s, d));
  ATTNAUDIT_RETURN_IF_ERROR(CheckContextParallel(s, d, limits));
  ATTNAUDIT_RETURN_IF_ERROR(CheckEngineOutputs(s, d));
  ATTNAUDIT_RETURN_IF_ERROR(CheckLogprobInputs(s, d, limits));
  ATTNAUDIT_RETURN_IF_ERROR(CheckRopeInputs(s, d));
  *dims = d;
  return absl::OkStatus();
}

}  // namespace validate_internal
}  // namespace attnaudit
