// Selected-token log-probs through a (synthetic) lm_head, and the RL
// frameworks' agreement metrics. Declared in drift.h; definitions in
// docs/NUMERICS.md ("Log-prob agreement").
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/drift/drift.h"
#include "core/drift/logits_internal.h"

namespace attnaudit {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double K3Term(double x) {
  if (std::fabs(x) < 1e-4) {
    // x^2/2 + x^3/6 + x^4/24; the next term is below 1e-20 relative.
    return x * x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0)));
  }
  return std::expm1(x) - x;
}

// log_softmax(z / temperature)[id], max-shifted; NaN when any logit is not
// finite, so an engine NaN/Inf in out stays visible.
double SelectedLogSoftmax(double* z, int64_t vocab, int64_t id,
                          double temperature) {
  double max_z = -std::numeric_limits<double>::infinity();
  bool finite = true;
  for (int64_t v = 0; v < vocab; ++v) {
    z[v] /= temperature;
    finite = finite && std::isfinite(z[v]);
    max_z = std::max(max_z, z[v]);
  }
  if (!finite) return kNaN;
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[v] - max_z);
  return (z[id] - max_z) - std::log(sum);
}

}  // namespace

namespace {

// The shape checks shared by every output; returns Hq * D.
absl::StatusOr<int64_t> CheckOutShape(const DenseView& out) {
  if (out.shape.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: expected [B,Sq,Hq,D], got rank ", out.shape.size()));
  }
  int64_t out_n = 0;
  if (!CheckedNumElements(out.shape, &out_n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "out: shape [", absl::StrJoin(out.shape, ","), "] is invalid"));
  }
  if (out_n > 0 && out.values == nullptr) {
    return absl::InvalidArgumentError("out: values are null");
  }
  return out.shape[2] * out.shape[3];
}

absl::Status CheckLmHead(const Tensor& lm_head, int64_t hidden) {
  if (!lm_head.present() || !IsFloating(lm_head.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lm_head: expected a floating tensor, got ", lm_head.DebugString()));
  }
  ATTNAUDIT_RETURN_IF_ERROR(
      lm_head.CheckLayout("lm_head", std::numeric_limits<int64_t>::max()));
  if (hidden < 1 || lm_head.rank() != 2 || lm_head.dim(1) != hidden ||
      lm_head.dim(0) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lm_head: expected [V>=1, Hq*D=", hidden, "], got ",
                     lm_head.DebugString()));
  }
  return absl::OkStatus();
}

// The active tokens (flat b * Sq + s) and their ids, checked against V.
absl::Status ActiveTokens(const Tensor& token_ids, int64_t batch,
                          int64_t queries, int64_t vocab,
                          const uint8_t* active_mask,
                          std::vector<int64_t>* active,
                          std::vector<int64_t>* ids) {
  if (!token_ids.present() || !IsInteger(token_ids.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("selected_token_ids: expected an i32/i64 tensor, got ",
                     token_ids.DebugString()));
  }
  ATTNAUDIT_RETURN_IF_ERROR(token_ids.CheckLayout(
      "selected_token_ids", std::numeric_limits<int64_t>::max()));
  if (token_ids.rank() != 2 || token_ids.dim(0) != batch ||
      token_ids.dim(1) != queries) {
    return absl::InvalidArgumentError(
        absl::StrCat("selected_token_ids: expected [B=", batch,
                     ", Sq=", queries, "], got ", token_ids.DebugString()));
  }
  for (int64_t t = 0; t < batch * queries; ++t) {
    if (active_mask != nullptr && active_mask[t] == 0) continue;
    const int64_t id = token_ids.IntAt(t);
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("selected_token_ids[", t / queries, "][", t % queries,
                       "]: token id ", id, " is outside [0, ", vocab, ")"));
    }
    active->push_back(t);
    ids->push_back(id);
  }
  return absl::OkStatus();
}

