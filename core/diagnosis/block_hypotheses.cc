// Page hypotheses from one row's per-unit R states: a dropped block
// (leave one block out), a stale page (located by the stale fit,
// stale_fit.cc), a duplicated page (one block's state replaced by another
// page read in its place) and two swapped pages. Only merges of states per
// candidate; the states themselves are computed once per row (the pages
// read in another block's place, when that block is not fully visible,
// once per pair).
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/diagnosis/diagnosis_internal.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

constexpr int kTopBlocks = 8;      // blocks tried as dropped/stale/duplicated
constexpr int kSwapPartners = 16;  // partners tried for a swap
// Up to this many (partial block, partner) pairs, all are tried.
constexpr int64_t kExhaustiveSwaps = 512;
// The blocks the stale fit ranks best join the candidates.
constexpr int kFitBlocks = 4;

// Pass 1: per block, the energy left after leaving it out.
struct LeaveOneOut {
  // Per block: what is left of out's and the LSE's energy, and the
  // candidate order's key (both, each relative to its total before).
  std::vector<double> out, lse, energy;
  double out_total = 0, lse_total = 0;  // energy when nothing is left out
};

// The leave-one-out sums of cells [c0, c1) into *loo (sized by the
// caller), with its own block states.
void ScanCells(const Context& ctx, const Row& row, const RowStates& rs,
               int64_t c0, int64_t c1, LeaveOneOut* loo) {
  CellBlocks cb(ctx, rs);
  const int64_t nb = cb.blocks(), D = ctx.d.head_dim;
  std::vector<double> out(static_cast<size_t>(D));
  Acc rest(D);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    cb.Load(s, h);
    const double lse_z2 =
        row.has_lse ? std::pow(row.before_lse[c] / ctx.lse_unit, 2) : 0.0;
    loo->lse_total += lse_z2;
    loo->out_total += row.before[c] - lse_z2;
    for (int64_t j = 0; j < nb; ++j) {
      rest = cb.Without(j);
      double lse = 0;
      Final(ctx, rest, h, out.data(), &lse);
      // The LSE's part in the unit CellEnergy used (scaled with a large
      // LSE): out's part is what is left, never negative.
      const double e = CellEnergy(ctx, row, out.data(), lse, c);
      const double lz2 = LseZ2(ctx, row, lse, c);
      loo->lse[j] += lz2;
      loo->out[j] += e - lz2;
    }
  }
}

LeaveOneOut ScanLeaveOneOut(const Context& ctx, const Row& row,
                            const RowStates& rs) {
  const int64_t nb = static_cast<int64_t>(rs.pages.size());
  const int64_t cells = ctx.Cells();
  const int64_t chunks = std::min<int64_t>(cells, ctx.opt->threads);
  std::vector<LeaveOneOut> part(static_cast<size_t>(chunks));
  for (LeaveOneOut& l : part) {
    for (auto* v : {&l.out, &l.lse, &l.energy}) {
      v->assign(static_cast<size_t>(nb), 0.0);
    }
  }
  ParallelFor(chunks, ctx.opt->threads, [&](int64_t k) {
    ScanCells(ctx, row, rs, cells * k / chunks, cells * (k + 1) / chunks,
              &part[k]);
  });
  LeaveOneOut loo = std::move(part[0]);
  for (size_t k = 1; k < part.size(); ++k) {
    for (int64_t j = 0; j < nb; ++j) {
      loo.out[j] += part[k].out[j];
      loo.lse[j] += part[k].lse[j];
    }
    loo.out_total += part[k].out_total;
    loo.lse_total += part[k].lse_total;
  }
  for (int64_t j = 0; j < nb; ++j) {
    loo.energy[j] =
        loo.out[j] / std::max(loo.out_total, 1e-300) +
        (row.has_lse ? loo.lse[j] / std::max(loo.lse_total, 1e-300) : 0.0);
  }
  // Leaving nothing out scores 1 per quantity (the swap partners' change
  // is measured from it).
  loo.out_total = 1.0;
  loo.lse_total = row.has_lse ? 1.0 : 0.0;
  return loo;
}

