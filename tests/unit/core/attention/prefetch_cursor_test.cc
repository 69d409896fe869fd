// PrefetchCursor's walk: over Start, any number of Steps and Finish, every
// cache line of the next run's rows (heads [g0, g1), K and V) is touched
// exactly once and nothing else is, whatever the layout; Steps are paced.
// The expected lines are enumerated here independently, row by row.
#include "core/attention/prefetch_cursor.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace attnaudit {
namespace {

constexpr int64_t kLine = 64;

struct Shape {
  std::string name;
  bool nhd;  // token-major rows ([token][head][d]), else [head][token][d]
  int64_t page_size, kv_heads, head_dim, n, g0, g1;
  DType dtype;
  int64_t pad = 0;  // elements between one head's row and the next's (NHD)
};

// The lines of rows (t, h) for t < n, h in [g0, g1), each row head_dim
// elements from its start (rows are line-aligned in these pages).
std::set<const char*> ExpectedLines(const char* base, const Shape& s,
                                    int64_t row_stride, int64_t head_stride) {
  const int64_t elem = DTypeSize(s.dtype);
  std::set<const char*> lines;
  for (int64_t t = 0; t < s.n; ++t) {
    for (int64_t h = s.g0; h < s.g1; ++h) {
      const char* row = base + (t * row_stride + h * head_stride) * elem;
      for (int64_t b = 0; b < s.head_dim * elem; b += kLine) {
        lines.insert(row + b);
      }
    }
  }
  return lines;
}

void CheckWalk(const Shape& s, int64_t steps, int64_t steps_taken) {
  const int64_t elem = DTypeSize(s.dtype);
  const int64_t page_elems = s.page_size * s.kv_heads * (s.head_dim + s.pad);
  alignas(64) static char k_page[1 << 20];
  alignas(64) static char v_page[1 << 20];
  ASSERT_LE(page_elems * elem, static_cast<int64_t>(sizeof(k_page)));
  TokenRun run;
  run.k_data = k_page;
  run.v_data = v_page;
  run.k_dtype = run.v_dtype = s.dtype;
  run.k_row_stride = run.v_row_stride =
      s.nhd ? s.kv_heads * (s.head_dim + s.pad) : s.head_dim;
  run.k_head_stride = run.v_head_stride =
      s.nhd ? s.head_dim + s.pad : s.page_size * s.head_dim;
  run.n = s.n;

  PrefetchCursor cursor;
  cursor.Start(run, s.head_dim, s.g0, s.g1, steps);
  std::map<const char*, int> touched;
  int64_t most_in_a_step = 0;
  for (int64_t i = 0; i < steps_taken; ++i) {
    int64_t in_step = 0;
    cursor.StepWith([&](const char* line) {
      ++touched[line];
      ++in_step;
    });
    most_in_a_step = std::max(most_in_a_step, in_step);
  }
  cursor.FinishWith([&](const char* line) { ++touched[line]; });

  std::set<const char*> expected =
      ExpectedLines(k_page, s, run.k_row_stride, run.k_head_stride);
  const std::set<const char*> v_lines =
      ExpectedLines(v_page, s, run.v_row_stride, run.v_head_stride);
  expected.insert(v_lines.begin(), v_lines.end());
  std::set<const char*> seen;
  for (const auto& [line, times] : touched) {
    EXPECT_EQ(times, 1) << s.name << ": line touched " << times << " times";
    seen.insert(line);
  }
  EXPECT_EQ(seen, expected) << s.name;
  // Each step issues at most one pace of K lines and one of V lines.
  const int64_t tensor_lines = static_cast<int64_t>(expected.size()) / 2;
  const int64_t pace = (tensor_lines + steps - 1) / steps;
  EXPECT_LE(most_in_a_step, 2 * pace) << s.name;
  if (steps_taken >= steps) {
    EXPECT_EQ(most_in_a_step, 2 * std::min(pace, tensor_lines)) << s.name;
  }
}

std::vector<Shape> Shapes() {
  return {
      // Every head of an NHD page: the rows follow each other (one span).
      {"NHD all heads", true, 16, 8, 128, 16, 0, 8, DType::kBF16},
      {"NHD all heads, partial page", true, 16, 8, 128, 5, 0, 8, DType::kBF16},
      // Some heads of an NHD page: rows of a token apart from the next's.
      {"NHD heads 2..5", true, 16, 8, 128, 16, 2, 5, DType::kBF16},
      // HND: a head's tokens are adjacent; a full page is one span per
      // head range, a partial one is not.
      {"HND heads 1..3", false, 16, 4, 64, 16, 1, 3, DType::kF32},
      {"HND partial page", false, 16, 4, 64, 7, 0, 4, DType::kF32},
      {"fp8 rows of one line", true, 16, 2, 64, 16, 0, 2, DType::kF8E4M3},
      // Rows with gaps between them (a padded layout): walked row by row.
      {"NHD padded rows", true, 16, 4, 64, 9, 1, 4, DType::kBF16, 32},
  };
}

TEST(PrefetchCursorTest, EveryLineOnceWhateverTheStepsTaken) {
  for (const Shape& s : Shapes()) {
    for (int64_t steps : {1, 4, 32, 1000}) {
      for (int64_t taken : {int64_t{0}, steps / 2, steps, steps + 3}) {
        SCOPED_TRACE(s.name + ", steps " + std::to_string(steps) + ", taken " +
                     std::to_string(taken));
        CheckWalk(s, steps, taken);
      }
    }
  }
}

TEST(PrefetchCursorTest, ClearedCursorTouchesNothing) {
  PrefetchCursor cursor;
  int touched = 0;
  cursor.Clear();
  cursor.StepWith([&](const char*) { ++touched; });
  cursor.FinishWith([&](const char*) { ++touched; });
  EXPECT_EQ(touched, 0);
}

}  // namespace
}  // namespace attnaudit