// Logits of a chunk of hidden vectors through all of lm_head, in parallel
// over blocks of rows (each logit is one dot product, so the result does
// not depend on the split), plus the row norms.
void ChunkLogits(const Tensor& lm_head, const std::vector<double>& hiddens,
                 int64_t num_hidden, int threads, std::vector<double>* logits,
                 LmHeadNorms* norms) {
  const int64_t vocab = lm_head.dim(0);
  const int64_t hidden = lm_head.dim(1);
  constexpr int64_t kRowsPerTask = 64;
  const int64_t tasks = (vocab + kRowsPerTask - 1) / kRowsPerTask;
  std::vector<double> l1(static_cast<size_t>(tasks), 0.0);
  std::vector<double> l2(static_cast<size_t>(tasks), 0.0);
  logits->resize(static_cast<size_t>(num_hidden * vocab));
  ParallelFor(tasks, threads, [&](int64_t task) {
    const int64_t v0 = task * kRowsPerTask;
    const int64_t v1 = std::min(vocab, v0 + kRowsPerTask);
    drift_internal::LogitRows(lm_head.raw(), lm_head.dtype(), hidden, v0, v1,
                              hiddens.data(), num_hidden, logits->data(), vocab,
                              &l1[task], &l2[task]);
  });
  for (int64_t t = 0; t < tasks; ++t) {
    norms->max_row_l1 = std::max(norms->max_row_l1, l1[t]);
    norms->max_row_l2 = std::max(norms->max_row_l2, l2[t]);
  }
}

}  // namespace

absl::StatusOr<std::vector<std::vector<double>>> SelectedLogprobsForEach(
    const std::vector<DenseView>& outs, const Tensor& lm_head,
    const Tensor& token_ids, const uint8_t* active_mask, double temperature,
    int threads, LmHeadNorms* norms) {
  LmHeadNorms local_norms;
  if (norms == nullptr) norms = &local_norms;
  *norms = LmHeadNorms();
  if (outs.empty()) {
    if (!lm_head.present()) return std::vector<std::vector<double>>();
    ATTNAUDIT_RETURN_IF_ERROR(
        lm_head.CheckLayout("lm_head", std::numeric_limits<int64_t>::max()));
    if (lm_head.rank() != 2 || !IsFloating(lm_head.dtype())) {
      return absl::InvalidArgumentError(
          absl::StrCat("lm_head: expected a floating [V, H] tensor, got ",
                       lm_head.DebugString()));
    }
    std::vector<double> none;
    ChunkLogits(lm_head, none, 0, threads, &none, norms);
    return std::vector<std::vector<double>>();
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(const int64_t hidden, CheckOutShape(outs[0]));
  for (const DenseView& out : outs) {
    if (out.shape != outs[0].shape) {
      return absl::InvalidArgumentError("out: outputs differ in shape");
    }
    ATTNAUDIT_RETURN_IF_ERROR(CheckOutShape(out).status());
  }
  ATTNAUDIT_RETURN_IF_ERROR(CheckLmHead(lm_head, hidden));
  const int64_t batch = outs[0].shape[0];
  const int64_t queries = outs[0].shape[1];
  const int64_t vocab = lm_head.dim(0);
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be finite and > 0, got ", temperature));
  }
  // Tokens are validated before any O(V) allocation.
  std::vector<int64_t> active;
  std::vector<int64_t> ids;
  ATTNAUDIT_RETURN_IF_ERROR(ActiveTokens(token_ids, batch, queries, vocab,
                                         active_mask, &active, &ids));
  // Hidden vectors of (output, active token) pairs in chunks, so the logits
  // scratch stays within kMaxLogits doubles (or one vector's V).
  constexpr int64_t kMaxLogits = int64_t{1} << 22;
  const int64_t num_active = static_cast<int64_t>(active.size());
  const int64_t pairs = num_active * static_cast<int64_t>(outs.size());
  const int64_t chunk =
      std::max<int64_t>(1, std::min(pairs, kMaxLogits / vocab));
  std::vector<std::vector<double>> results(
      outs.size(), std::vector<double>(static_cast<size_t>(batch * queries)));
  std::vector<double> hiddens;
  std::vector<double> logits;
  bool norms_done = false;
  for (int64_t first = 0; first < pairs || !norms_done; first += chunk) {
    const int64_t last = std::min(pairs, first + chunk);
    hiddens.resize(
        static_cast<size_t>(std::max<int64_t>(0, last - first) * hidden));
    for (int64_t p = first; p < last; ++p) {
      const double* h =
          outs[p / num_active].values + active[p % num_active] * hidden;
      std::copy(h, h + hidden, &hiddens[(p - first) * hidden]);
    }
    LmHeadNorms chunk_norms;
    ChunkLogits(lm_head, hiddens, std::max<int64_t>(0, last - first), threads,
                &logits, &chunk_norms);
    if (!norms_done) *norms = chunk_norms;
    norms_done = true;
    for (int64_t p = first; p < last; ++p) {
      results[p / num_active][active[p % num_active]] =
          SelectedLogSoftmax(&logits[(p - first) * vocab], vocab,
                             ids[p % num_active], temperature);
    }
  }
  return results;
}

