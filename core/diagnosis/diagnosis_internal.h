// Between the diagnosis' files (not a public API): the examined rows, the
// scoring of a recomputed attention against E, the recomputation under an
// alternative configuration, and the hypothesis families.
#ifndef ATTNAUDIT_CORE_DIAGNOSIS_DIAGNOSIS_INTERNAL_H_
#define ATTNAUDIT_CORE_DIAGNOSIS_DIAGNOSIS_INTERNAL_H_

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/attention/unit_states.h"
#include "core/diagnosis/diagnosis.h"
#include "core/verdict/statistical.h"

namespace attnaudit {
namespace diagnosis_internal {

// The hypothesis names, once: each X(constant, name) row defines the
// constant the hypothesis files use, and HypothesisNames() (the metric's
// label set) is the list of rows, so a hypothesis cannot be reported
// without being in it. The RoPE checks' diagnoses (core/rope_check) name
// q-rope-missing and q-rope-twice; they are rows here so that
// HypothesisNames() covers every name a report can carry. "unexplained"
// stays last.
#define ATTNAUDIT_DIAGNOSIS_HYPOTHESES(X)        \
  X(kLseBase, "lse-base")                        \
  X(kSinksInLse, "sinks-in-lse")                 \
  X(kRopeOffset, "rope-offset")                  \
  X(kKRopeTwice, "k-rope-twice")                 \
  X(kKRopeMissing, "k-rope-missing")             \
  X(kRopeStyle, "rope-style")                    \
  X(kWrongScale, "wrong-scale")                  \
  X(kSoftcapMissing, "softcap-missing")          \
  X(kGqaMapping, "gqa-mapping")                  \
  X(kWindowOffByOne, "window-off-by-one")        \
  X(kSinksMissing, "sinks-missing")              \
  X(kFp8Scale, "fp8-scale")                      \
  X(kDropBlock, "drop-block")                    \
  X(kStalePage, "stale-page")                    \
  X(kDuplicatePage, "duplicate-page")            \
  X(kSwappedPages, "swapped-pages")              \
  X(kCpMissingShard, "cp-missing-shard")         \
  X(kCpDoubledShard, "cp-doubled-shard")         \
  X(kCpLseBase, "cp-lse-base")                   \
  X(kCpBf16Combine, "cp-bf16-combine")           \
  X(kLowPrecision, "low-precision")              \
  X(kWindowIgnored, "window-ignored")            \
  X(kKvHeadsPermuted, "kv-heads-permuted")       \
  X(kVFromK, "v-from-k")                         \
  X(kRopeTheta, "rope-theta")                    \
  X(kRopeScalingIgnored, "rope-scaling-ignored") \
  X(kRopeScalingLength, "rope-scaling-length")   \
  X(kRopePartialRotary, "rope-partial-rotary")   \
  X(kForeignPage, "foreign-page")                \
  X(kSeqLenOffByOne, "seq-len-off-by-one")       \
  X(kLayout, "layout")                           \
  X(kQRopeMissing, "q-rope-missing")             \
  X(kQRopeTwice, "q-rope-twice")                 \
  X(kUnexplained, "unexplained")

#define ATTNAUDIT_DIAGNOSIS_NAME_CONSTANT(constant, name) \
  inline constexpr char constant[] = name;
ATTNAUDIT_DIAGNOSIS_HYPOTHESES(ATTNAUDIT_DIAGNOSIS_NAME_CONSTANT)
#undef ATTNAUDIT_DIAGNOSIS_NAME_CONSTANT

using Clock = std::chrono::steady_clock;

// What every stage reads.
struct Context {
  const DiagnosisInputs* in = nullptr;
  const DiagnosisOptions* opt = nullptr;
  const PreparedAttention* p = nullptr;
  SnapshotDims d;
  Tolerances tol;            // E-R
  NoiseModel noise;          // the statistical detector's, E-R
  double lse_unit = 1;       // noise unit of an LSE difference
  double lse_magnitude = 0;  // max |R.lse|, what the LSE tolerance scales by
  double clean_cell = 0;     // energy of a clean cell
  Clock::time_point start;
  mutable int64_t evaluated = 0;  // hypothesis variants evaluated

