// Phase 4 of snapshot validation: finite checks over the big tensors.
//
// A value is non-finite exactly when its exponent field is all ones (IEEE
// formats and e5m2) or, for e4m3fn, when its magnitude bits are 0x7f. Both
// reduce to "magnitude bits >= threshold" on the unsigned bit pattern, so
// the scan is an unsigned max-reduction over chunks, which GCC and Clang
// vectorise; only a chunk that fails is rescanned to locate the element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/tensor/dtype_traits.h"
#include "core/validate/validate_internal.h"

namespace attnaudit {
namespace validate_internal {
namespace {

// Largest magnitude bit pattern among kBlock elements. The constant trip
// count lets GCC vectorise it even at -O2 (its "very cheap" cost model
// refuses loops that would need a scalar epilogue).
template <typename U, int kBlock>
U MaxMagnitude(const U* p, U magnitude_mask) {
  U worst = 0;
  for (int i = 0; i < kBlock; ++i) {
    const U m = static_cast<U>(p[i] & magnitude_mask);
    worst = m > worst ? m : worst;
  }
  return worst;
}

template <typename U>
int64_t FirstAtOrAbove(const void* data, int64_t n, U magnitude_mask,
                       U threshold) {
  constexpr int kBlock = 1024;
  const U* p = static_cast<const U*>(data);
  int64_t base = 0;
  U worst = 0;
  for (; base + kBlock <= n; base += kBlock) {
    worst = MaxMagnitude<U, kBlock>(p + base, magnitude_mask);
    if (worst >= threshold) break;
  }
  if (worst < threshold) {  // the tail, or nothing found in full blocks
    for (int64_t i = base; i < n; ++i) {
      const U m = static_cast<U>(p[i] & magnitude_mask);
      worst = m > worst ? m : worst;
    }
    if (worst < threshold) return -1;
  }
  // Something at or after `base` is non-finite: locate the first one.
  for (int64_t i = base; i < n; ++i) {
    if (static_cast<U>(p[i] & magnitude_mask) >= threshold) return i;
  }
  return -1;
}

// Scans `count` contiguous elements starting at element `offset` of `t`;
// on failure returns the error naming the element.
absl::Status ScanRange(absl::string_view field, const Tensor& t, int64_t offset,
                       int64_t count) {
  const char* base =
      static_cast<const char*>(t.raw()) + offset * DTypeSize(t.dtype());
  const int64_t bad = FirstNonFinite(base, t.dtype(), count);
  if (bad < 0) return absl::OkStatus();
  return Invalid(ElementPath(field, t.shape(), offset + bad),
                 "value is not finite");
}

// What attnaudit rotates must stay finite rotated in fp32: a rotated pair's
// elements reach sqrt(2) times the pair's largest, and the rolling check's
// tolerance twice that. 2^125 (about 4.3e37) leaves room for both; no
// model's activations come near it.
const float kMaxRotatedMagnitude = std::ldexp(1.0f, 125);

absl::Status ScanRotatable(absl::string_view field, const Tensor& t) {
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const float x = t.FloatAt(i);
    if (std::fabs(x) > kMaxRotatedMagnitude) {
      return Invalid(ElementPath(field, t.shape(), i), "|value| ", x,
                     " is beyond 4.3e37 (2^125): rotated in fp32 it can "
                     "overflow");
    }
  }
  return absl::OkStatus();
}

// Active K (or V) slots only. Runs of consecutive fully active pages are
// one contiguous range (the common case: a pool of referenced pages) and
// are scanned in one call; partially active pages slot by slot.
absl::Status ScanActiveKv(absl::string_view field, const Tensor& pages,
                          KvLayout layout, const SnapshotDims& d,
                          const std::vector<uint8_t>& active) {
  const int64_t p = d.page_size;
  const int64_t hd = d.kv_heads * d.head_dim;
  const int64_t page_elems = p * hd;
  int64_t run_start = 0;  // first page of the current run of full pages
  for (int64_t page = 0; page <= d.num_pages; ++page) {
    int64_t used = 0;
    if (page < d.num_pages) {
      const uint8_t* flags = active.data() + page * p;
      for (int64_t k = 0; k < p; ++k) used += flags[k];
      if (used == p) continue;  // extends the run
    }
    if (page > run_start) {
      absl::Status st = ScanRange(field, pages, run_start * page_elems,
                                  (page - run_start) * page_elems);
      if (!st.ok()) return st;
    }
    run_start = page + 1;
    if (used == 0) continue;
    const uint8_t* flags = active.data() + page * p;
    const int64_t page_base = page * page_elems;
    for (int64_t k = 0; k < p; ++k) {
      if (!flags[k]) continue;
      if (layout == KvLayout::kNHD) {
        absl::Status st = ScanRange(field, pages, page_base + k * hd, hd);
        if (!st.ok()) return st;
      } else {
        for (int64_t h = 0; h < d.kv_heads; ++h) {
          absl::Status st = ScanRange(
              field, pages, page_base + (h * p + k) * d.head_dim, d.head_dim);
          if (!st.ok()) return st;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t FirstNonFinite(const void* data, DType dtype, int64_t n) {
  const DTypeTraits& t = DTypeTraitsOf(dtype);
  if (!t.floating()) return -1;  // nothing can be non-finite
  // Codes ordered by magnitude once the sign is masked off: the first one
  // that is not finite is the all-ones exponent (inf) of an IEEE format,
  // and e4m3fn's S.1111.111 (NaN; it has no infinity).
  const uint64_t magnitude = (uint64_t{1} << (8 * t.bytes - 1)) - 1;
  const uint64_t threshold =
      t.has_infinity ? ((uint64_t{1} << t.exponent_bits) - 1) << t.mantissa_bits
                     : magnitude;
  switch (t.bytes) {
    case 1:
      return FirstAtOrAbove<uint8_t>(data, n, static_cast<uint8_t>(magnitude),
                                     static_cast<uint8_t>(threshold));
    case 2:
      return FirstAtOrAbove<uint16_t>(data, n, static_cast<uint16_t>(magnitude),
                                      static_cast<uint16_t>(threshold));
    case 4:
      return FirstAtOrAbove<uint32_t>(data, n, static_cast<uint32_t>(magnitude),
                                      static_cast<uint32_t>(threshold));
    default:
      return FirstAtOrAbove<uint64_t>(data, n, magnitude, threshold);
  }
}

absl::Status CheckFiniteValues(const Snapshot& s, const SnapshotDims& d,
                               const std::vector<uint8_t>& active_slots,
                               bool scan_kv) {
  ATTNAUDIT_RETURN_IF_ERROR(ScanRange("q", s.q, 0, s.q.num_elements()));
  for (const auto& [field, tensor] :
       {std::pair<const char*, const Tensor*>{"pre_rope.q", &s.pre_rope.q},
        {"pre_rope.k", &s.pre_rope.k}}) {
    if (tensor->present()) {
      ATTNAUDIT_RETURN_IF_ERROR(
          ScanRange(field, *tensor, 0, tensor->num_elements()));
      ATTNAUDIT_RETURN_IF_ERROR(ScanRotatable(field, *tensor));
    }
  }
  if (s.rope.q_state == RopeState::kPreRope) {
    ATTNAUDIT_RETURN_IF_ERROR(ScanRotatable("q", s.q));
  }
  if (scan_kv) {
    // K first: when both are bad the message names K, whatever the timing.
    ATTNAUDIT_RETURN_IF_ERROR(
        ScanActiveKv("k_pages", s.k_pages, s.kv_layout, d, active_slots));
    ATTNAUDIT_RETURN_IF_ERROR(
        ScanActiveKv("v_pages", s.v_pages, s.kv_layout, d, active_slots));
  }
  if (s.lm_head.present()) {
    ATTNAUDIT_RETURN_IF_ERROR(
        ScanRange("lm_head", s.lm_head, 0, s.lm_head.num_elements()));
  }
  return absl::OkStatus();
}

}  // namespace validate_internal
}  // namespace attnaudit
