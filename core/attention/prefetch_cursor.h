// PrefetchCursor: pulls the K/V rows of the next run (the next logical
// block's page) into the cache a few lines at a time while the current run
// is computed. The next page lies anywhere in the pool, so the hardware
// prefetchers cannot guess it; and the core drops software prefetches
// beyond its few outstanding misses, so a page-sized burst would mostly be
// lost. Pacing the lines over the current page's arithmetic keeps the
// misses in flight without dropping them (docs/perf-history.md,
// "Prefetching the next page").
//
// Owned by one thread's scratch; not thread-safe. Holds pointers into the
// run's pages, which must outlive the cursor's use until the next Start.
#ifndef ATTNAUDIT_CORE_ATTENTION_PREFETCH_CURSOR_H_
#define ATTNAUDIT_CORE_ATTENTION_PREFETCH_CURSOR_H_

#include <algorithm>
#include <cstdint>

#include "core/attention/unit_states.h"
#include "core/tensor/dtype.h"

namespace attnaudit {

class PrefetchCursor {
 public:
  // Walks the rows of heads [g0, g1) of `run`'s n tokens, K and V side by
  // side, in memory order; Step() issues about 1/steps of the lines.
  void Start(const TokenRun& run, int64_t head_dim, int64_t g0, int64_t g1,
             int64_t steps) {
    k_ = Rows(run.k_data, run.k_dtype, run.k_row_stride, run.k_head_stride,
              run.n, head_dim, g0, g1);
    v_ = Rows(run.v_data, run.v_dtype, run.v_row_stride, run.v_head_stride,
              run.n, head_dim, g0, g1);
    const int64_t lines = std::max(k_.Lines(), v_.Lines());
    pace_ =
        std::max<int64_t>(1, (lines + steps - 1) / std::max<int64_t>(steps, 1));
  }

  // Nothing left to prefetch (the last block of an item).
  void Clear() { k_ = v_ = Rows(); }

  void Step() { StepWith(Prefetch); }

  // Whatever Step() has not reached yet.
  void Finish() { FinishWith(Prefetch); }

  // Step and Finish with touch(line address) in place of the prefetch:
  // the walk itself, for tests.
  template <class Touch>
  void StepWith(Touch&& touch) {
    k_.Issue(pace_, touch);
    v_.Issue(pace_, touch);
  }
  template <class Touch>
  void FinishWith(Touch&& touch) {
    k_.Issue(INT64_MAX, touch);
    v_.Issue(INT64_MAX, touch);
  }

 private:
  static void Prefetch(const char* line) {
    __builtin_prefetch(line, /*rw=*/0, /*locality=*/3);
  }

  // The cache lines of one tensor's rows; row i is (token, head) in memory
  // order: token-major when a token's heads are closer than its tokens.
  // The rows are walked as segments of adjacent bytes: the whole run when
  // every row follows the previous one (an NHD page with every head, an HND
  // page of full rows), else one segment per outer index (a token's rows of
  // the head range, or a head's rows of the run's tokens) when the inner
  // rows are adjacent, else one per row. Segment addresses are stepped, not
  // divided out of a row index: a 64-bit division per row is a visible part
  // of a small page's cost.
  class Rows {
   public:
    Rows() = default;
    Rows(const void* data, DType dtype, int64_t row_stride, int64_t head_stride,
         int64_t n, int64_t head_dim, int64_t g0, int64_t g1) {
      if (data == nullptr || n <= 0 || g1 <= g0) return;
      const int64_t elem = DTypeSize(dtype);
      const bool token_major = head_stride <= row_stride;
      const int64_t row_bytes = head_dim * elem;
      const int64_t outer = token_major ? n : g1 - g0;
      const int64_t inner = token_major ? g1 - g0 : n;
      const int64_t outer_step =
          (token_major ? row_stride : head_stride) * elem;
      const int64_t inner_step =
          (token_major ? head_stride : row_stride) * elem;
      segment_base_ = outer_base_ =
          static_cast<const char*>(data) + g0 * head_stride * elem;
      if (inner_step == row_bytes && outer_step == inner * row_bytes) {
        segments_ = 1;  // one span
        segment_bytes_ = outer * inner * row_bytes;
      } else if (inner_step == row_bytes) {
        segments_ = outer;
        segment_bytes_ = inner * row_bytes;
        segment_step_ = outer_step;
      } else {
        segments_ = outer * inner;
        segment_bytes_ = row_bytes;
        segment_step_ = inner_step;
        rows_per_outer_ = inner;
        outer_step_ = outer_step;
      }
    }

    int64_t Lines() const {
      return segments_ * ((segment_bytes_ + kLine - 1) / kLine);
    }

    // Touches up to `lines` more lines of the walk.
    template <class Touch>
    void Issue(int64_t lines, Touch& touch) {
      while (lines > 0 && segment_ < segments_) {
        const int64_t left = (segment_bytes_ - offset_ + kLine - 1) / kLine;
        const int64_t take = std::min(lines, left);
        const char* line = segment_base_ + offset_;
        for (int64_t i = 0; i < take; ++i, line += kLine) touch(line);
        lines -= take;
        offset_ += take * kLine;
        if (offset_ >= segment_bytes_) NextSegment();
      }
    }

   private:
    static constexpr int64_t kLine = 64;

    void NextSegment() {
      offset_ = 0;
      ++segment_;
      if (rows_per_outer_ == 0) {  // segments are evenly spaced
        segment_base_ += segment_step_;
        return;
      }
      // Row by row: step along the outer index's rows, then to the next
      // outer index's first row.
      if (++inner_index_ < rows_per_outer_) {
        segment_base_ += segment_step_;
      } else {
        inner_index_ = 0;
        outer_base_ += outer_step_;
        segment_base_ = outer_base_;
      }
    }

    // The walk's shape.
    int64_t segments_ = 0, segment_bytes_ = 0, segment_step_ = 0;
    int64_t rows_per_outer_ = 0;  // when walked row by row, else 0
    int64_t outer_step_ = 0;      // when walked row by row
    // The walk's position.
    int64_t segment_ = 0, offset_ = 0, inner_index_ = 0;
    const char* segment_base_ = nullptr;
    const char* outer_base_ = nullptr;
  };

  Rows k_, v_;
  int64_t pace_ = 1;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_PREFETCH_CURSOR_H_