absl::StatusOr<std::vector<double>> SelectedLogprobs(const DenseView& out,
                                                     const Tensor& lm_head,
                                                     const Tensor& token_ids,
                                                     const uint8_t* active_mask,
                                                     double temperature) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      std::vector<std::vector<double>> each,
      SelectedLogprobsForEach({out}, lm_head, token_ids, active_mask,
                              temperature, /*threads=*/1, nullptr));
  return std::move(each[0]);
}

LogprobAgreement CompareLogprobs(const DenseView& candidate,
                                 const DenseView& baseline,
                                 const uint8_t* active_mask) {
  LogprobAgreement agreement;
  const int64_t n = candidate.size();
  if (candidate.shape != baseline.shape || n == 0 ||
      candidate.values == nullptr || baseline.values == nullptr) {
    return agreement;
  }
  double sum_abs = 0;
  double sum_diff = 0;
  double sum_k3 = 0;
  double sum_ratio = 0;
  double min_ratio = std::numeric_limits<double>::infinity();
  double max_ratio = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (active_mask != nullptr && active_mask[i] == 0) continue;
    const double diff = candidate.values[i] - baseline.values[i];
    if (!std::isfinite(diff)) continue;  // visible in the DriftStats counts
    ++count;
    const double log_ratio = -diff;  // log r = lp_ref - lp_cand
    const double ratio = std::exp(log_ratio);
    sum_abs += std::fabs(diff);
    agreement.max_abs_diff = std::max(agreement.max_abs_diff, std::fabs(diff));
    sum_diff += diff;
    sum_k3 += K3Term(log_ratio);
    sum_ratio += ratio;
    min_ratio = std::min(min_ratio, ratio);
    max_ratio = std::max(max_ratio, ratio);
  }
  if (count == 0) return agreement;
  const double cnt = static_cast<double>(count);
  agreement.count = count;
  agreement.mean_abs_diff = sum_abs / cnt;
  agreement.k1_kl = sum_diff / cnt;
  agreement.k3_kl = sum_k3 / cnt;
  agreement.ratio_mean = sum_ratio / cnt;
  agreement.ratio_min = min_ratio;
  agreement.ratio_max = max_ratio;
  // Population standard deviation, second pass around the mean (the ratios
  // sit near 1, where the one-pass formula cancels).
  double sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (active_mask != nullptr && active_mask[i] == 0) continue;
    const double diff = candidate.values[i] - baseline.values[i];
    if (!std::isfinite(diff)) continue;
    const double dev = std::exp(-diff) - agreement.ratio_mean;
    sum_sq += dev * dev;
  }
  agreement.ratio_std = std::sqrt(sum_sq / cnt);
  return agreement;
}

}  // namespace attnaudit