  bool TimeUp() const;
  // The LSE unit and tolerance scale with the LSE's magnitude: against a
  // hypothesis whose LSE is far larger than R's (a missing scale
  // multiplying every score), E's own fp32 rounding is as much larger.
  double LseScale(double a_lse) const {
    return lse_magnitude > 0 && std::fabs(a_lse) > lse_magnitude
               ? std::fabs(a_lse) / lse_magnitude
               : 1.0;
  }
  bool Cancelled() const;
  int64_t Cells() const { return d.queries * d.q_heads; }
};

// One examined batch row: E and R over its cells (s, h), [Sq*Hq(*D)], the
// noise unit of each out element, and E's energy against R per cell.
struct Row {
  int64_t b = 0;
  bool has_out = false, has_lse = false;
  std::vector<double> e_out, r_out, unit;
  std::vector<double> e_lse, r_lse;
  std::vector<double> before;  // per cell
  double lse_drift = 0;        // mean |E.lse - R.lse| in LSE noise units
  // E against R per cell, for the evidence: max |diff| of out, sum of
  // z^2 of out, |diff| of the LSE.
  std::vector<double> before_max, before_z2, before_lse;
};

// An attention result over a row's cells; `have` marks computed cells.
struct RowResult {
  std::vector<double> out;  // [Sq*Hq*D]
  std::vector<double> lse;  // [Sq*Hq]
  std::vector<uint8_t> have;
  void Reset(const SnapshotDims& d);
};

// e - a, with equal values (equal infinities included) 0 apart.
inline double Diff(double e, double a) { return e == a ? 0.0 : e - a; }

// Energy of cell c of E against `a`: mean over D of z^2 (out) plus z^2 of
// the LSE, in noise units; a clean cell has about ctx.clean_cell.
double CellEnergy(const Context& ctx, const Row& row, const double* a_out,
                  double a_lse, int64_t c);
// The LSE's part of CellEnergy: z^2 of E's LSE against a_lse, in the LSE
// unit scaled as the hypothesis' LSE (Context::LseScale); 0 without the
// engine's LSE. What is left of out's energy is CellEnergy minus this.
double LseZ2(const Context& ctx, const Row& row, double a_lse, int64_t c);

// How well one hypothesis explains E over the cells it was computed for.
struct Evaluation {
  double score = 0;  // share of the excess energy removed, [0, 1]
  bool explains = false;
  bool within_tolerance = false;  // nothing left over the E-R tolerance
  double excess_before = 0, excess_after = 0;
  DiagnosisEvidence before, after;
  std::vector<int64_t> heads;  // query heads whose cells it explains
  int64_t query = -1;          // the one query explained, when Sq > 1
};

// Whether the row drifts: a cell beyond the E-R tolerance, or out's noise
// above twice a correct engine's. A recomputation near R "removes" some of
// a row's noise by chance; only a drifting row has something to explain.
bool RowDrifts(const Context& ctx, const Row& row);
// Whether a cell of the row is beyond the E-R tolerance (of out or the
// LSE): what a correct engine never shows.
bool BeyondTolerance(const Context& ctx, const Row& row);

// Accumulates an Evaluation over (row, result) pairs.
class Scorer {
 public:
  explicit Scorer(const Context& ctx) : ctx_(ctx) {}
  void Add(const Row& row, const RowResult& result);
  // A cell with a given energy after (for hypotheses scored on energies).
  void AddCell(const Row& row, int64_t c, const double* a_out, double a_lse);
  Evaluation Finish() const;