std::vector<int64_t> TopBlocks(const std::vector<double>& energy, int n,
                               int64_t skip) {
  std::vector<int64_t> order(energy.size());
  std::iota(order.begin(), order.end(), 0);
  order.erase(std::remove(order.begin(), order.end(), skip), order.end());
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return energy[a] < energy[b]; });
  order.resize(std::min(order.size(), static_cast<size_t>(n)));
  return order;
}

// The state read for block `as` when the engine's table names block
// `from`'s page there: the stored block state when both are fully visible
// (post-RoPE keys do not depend on where they are read), else computed.
struct Substitute {
  int64_t as = 0, from = 0;
  std::vector<double> out, lse;  // computed: [cells * D], [cells]
  bool stored = false;
};

absl::Status MakeSubstitute(const Context& ctx, const RowStates& rs, int64_t as,
                            int64_t from, Substitute* sub) {
  sub->as = as;
  sub->from = from;
  sub->stored = rs.full[as] && rs.full[from];
  if (sub->stored) return absl::OkStatus();
  return ComputeSubstituteStates(ctx, rs.b, rs.pages[from], as, &sub->out,
                                 &sub->lse);
}

void AddSubstitute(const CellBlocks& cb, const Substitute& sub, int64_t c,
                   int64_t D, Acc* a) {
  if (sub.stored) {
    a->Merge(cb.Block(sub.from));
  } else {
    a->Add(&sub.out[c * D], sub.lse[c]);
  }
}

Candidate BlockCandidate(const Context& ctx, const RowStates& rs,
                         const char* hypothesis, int64_t j, int64_t other,
                         const Scorer& scorer, int bias) {
  Candidate c;
  c.hypothesis = hypothesis;
  c.eval = scorer.Finish();
  c.location.row = rs.b;
  c.location.query = c.eval.query;
  c.location.heads = c.eval.heads;
  c.location.logical_block = j;
  c.location.page = EnginePageId(ctx, rs.pages[j]);
  // A context-parallel engine: the rank whose shard holds the block (that
  // of its first token when token interleaving splits it).
  if (ctx.in->snapshot->cp.world_size > 1) {
    c.location.cp_rank = ctx.in->layout->block_owners[rs.b][j];
  }
  if (other >= 0) {
    c.location.other_logical_block = other;
    c.location.other_page = EnginePageId(ctx, rs.pages[other]);
  }
  c.rank_bias = bias;
  return c;
}

// One scorer per candidate of pass 2.
struct Trial {
  Trial(const char* hypothesis, int64_t j, int64_t other, int bias,
        std::vector<const Substitute*> subs, bool stale, Scorer scorer)
      : hypothesis(hypothesis),
        j(j),
        other(other),
        bias(bias),
        subs(std::move(subs)),
        stale(stale),
        scorer(scorer),
        kept(std::move(scorer)) {}

  // A page read in block j's place: whether j is where it was read, or
  // only that the page was read once more (below, `kept`).
  bool Replaces() const {
    return subs.size() == 1 &&
           (hypothesis == kDuplicatePage || hypothesis == kForeignPage);
  }

  const char* hypothesis;
  int64_t j, other;
  int bias;
  std::vector<const Substitute*> subs;  // merged after the rest
  bool stale = false;
  Scorer scorer;
  // Replaces(): the page read in addition, block j's own content kept. When
  // that explains E as well, block j's content takes no weight and any such
  // block would do: the place is not known.
  Scorer kept;
  std::string detail;
  int64_t foreign_page = -1;  // a page of another row read as block j
  // Stage one: out's and the LSE's energy left, summed over the cells.
  double out_left = 0, lse_left = 0;
  bool finalist = false;
};

// The rest of the row for a trial into *a: every block but j (and `other`
// for a swap). `without_j` caches every block but j for the cell.
void Rest(const CellBlocks& cb, const Trial& t, const Acc& without_j, Acc* a) {
  if (t.other < 0 || t.subs.size() < 2) {
    *a = without_j;
    return;
  }
  a->Clear();
  for (int64_t k = 0; k < cb.blocks(); ++k) {
    if (k != t.j && k != t.other) a->Merge(cb.Block(k));
  }
}

