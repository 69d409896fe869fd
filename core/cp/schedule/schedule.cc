#include "core/cp/schedule/schedule.h"

#include <algorithm>

namespace attnaudit {

const CpChunk* CpShards::Chunk(int64_t b, int64_t rank, int64_t c) const {
  if (c < 0 || c >= Chunks(b, rank)) return nullptr;
  return &chunks[b][chunk_begin[b][rank] + c];
}

CpShards PlanShards(const std::vector<std::vector<KvUnit>>& units,
                    int64_t world, int64_t page_size) {
  CpShards s;
  s.world = std::max<int64_t>(1, world);
  s.page_size = std::max<int64_t>(1, page_size);
  const size_t rows = units.size();
  const size_t w = static_cast<size_t>(s.world);
  s.rank_units.resize(rows);
  s.unit_begin.assign(rows, std::vector<int32_t>(w + 1, 0));
  s.tokens.assign(rows, std::vector<int64_t>(w, 0));
  s.chunks.resize(rows);
  s.chunk_begin.assign(rows, std::vector<int32_t>(w + 1, 0));
  for (size_t b = 0; b < rows; ++b) {
    const std::vector<KvUnit>& row = units[b];
    std::vector<int32_t>& begin = s.unit_begin[b];
    // Counting sort by rank keeps each rank's units ascending.
    for (const KvUnit& u : row) ++begin[static_cast<size_t>(u.rank) + 1];
    for (size_t k = 1; k <= w; ++k) begin[k] += begin[k - 1];
    std::vector<int32_t> next(begin.begin(), begin.end() - 1);
    s.rank_units[b].resize(row.size());
    for (size_t i = 0; i < row.size(); ++i) {
      const size_t k = static_cast<size_t>(row[i].rank);
      s.rank_units[b][static_cast<size_t>(next[k]++)] = static_cast<int32_t>(i);
      s.tokens[b][k] += row[i].count;
    }
    // Greedy chunks: as many whole units as fit in a page.
    for (size_t k = 0; k < w; ++k) {
      s.chunk_begin[b][k] = static_cast<int32_t>(s.chunks[b].size());
      CpChunk chunk;
      chunk.unit_begin = chunk.unit_end = begin[k];
      for (int32_t i = begin[k]; i < begin[k + 1]; ++i) {
        const int32_t count =
            row[static_cast<size_t>(s.rank_units[b][i])].count;
        if (chunk.tokens > 0 && chunk.tokens + count > s.page_size) {
          s.chunks[b].push_back(chunk);
          chunk.unit_begin = i;
          chunk.tokens = 0;
        }
        chunk.unit_end = i + 1;
        chunk.tokens += count;
      }
      if (chunk.tokens > 0) s.chunks[b].push_back(chunk);
    }
    s.chunk_begin[b][w] = static_cast<int32_t>(s.chunks[b].size());
  }
  return s;
}

const char* CpReplayStrategyName(CpReplayStrategy strategy) {
  return strategy == CpReplayStrategy::kRing ? "ring" : "partials";
}

CpSchedule::CpSchedule(const CpShards& shards, CpReplayStrategy strategy,
                       int64_t kv_heads, int64_t token_bytes,
                       int64_t message_budget)
    : shards_(&shards),
      strategy_(strategy),
      kv_heads_(std::max<int64_t>(1, kv_heads)),
      rounds_(strategy == CpReplayStrategy::kRing ? shards.world : 1) {
  const int64_t rows = shards.batch();
  const int64_t row_bytes =
      shards.page_size * std::max<int64_t>(1, token_bytes);
  pass_of_row_.assign(static_cast<size_t>(rows), 0);
  int64_t b = 0;
  while (b < rows) {
    CpPass pass;
    pass.row_begin = b;
    pass.first_step = steps_;
    // At least one row per pass, then as many as the budget allows.
    do {
      for (int64_t k = 0; k < shards.world; ++k) {
        pass.chunks = std::max(pass.chunks, shards.Chunks(b, k));
      }
      pass_of_row_[static_cast<size_t>(b)] =
          static_cast<int64_t>(passes_.size());
      ++b;
    } while (b < rows &&
             (b - pass.row_begin + 1) * row_bytes <= message_budget);
    pass.row_end = b;
    max_message_bytes_ = std::max(max_message_bytes_,
                                  (pass.row_end - pass.row_begin) * row_bytes);
    steps_ += pass.chunks * rounds_;
    passes_.push_back(pass);
  }
}

CpStep CpSchedule::StepAt(int64_t step) const {
  // Passes are few and ordered by first_step.
  auto it = std::upper_bound(
      passes_.begin(), passes_.end(), step,
      [](int64_t s, const CpPass& p) { return s < p.first_step; });
  const int64_t pass = (it - passes_.begin()) - 1;
  const int64_t local = step - passes_[pass].first_step;
  return CpStep{pass, local / rounds_, local % rounds_};
}

int64_t CpSchedule::SourceRank(int64_t rank, int64_t round) const {
  const int64_t w = world();
  return ((rank - round) % w + w) % w;
}

bool CpSchedule::Receives(int64_t step) const {
  return step >= 0 && step < steps_ && StepAt(step).round > 0;
}

bool CpSchedule::Sends(int64_t step) const {
  return step >= 0 && step < steps_ && StepAt(step).round + 1 < rounds_;
}

bool CpSchedule::GrantsAfter(int64_t step) const { return Receives(step + 2); }

int64_t CpSchedule::ItemOwner(int64_t b, int64_t g) const {
  return (b * kv_heads_ + g) % world();
}

}  // namespace attnaudit