 private:
  const Context& ctx_;
  double before_ = 0, after_ = 0;
  // The same per quantity: the score is the worse of the two.
  double out_before_ = 0, out_after_ = 0, lse_before_ = 0, lse_after_ = 0;
  int64_t cells_ = 0;
  double z2_before_ = 0, z2_after_ = 0;
  int64_t elements_ = 0;
  int64_t over_after_ = 0;
  DiagnosisEvidence ev_before_, ev_after_;
  std::vector<int64_t> head_explained_, head_drifting_;
  std::vector<int64_t> query_explained_;
};

// --- Recomputation under an alternative configuration. ---

// How the keys (and for a layout swap the values) a hypothesis attends
// with differ from the prepared ones:
//   kRotateAgain, kUnrotate, kRestyle  the cached keys rotated again, back,
//                                      or back and with the other pairing;
//   kReRotate     a pre-RoPE cache rotated with AltSpec::key_rope instead;
//   kTransposed   each page's [page_size, D] block of a KV head holding K
//                 transposed ([D, page_size] in memory: vLLM's CPU cache);
//   kSwapLayout   the pages in the other layout (NHD <-> HND), K and V.
enum class KeyTransform {
  kNone,
  kRotateAgain,
  kUnrotate,
  kRestyle,
  kReRotate,
  kTransposed,
  kSwapLayout
};

struct AltSpec {
  std::vector<double> q;  // [B,Sq,Hq,D] post-RoPE; empty: prepared's
  // GQA: query head h reads KV head kv_of[h]; empty: h / group.
  std::vector<int64_t> kv_of;
  bool set_scale = false;
  double scale = 0;
  bool set_softcap = false;
  double softcap = 0;
  bool set_window = false;
  int64_t window = 0;
  bool drop_sinks = false;
  std::vector<double> k_scale, v_scale;  // [Hkv]; empty: prepared's
  KeyTransform keys = KeyTransform::kNone;
  // kReRotate: the RoPE the keys are rotated with.
  std::shared_ptr<const RopeConfig> key_rope;
  // V read from the K buffer (the keys as the engine cached them).
  bool v_from_k = false;
};

// Attention of row b under each spec for the query heads of KV heads
// `kv_heads` (all when empty), folded in fp64 from fp32 unit states, into
// (*results)[i]. Specs that share their keys, soft-cap and window share one
// pass over the row's pages (their queries are stacked), so a catalogue of
// q-side variants costs about one read of the row's K/V.
absl::Status ComputeAlternatives(const Context& ctx,
                                 const std::vector<const AltSpec*>& specs,
                                 int64_t b,
                                 const std::vector<int64_t>& kv_heads,
                                 std::vector<RowResult>* results);

// q recomputed with RoPE at query position + delta, and/or with the other
// pairing style (restyle).
absl::StatusOr<std::vector<double>> AlternativeQueries(const Context& ctx,
                                                       int64_t delta,
                                                       bool restyle);
// q rotated with another RoPE configuration (from the pre-RoPE q, under the
// snapshot's cast point; the engine's table is not used: it follows the
// declared model).
absl::StatusOr<std::vector<double>> QueriesRotatedWith(
    const Context& ctx, const RopeConfig& config);

// --- Per-row unit states (R, fp64) for the page and CP hypotheses. ---

struct RowStates {
  int64_t b = 0;
  std::vector<KvUnit> units;
  UnitStates states;  // R states of the row's units (row 0 of its plan)
  std::vector<int32_t> block_begin;  // units of block j: [begin[j], begin[j+1])
  std::vector<int32_t> pages;        // k_pages index of each block
  std::vector<uint8_t> full;         // every slot visible to every query
};
absl::Status ComputeRowStates(const Context& ctx, int64_t b, RowStates* rs);

// States of a page read as another block (the engine's block table names
// page `page` for logical block `as_block`): fp32 states, per cell.
// InvalidArgument when the page holds a non-finite value in the slots read
// (an unused slot of a partly filled page may): the hypothesis does not
// apply.
absl::Status ComputeSubstituteStates(const Context& ctx, int64_t b,
                                     int64_t page, int64_t as_block,
                                     std::vector<double>* out,
                                     std::vector<double>* lse);

// An engine that counts `delta` keys more or fewer for row b places its
// queries by its count: each query's causal and window limits move by
// `delta` positions with it (TokenRun::query_shift).
//
// States of row b's last block read with `delta` tokens more (+1: the next
// slot of its page, seen as the newest key) or fewer (-1), per cell, by
// such an engine. NotFound when there is no such slot (a full last
// page, or a one-token block for -1); InvalidArgument as above.
absl::Status ComputeResizedLastBlock(const Context& ctx, int64_t b,
                                     int64_t delta, std::vector<double>* out,
                                     std::vector<double>* lse);

// The blocks of row b before its last in which some key's visibility to
// some query of the row changes when the row is counted `delta` keys off
// (a sliding window's start moving: one block for one query), ascending.
std::vector<int64_t> BlocksMovedByCount(const Context& ctx, int64_t b,
                                        int64_t delta);

// States of row b's block `block`, its own page, read by an engine that
// counts the row `delta` keys off (above); InvalidArgument as above.
absl::Status ComputeMovedBlock(const Context& ctx, int64_t b, int64_t block,
                               int64_t delta, std::vector<double>* out,
                               std::vector<double>* lse);

// --- Hypothesis families; each appends what it evaluated. ---

struct Candidate {
  std::string hypothesis;
  std::string detail;
  DiagnosisLocation location;
  Evaluation eval;
  int rank_bias = 0;  // ties: fewer free parameters first
  // Placed, not recomputed (a stale page, whose content is unknown): its
  // score is assigned, and a recomputation that removes nearly all of the
  // drift ranks above it.
  bool located = false;
  // A located stale page: its stale fit's cost (StaleFit), which orders
  // stale pages located by different fits of one row.
  double fit_cost = 1.0 / 0.0;
  // A page account whose place the evidence does not fix (another place
  // fits about as well; `detail` says which): never "explains".
  bool unplaced = false;
};

absl::Status LseHypotheses(const Context& ctx, const std::vector<Row>& rows,
                           std::vector<Candidate>* out);
// Global hypotheses, in two steps: every variant screened on the row and
// KV heads that drift most, then the best recomputed on every examined row.
struct Variant {
  const char* hypothesis;
  std::string detail;
  AltSpec spec;
  int rank_bias = 0;
};
struct GlobalScreen {
  std::vector<Variant> variants;
  std::vector<std::pair<double, size_t>>
      screened;  // (score, variant), best first
};
absl::Status ScreenGlobal(const Context& ctx, const std::vector<Row>& rows,
                          GlobalScreen* screen);
double BestScreened(const GlobalScreen& screen);
absl::Status ConfirmGlobal(const Context& ctx, const std::vector<Row>& rows,
                           const GlobalScreen& screen,
                           std::vector<Candidate>* out);
// What a context-parallel engine's own partials (cp.rank_out, rank_lse)
// say about one row: which ranks' partials drift from the reference
// partials over their shards (R's unit states of each rank, merged). A
// fault inside a rank (a stale page of its shard, its LSE in base 2) makes
// that rank drift; a fault of the combine leaves every rank right.
// `known` is false without the partials (or without CP).
struct RankEvidence {
  bool known = false;
  std::vector<uint8_t> drifts;  // [W]
  bool Any() const;
};
RankEvidence RankDrift(const Context& ctx, const Row& row, const RowStates& rs);
// The ranks ([W] flags) holding any unit of the row's given logical blocks.
std::vector<uint8_t> RanksOf(const Context& ctx, const RowStates& rs,
                             const std::vector<int64_t>& blocks);
// Whether a fault confined to `ranks` (the ranks whose partials it
// changes) agrees with the evidence: some rank drifts and every drifting
// rank is among them. True when the partials are unknown.
bool AgreesWithRanks(const RankEvidence& ev, const std::vector<uint8_t>& ranks);

absl::Status BlockHypotheses(const Context& ctx, const Row& row,
                             const RowStates& rs, const RankEvidence& ranks,
                             std::vector<Candidate>* out);
absl::Status CpHypotheses(const Context& ctx, const Row& row,
                          const RowStates& rs, const RankEvidence& ranks,
                          std::vector<Candidate>* out);
void PrecisionHypothesis(const Context& ctx, const std::vector<Row>& rows,
                         std::vector<Candidate>* out);

// The engine's number for pool page `page` (its page id, or the index).
int64_t EnginePageId(const Context& ctx, int64_t page);

// The engine's key-only LSE of cell c of the row (its declared LSE less the
// sink); the row must have the engine's LSE.
double EngineKeysLse(const Context& ctx, const Row& row, int64_t c);

// fp64 merge of partial states: (m, l, acc[D]) with out = acc / l,
// lse = m + ln l.
struct Acc {
  double m = -1.0 / 0.0;
  double l = 0;
  std::vector<double> acc;
  explicit Acc(int64_t dim = 0) : acc(static_cast<size_t>(dim), 0.0) {}
  void Clear();
  void Add(const double* out, double lse, double weight = 1.0);
  void Add(const float* out, double lse);
  void Merge(const Acc& other);
  double Lse() const;
  // out (normalised) into dst, multiplied by `scale`.
  void Out(double* dst, double scale) const;
};

// Per cell (s, h) of one row: the merged state of every group of units (a
// logical block by default; explicit groups, e.g. a CP rank's local pages,
// otherwise), and prefix / suffix merges, so that "every group but j" costs
// one merge. Load() before use; not thread-safe (one per thread).
class CellBlocks {
 public:
  CellBlocks(const Context& ctx, const RowStates& rs);
  // groups[j]: the indices (into rs.units) of group j's units.
  CellBlocks(const Context& ctx, const RowStates& rs,
             const std::vector<std::vector<int32_t>>& groups);