// The trial's attention for cell c: (out, lse) into out / *lse.
void TrialCell(const Context& ctx, const Row& row, const CellBlocks& cb,
               const Trial& t, const Acc& without_j, int64_t c, Acc* a,
               const std::vector<double>& zero, double* out, double* lse) {
  const int64_t D = ctx.d.head_dim, h = c % ctx.d.q_heads;
  Rest(cb, t, without_j, a);
  for (const Substitute* sub : t.subs) AddSubstitute(cb, *sub, c, D, a);
  if (t.stale && row.has_lse) {
    // The stale content's mass, fitted to the engine's LSE (its values are
    // unknown: zero, their expectation).
    const double ek = EngineKeysLse(ctx, row, c);
    const double rest = a->Lse();
    if (ek > rest) a->Add(zero.data(), ek + std::log(-std::expm1(rest - ek)));
  }
  Final(ctx, *a, h, out, lse);
}

// Stage one scores every trial by energy alone; stage two runs the full
// scorer for the finalists only (trials are grouped by j, which shares
// the rest of the row).
void ScoreTrialCells(const Context& ctx, const Row& row, CellBlocks& cb,
                     bool finalists, int64_t c0, int64_t c1,
                     std::vector<Trial>* trials, double* left) {
  const int64_t D = ctx.d.head_dim;
  std::vector<double> out(static_cast<size_t>(D)), zero(out.size(), 0.0);
  Acc a(D), without(D);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    cb.Load(s, h);
    int64_t cached = -1;
    for (size_t i = 0; i < trials->size(); ++i) {
      Trial& t = (*trials)[i];
      if (finalists && !t.finalist) continue;
      if (t.j != cached) {
        without = cb.Without(t.j);
        cached = t.j;
      }
      double lse = 0;
      TrialCell(ctx, row, cb, t, without, c, &a, zero, out.data(), &lse);
      if (finalists) {
        t.scorer.AddCell(row, c, out.data(), lse);
        if (t.Replaces()) {
          a = cb.All();
          AddSubstitute(cb, *t.subs[0], c, ctx.d.head_dim, &a);
          Final(ctx, a, h, out.data(), &lse);
          t.kept.AddCell(row, c, out.data(), lse);
        }
        continue;
      }
      // In CellEnergy's LSE unit (scaled with a large LSE), so that out's
      // part, e - lz2, is never negative.
      const double e = CellEnergy(ctx, row, out.data(), lse, c);
      const double lz2 = LseZ2(ctx, row, lse, c);
      left[2 * i] += e - lz2;
      left[2 * i + 1] += lz2;
    }
  }
}

// Stage one runs in parallel over cells (each chunk sums into its own
// row of `left`), stage two in order.
void ScoreTrials(const Context& ctx, const Row& row, const RowStates& rs,
                 bool finalists, std::vector<Trial>* trials) {
  const int64_t cells = ctx.Cells();
  const int64_t chunks =
      finalists ? 1 : std::min<int64_t>(cells, ctx.opt->threads);
  const size_t n = trials->size();
  std::vector<std::vector<double>> left(static_cast<size_t>(chunks),
                                        std::vector<double>(2 * n, 0.0));
  ParallelFor(chunks, finalists ? 1 : ctx.opt->threads, [&](int64_t k) {
    CellBlocks cb(ctx, rs);
    ScoreTrialCells(ctx, row, cb, finalists, cells * k / chunks,
                    cells * (k + 1) / chunks, trials, left[k].data());
  });
  if (finalists) return;
  for (size_t i = 0; i < n; ++i) {
    for (const std::vector<double>& l : left) {
      (*trials)[i].out_left += l[2 * i];
      (*trials)[i].lse_left += l[2 * i + 1];
    }
  }
}

