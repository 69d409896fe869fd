// PrefetchCursor: pulls the K/V rows of the next run (the next logical
// block's page) into the cache a few lines at a time while the current run
// is computed. The next page lies anywhere in the pool, so the hardware
// prefetchers cannot guess it; and the core drops software prefetches
// beyond its few outstanding misses, so a page-sized burst would mostly be
// lost. Pacing the lines over the current page's arithmetic keeps the
// misses in flight without dropping them (docs/PERF.md, "Prefetching the
// next page").
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
  struct Rows {
    Rows() = default;
    Rows(const void* data, DType dtype, int64_t row_stride, int64_t head_stride,
         int64_t n, int64_t head_dim, int64_t g0, int64_t g1)
        : base(static_cast<const char*>(data)),
          elem(DTypeSize(dtype)),
          row_stride(row_stride),
          head_stride(head_stride),
          tokens(n),
          g0(g0),
          heads(g1 - g0),
          row_bytes(head_dim * DTypeSize(dtype)) {
      contiguous = data != nullptr && Contiguous();
    }

    int64_t Lines() const {
      return tokens * heads * ((row_bytes + kLine - 1) / kLine);
    }

    const char* RowAddress(int64_t i) const {
      const bool token_major = head_stride <= row_stride;
      const int64_t t = token_major ? i / heads : i % tokens;
      const int64_t g = g0 + (token_major ? i % heads : i / tokens);
      return base + (t * row_stride + g * head_stride) * elem;
    }

    // Whether the rows follow each other in memory (an NHD page with every
    // head of the token, or an HND page of full rows), so the walk is one
    // span of lines.
    bool Contiguous() const {
      const bool token_major = head_stride <= row_stride;
      const int64_t next_row = token_major ? head_stride : row_stride;
      const int64_t next_outer = token_major ? row_stride : head_stride;
      const int64_t inner = token_major ? heads : tokens;
      return next_row * elem == row_bytes && next_outer == inner * next_row;
    }

    template <class Touch>
    void Issue(int64_t lines, Touch& touch) {
      const int64_t rows = tokens * heads;
      if (contiguous) {
        // One span: how many lines this step takes is known up front, so
        // the loop is a prefetch and an add a line.
        const int64_t end = rows * row_bytes;
        const int64_t left =
            offset < end ? (end - offset + kLine - 1) / kLine : 0;
        const int64_t take = std::min(lines, left);
        const char* line = RowAddress(0) + offset;
        for (int64_t i = 0; i < take; ++i, line += kLine) touch(line);
        offset += take * kLine;
        return;
      }
      while (lines > 0 && row < rows) {
        const char* address = RowAddress(row);
        for (; lines > 0 && offset < row_bytes; offset += kLine, --lines) {
          touch(address + offset);
        }
        if (offset >= row_bytes) {
          ++row;
          offset = 0;
        }
      }
    }

    static constexpr int64_t kLine = 64;
    const char* base = nullptr;
    int64_t elem = 0, row_stride = 0, head_stride = 0;
    int64_t tokens = 0, g0 = 0, heads = 0, row_bytes = 0;
    bool contiguous = false;
    int64_t row = 0, offset = 0;  // the walk's position (offset: in the
                                  // row, or in the span when contiguous)
  };

  Rows k_, v_;
  int64_t pace_ = 1;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_PREFETCH_CURSOR_H_