  void Load(int64_t s, int64_t h);
  Acc Without(int64_t j) const;  // every group but j
  const Acc& Block(int64_t j) const { return blocks_[j]; }
  const Acc& All() const { return prefix_[nb_]; }
  int64_t blocks() const { return nb_; }

 private:
  const Context& ctx_;
  const RowStates& rs_;
  int64_t nb_;
  std::vector<int32_t> begin_, units_;  // group j: units_[begin_[j] ..)
  std::vector<Acc> blocks_, prefix_, suffix_;
};

// Per KV head, over row b's cached tokens (as stored, before the V scale):
// max |V| (what any attention output of that head is bounded by), the mean
// of each dim, and the mean over dims of each dim's variance.
struct ValueStats {
  std::vector<double> max;   // [Hkv]
  std::vector<double> mean;  // [Hkv * D]
  std::vector<double> var;   // [Hkv]
};
ValueStats RowValueStats(const Context& ctx, int64_t b);

// The stale-page fit (docs/DIAGNOSIS.md, "Pages"): for every group j of a
// row, the negative log-likelihood (nats) of E under "group j was read with
// content of unknown values": E is the rest of the row merged with one state
// of share sigma (per cell, fitted; with the engine's LSE, the LSE pins it)
// whose value is its keys' softmax average of values drawn from the row's
// own V (per-dim mean and variance; the average's spread, between one key's
// and an even average's over the group's tokens, fitted per cell), E's
// rounding the noise. Integrating the values out charges a state that
// takes a large share for the freedom it has, so a light page whose content
// changed outranks a heavy page that would have to hold nearly its own
// content. Its competitor is unstructured drift: E is R plus noise of
// fitted size per cell. `identified`: the best group's posterior
// probability (PlaceLogOdds) is at least 1 - alpha against every other
// group and the unstructured drift, and the values it implies stay within
// the cache's range.
struct StaleFit {
  std::vector<double> cost;  // [groups], nats
  int64_t best = -1;         // -1: no group (or the row has one)
  int64_t runner_up = -1;
  double margin = 0;    // cost[runner_up] - cost[best]
  double evidence = 0;  // cost with nothing stale - cost[best]
  // cost of E as R plus unstructured noise (per cell, of fitted size) -
  // cost[best], less the Laplace charge for the parameters the stale
  // hypothesis fits beyond the noise model's: a stale page must beat
  // noise without structure too (a heavy page with content of unknown
  // values can absorb any small drift).
  double over_noise = 0;
  // ln of the posterior odds against the best group (every other group
  // and the unstructured drift), and ln of the odds of some group stale
  // against the unstructured drift.
  double doubt = 0;
  double stale_odds = 0;
  bool consistent = false;
  bool identified = false;
  // A stale page at all: the best group's values in range and a stale
  // page somewhere surely (PlaceLogOdds) more likely than unstructured
  // drift (else no stale page is reported).
  bool Structured() const;
};
// `groups`: null for the row's logical blocks; `allowed` ([groups] flags,
// null: all) the groups that may be named (the others are neither named
// nor alternatives).
StaleFit FitStalePages(const Context& ctx, const Row& row, const RowStates& rs,
                       const ValueStats& values,
                       const std::vector<std::vector<int32_t>>* groups,
                       const std::vector<uint8_t>* allowed);

// The posterior log-odds a stale page's place must reach to be named
// (StaleFit::identified), ln((1 - alpha) / alpha) with alpha the
// statistical detector's family-wise false-alarm probability
// (StatisticalInputs::alpha, about 16.1 nats): a place is named as surely
// as a DRIFT is called. A located stale page's score: named, or with
// another group about as good (below the floor at which "unexplained"
// leads).
double PlaceLogOdds();
inline constexpr double kStaleScore = 0.9;
inline constexpr double kAmbiguousStaleScore = 0.45;

// Makes c the located stale page of `fit`: named (score 0.9, explains)
// when the fit identifies its group, else below the floor at which
// "unexplained" leads, its detail naming `runner_up` (the group that fits
// about as well) and the margin.
void LocateStaleFit(const StaleFit& fit, const std::string& runner_up,
                    Candidate* c);

// The final write of a key-only state as the engine declared it: the sink
// of query head h (if any) in the denominator, v_scale, and the LSE with or
// without the sink. out is normalised in place.
void FinishState(const Context& ctx, const AltSpec* spec, int64_t h,
                 double* out, double* lse);

// The final (out, lse) of a key-only state for query head h (FinishState).
void Final(const Context& ctx, const Acc& a, int64_t h, double* out,
           double* lse);

}  // namespace diagnosis_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_DIAGNOSIS_DIAGNOSIS_INTERNAL_H_