// Marks the finalists: every drop and stale trial, and per hypothesis and
// block the substitution leaving the least energy (out's and the LSE's,
// each relative to its total before).
void PickFinalists(const Context& ctx, const Row& row,
                   std::vector<Trial>* trials) {
  double out_before = 0, lse_before = 0;
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    const double z = row.has_lse ? row.before_lse[c] / ctx.lse_unit : 0.0;
    lse_before += z * z;
    out_before += row.before[c] - z * z;
  }
  auto key = [&](const Trial& t) {
    return t.out_left / std::max(out_before, 1e-300) +
           (row.has_lse ? t.lse_left / std::max(lse_before, 1e-300) : 0.0);
  };
  std::map<std::pair<std::string, int64_t>, size_t> best;
  for (size_t i = 0; i < trials->size(); ++i) {
    Trial& t = (*trials)[i];
    t.finalist = t.subs.empty();
    if (t.finalist) continue;
    auto [it, fresh] = best.try_emplace({t.hypothesis, t.j}, i);
    if (!fresh && key(t) < key((*trials)[it->second])) it->second = i;
  }
  for (const auto& [k, i] : best) (*trials)[i].finalist = true;
}

}  // namespace

namespace {

// Which blocks the trials try.
struct TrialPlan {
  std::vector<int64_t> top;       // dropped / stale / duplicated candidates
  std::vector<int64_t> partial;   // not fully visible: one side of a swap
  std::vector<int64_t> partners;  // the other side
  int64_t stale_block = -1;       // the stale fit's best block
};

TrialPlan PlanTrials(const RowStates& rs, const LeaveOneOut& loo,
                     const StaleFit& fit) {
  TrialPlan plan;
  const int64_t nb = static_cast<int64_t>(rs.pages.size());
  plan.top = TopBlocks(loo.energy, kTopBlocks, -1);
  // The blocks the stale fit ranks best are where E's content differs.
  std::vector<int64_t> fitted;
  if (!fit.cost.empty()) fitted = TopBlocks(fit.cost, kFitBlocks, -1);
  if (fit.Structured()) plan.stale_block = fit.best;
  for (int64_t j : fitted) {
    if (std::find(plan.top.begin(), plan.top.end(), j) == plan.top.end()) {
      plan.top.push_back(j);
    }
  }
  for (int64_t j = 0; j < nb; ++j) {
    if (!rs.full[j]) plan.partial.push_back(j);
  }
  // A swap partner is a block whose content matters: the largest change
  // when left out, either way (a swap may add mass as well as lose it),
  // the best leave-one-out blocks and the candidates above.
  std::vector<double> change(loo.energy.size());
  const double unchanged = loo.out_total + loo.lse_total;
  for (size_t j = 0; j < change.size(); ++j) {
    change[j] = -std::fabs(loo.energy[j] - unchanged);
  }
  plan.partners = TopBlocks(change, kSwapPartners, -1);
  // Few enough pairs: every block is a partner (the signals above mislead
  // when a swap moves keys between queries of the row).
  if (static_cast<int64_t>(plan.partial.size()) * nb <= kExhaustiveSwaps) {
    plan.partners.clear();
    for (int64_t j = 0; j < nb; ++j) plan.partners.push_back(j);
    return plan;
  }
  std::vector<int64_t> more = TopBlocks(loo.energy, kSwapPartners, -1);
  more.insert(more.end(), plan.top.begin(), plan.top.end());
  for (int64_t j : more) {
    if (std::find(plan.partners.begin(), plan.partners.end(), j) ==
        plan.partners.end()) {
      plan.partners.push_back(j);
    }
  }
  return plan;
}

// A block-table entry naming another row's page: for every candidate block
// (PlanTrials' top), the pages other rows hold at the same logical block or
// a neighbour (a row mix-up keeps the block index), read in the block's
// place: at most 3 (B - 1) pages per candidate.
absl::Status ForeignTrials(const Context& ctx, const RowStates& rs,
                           const TrialPlan& plan, std::deque<Substitute>* subs,
                           std::vector<Trial>* trials) {
  const ResolvedLayout& layout = *ctx.in->layout;
  for (const int64_t j : plan.top) {
    for (int64_t other = 0; other < ctx.d.batch; ++other) {
      if (other == rs.b) continue;
      const auto& pages = layout.block_pages[other];
      for (int64_t i : {j, j - 1, j + 1}) {
        if (i < 0 || i >= static_cast<int64_t>(pages.size())) continue;
        const int64_t page = pages[i];
        if (std::find(rs.pages.begin(), rs.pages.end(), page) !=
                rs.pages.end() ||
            ctx.TimeUp() || ctx.Cancelled()) {
          continue;  // the row's own page: a duplicate, tried above
        }
        subs->emplace_back();
        Substitute& sub = subs->back();
        sub.as = j;
        sub.from = -1;
        const absl::Status st =
            ComputeSubstituteStates(ctx, rs.b, page, j, &sub.out, &sub.lse);
        if (absl::IsInvalidArgument(st)) {
          subs->pop_back();
          continue;
        }
        ATTNAUDIT_RETURN_IF_ERROR(st);
        Trial t{kForeignPage, j, -1, 1, {&sub}, false, Scorer(ctx)};
        t.foreign_page = page;
        t.detail = absl::StrFormat("row %d's page %d (its logical block %d)",
                                   other, EnginePageId(ctx, page), i);
        trials->push_back(std::move(t));
      }
    }
  }
  return absl::OkStatus();
}

// The row read with one key fewer or one more than kv_seq_lens says: its
// last block resized, and where the count moves a sliding window's start
// into an earlier block, that block read with the window moved.
absl::Status SeqLenTrials(const Context& ctx, const RowStates& rs,
                          std::deque<Substitute>* subs,
                          std::vector<Trial>* trials) {
  const int64_t last = static_cast<int64_t>(rs.pages.size()) - 1;
  if (last < 0) return absl::OkStatus();
  for (int64_t delta : {-1, 1}) {
    const size_t before = subs->size();
    subs->emplace_back();
    Substitute& sub = subs->back();
    sub.as = last;
    sub.from = -1;
    absl::Status st =
        ComputeResizedLastBlock(ctx, rs.b, delta, &sub.out, &sub.lse);
    std::vector<const Substitute*> parts{&sub};
    const std::vector<int64_t> moved = BlocksMovedByCount(ctx, rs.b, delta);
    // One query's window starts in one block; more (a long chunk of
    // queries) is not tried.
    if (st.ok() && moved.size() > 1) st = absl::NotFoundError("");
    if (st.ok() && moved.size() == 1) {
      subs->emplace_back();
      Substitute& window = subs->back();
      window.as = window.from = moved[0];
      st = ComputeMovedBlock(ctx, rs.b, moved[0], delta, &window.out,
                             &window.lse);
      parts.push_back(&window);
    }
    if (absl::IsNotFound(st) || absl::IsInvalidArgument(st)) {
      subs->resize(before);
      continue;
    }
    ATTNAUDIT_RETURN_IF_ERROR(st);
    const int64_t other = moved.empty() ? -1 : moved[0];
    Trial t{kSeqLenOffByOne, last, other, 1, parts, false, Scorer(ctx)};
    t.detail = absl::StrFormat("%+d: the engine read %d keys of row %d", delta,
                               ctx.in->layout->seq_lens[rs.b] + delta, rs.b);
    if (!moved.empty()) {
      absl::StrAppend(&t.detail, ", its sliding window's start moved with it");
    }
    trials->push_back(std::move(t));
  }
  return absl::OkStatus();
}

// The trials of the plan; the states of pages read in another block's
// place go to *subs (a deque: the trials point into it).
absl::Status BuildTrials(const Context& ctx, const Row& row,
                         const RowStates& rs, const LeaveOneOut& loo,
                         const TrialPlan& plan, std::deque<Substitute>* subs,
                         std::vector<Trial>* trials) {
  const int64_t nb = static_cast<int64_t>(rs.pages.size());
  // A page with a non-finite value in the slots it would be read at (an
  // unused slot of a partly filled page) cannot have been read there by an
  // engine that produced finite output: that candidate is not tried.
  auto substitute = [&](int64_t as,
                        int64_t from) -> absl::StatusOr<const Substitute*> {
    subs->emplace_back();
    const absl::Status st = MakeSubstitute(ctx, rs, as, from, &subs->back());
    if (absl::IsInvalidArgument(st)) {
      subs->pop_back();
      return nullptr;
    }
    ATTNAUDIT_RETURN_IF_ERROR(st);
    return &subs->back();
  };
  auto duplicate = [&](int64_t j, int64_t i) -> absl::Status {
    ATTNAUDIT_ASSIGN_OR_RETURN(const Substitute* sub, substitute(j, i));
    if (sub != nullptr) {
      trials->push_back({kDuplicatePage, j, i, 1, {sub}, false, Scorer(ctx)});
    }
    return absl::OkStatus();
  };
  for (int64_t j : plan.top) {
    trials->push_back({kDropBlock, j, -1, 0, {}, false, Scorer(ctx)});
    // The stale page is the block the fit names; its trial gives the
    // evidence (the block left out, its mass kept at the engine's LSE).
    if (j == plan.stale_block) {
      trials->push_back({kStalePage, j, -1, 2, {}, true, Scorer(ctx)});
    }
    for (int64_t i = 0; i < nb && !ctx.TimeUp() && !ctx.Cancelled(); ++i) {
      if (i != j) ATTNAUDIT_RETURN_IF_ERROR(duplicate(j, i));
    }
  }
  // Off-by-one block tables: every block reading its neighbour's page.
  for (int64_t j = 0; j < nb && nb >= 2; ++j) {
    if (std::find(plan.top.begin(), plan.top.end(), j) != plan.top.end()) {
      continue;
    }
    for (int64_t i : {j - 1, j + 1}) {
      if (i < 0 || i >= nb || ctx.TimeUp() || ctx.Cancelled()) continue;
      ATTNAUDIT_RETURN_IF_ERROR(duplicate(j, i));
    }
  }
  for (int64_t a : plan.partial) {
    for (int64_t b : plan.partners) {
      if (b == a || ctx.TimeUp() || ctx.Cancelled()) continue;
      ATTNAUDIT_ASSIGN_OR_RETURN(const Substitute* ab, substitute(a, b));
      ATTNAUDIT_ASSIGN_OR_RETURN(const Substitute* ba, substitute(b, a));
      if (ab == nullptr || ba == nullptr) continue;
      trials->push_back({kSwappedPages, a, b, 1, {ab, ba}, false, Scorer(ctx)});
    }
  }
  ATTNAUDIT_RETURN_IF_ERROR(ForeignTrials(ctx, rs, plan, subs, trials));
  return SeqLenTrials(ctx, rs, subs, trials);
}

// Whether the engine's partials allow trial t: the ranks of the blocks it
// changes (both of a swap) cover every drifting rank.
bool AllowedByRanks(const Context& ctx, const RowStates& rs,
                    const RankEvidence& ranks, const Trial& t) {
  if (!ranks.known) return true;
  std::vector<int64_t> blocks{t.j};
  if (t.hypothesis == kSwappedPages) blocks.push_back(t.other);
  return AgreesWithRanks(ranks, RanksOf(ctx, rs, blocks));
}

// A page read in a block's place whose reading alone, the block's own
// content kept, explains E as well: the block's content takes no weight,
// and the page could have been read in any such block's place.
void NotPlacedIfKept(const Trial& t, Candidate* c) {
  const Evaluation kept = t.kept.Finish();
  if (!kept.explains &&
      !(kept.excess_after <= 1.1 * c->eval.excess_after + 1e-300)) {
    return;
  }
  c->eval.explains = false;
  c->detail = absl::StrCat(
      c->detail.empty() ? "" : c->detail + "; ",
      "the block's own content takes no weight: any such block fits as well");
}

// The finalists as candidates: the best per hypothesis and block
// (duplicates: per block, the best source page).
void CollectCandidates(const Context& ctx, const Row& row, const RowStates& rs,
                       const std::vector<Trial>& trials, const StaleFit& fit,
                       int64_t stale_block, const RankEvidence& ranks,
                       std::vector<Candidate>* out) {
  std::vector<Candidate> best;
  for (const Trial& t : trials) {
    if (!t.finalist || !AllowedByRanks(ctx, rs, ranks, t)) continue;
    // A count's moved window block is part of the account, not a page
    // named beside the block.
    const bool names_other = !t.subs.empty() && t.hypothesis != kSeqLenOffByOne;
    Candidate c = BlockCandidate(ctx, rs, t.hypothesis, t.j,
                                 names_other ? t.other : -1, t.scorer, t.bias);
    c.detail = t.detail;
    if (t.foreign_page >= 0)
      c.location.other_page = EnginePageId(ctx, t.foreign_page);
    // At the located block a dropped block and a stale page differ only in
    // the content left in its place: the drop stands only when it explains.
    if (t.hypothesis == kDropBlock && t.j == stale_block && !c.eval.explains) {
      continue;
    }
    // A substitution names the content read in the block's place: unless it
    // reproduces the engine, the page only resembles what was read (a
    // stale page, whose content is unknown, is the better account).
    if (!t.subs.empty() && !c.eval.within_tolerance) c.eval.score *= 0.5;
    // Unless the stale fit identified the block: then the block's own
    // content is measurably missing from E (replacing any other block, a
    // light one's replacement reading as an addition, fits worse).
    const bool placed = fit.identified && t.j == fit.best;
    if (t.Replaces() && c.eval.explains && !placed) NotPlacedIfKept(t, &c);
    // A stale page's content is unknown: it is located by the fit, not
    // reconstructed (docs/DIAGNOSIS.md, "Pages").
    if (t.stale) {
      LocateStaleFit(
          fit,
          absl::StrFormat("logical block %d of row %d", fit.runner_up, row.b),
          &c);
    }
    bool replaced = false;
    for (Candidate& b : best) {
      if (b.hypothesis == c.hypothesis &&
          b.location.logical_block == c.location.logical_block) {
        if (c.eval.score > b.eval.score) b = c;
        replaced = true;
      }
    }
    if (!replaced) best.push_back(std::move(c));
  }
  for (Candidate& c : best) out->push_back(std::move(c));
}

}  // namespace

absl::Status BlockHypotheses(const Context& ctx, const Row& row,
                             const RowStates& rs, const RankEvidence& ranks,
                             std::vector<Candidate>* out) {
  const int64_t nb = static_cast<int64_t>(rs.pages.size());
  if (nb < 1) return absl::OkStatus();
  const LeaveOneOut loo = ScanLeaveOneOut(ctx, row, rs);
  // With the engine's partials, a block whose ranks do not cover every
  // drifting rank cannot be the stale one.
  std::vector<uint8_t> allowed(static_cast<size_t>(nb), 1);
  for (int64_t j = 0; j < nb && ranks.known; ++j) {
    allowed[j] = AgreesWithRanks(ranks, RanksOf(ctx, rs, {j}));
  }
  const StaleFit fit = FitStalePages(ctx, row, rs, RowValueStats(ctx, row.b),
                                     nullptr, ranks.known ? &allowed : nullptr);
  ctx.evaluated += 2 * nb;
  const TrialPlan plan = PlanTrials(rs, loo, fit);
  std::deque<Substitute> subs;
  std::vector<Trial> trials;
  ATTNAUDIT_RETURN_IF_ERROR(
      BuildTrials(ctx, row, rs, loo, plan, &subs, &trials));
  ScoreTrials(ctx, row, rs, false, &trials);
  PickFinalists(ctx, row, &trials);
  ScoreTrials(ctx, row, rs, true, &trials);
  ctx.evaluated += static_cast<int64_t>(trials.size());
  CollectCandidates(ctx, row, rs, trials, fit, plan.stale_block, ranks, out);
  return absl::OkStatus();
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
