// The drift reduction (drift_kernels.h). The element rule is
// kernels/math/drift_element.h; here: per-thread partials, a fixed-shape
// tree per block, one block combining the blocks in index order, and the
// radix select of the p99.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/common/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/drift_kernels.h"
#include "kernels/math/drift_element.h"

namespace attnaudit {
namespace cuda_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
constexpr unsigned long long kNotCounted = ~0ull;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ void Combine(DriftTotals* a, const DriftTotals& b) {
  a->sum_abs += b.sum_abs;
  a->sum_sq += b.sum_sq;
  a->sum_ulp += b.sum_ulp;
  if (b.worst >= 0 && (a->worst < 0 || b.max_abs > a->max_abs ||
                       (b.max_abs == a->max_abs && b.worst < a->worst))) {
    a->max_abs = b.max_abs;
    a->worst = b.worst;
  }
  a->max_rel = a->max_rel < b.max_rel ? b.max_rel : a->max_rel;
  a->max_ulp = a->max_ulp < b.max_ulp ? b.max_ulp : a->max_ulp;
  a->count += b.count;
  a->over += b.over;
  a->candidate_nan += b.candidate_nan;
  a->candidate_inf += b.candidate_inf;
  a->baseline_nan += b.baseline_nan;
  a->baseline_inf += b.baseline_inf;
  a->mismatch += b.mismatch;
  if (b.first_mismatch >= 0 &&
      (a->first_mismatch < 0 || b.first_mismatch < a->first_mismatch)) {
    a->first_mismatch = b.first_mismatch;
  }
}

// One element into a thread's partial; writes its p99 key.
__device__ void AddElement(const DriftArgs& args, int64_t i, double tiny,
                           DriftTotals* t, unsigned long long* keys) {
  keys[i] = kNotCounted;
  if (args.mask != nullptr && args.mask[i / args.inner] == 0) return;
  const double c = args.candidate[i];
  const double r = args.baseline[i];
  double ad = 0;
  const bool finite = !kmath::IsNan(c) && !kmath::IsInf(c) &&
                      !kmath::IsNan(r) && !kmath::IsInf(r);
  if (!finite) {
    t->candidate_nan += kmath::IsNan(c);
    t->candidate_inf += kmath::IsInf(c);
    t->baseline_nan += kmath::IsNan(r);
    t->baseline_inf += kmath::IsInf(r);
  }
  const int kind = kmath::ClassifyPair(c, r, &ad);
  if (kind == kmath::kPairMismatch) {
    ++t->mismatch;
    if (t->first_mismatch < 0) t->first_mismatch = i;
    return;
  }
  if (kind != kmath::kPairValue) return;
  keys[i] = kmath::DoubleBits(ad);
  ++t->count;
  t->sum_abs += ad;
  t->sum_sq += ad * ad;
  if (t->worst < 0 || ad > t->max_abs) {
    t->max_abs = ad;
    t->worst = i;
  }
  t->over += ad > args.tolerance;
  if (ad > 0) {
    const double rel = ad / (kmath::Abs(r) > tiny ? kmath::Abs(r) : tiny);
    t->max_rel = t->max_rel < rel ? rel : t->max_rel;
    const double u = kmath::UlpIn(c, r, args.ulp_dtype);
    t->max_ulp = t->max_ulp < u ? u : t->max_ulp;
    t->sum_ulp += u;
  }
}

// Contiguous slices per thread, so each thread's first mismatch and worst
// index are its slice's first, and the tree combines slices in order.
__global__ void __launch_bounds__(kThreads)
    DriftBlocksKernel(const DriftArgs args, DriftTotals* partials,
                      unsigned long long* keys) {
  // Raw storage: a __shared__ array may not have a constructor.
  __shared__ __align__(
      16) unsigned char tree_bytes[kThreads * sizeof(DriftTotals)];
  DriftTotals* tree = reinterpret_cast<DriftTotals*>(tree_bytes);
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t slice = (args.n + threads - 1) / threads;
  const int64_t id =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const double tiny = kmath::SmallestNormal(args.ulp_dtype);
  DriftTotals t;
  const int64_t end = (id + 1) * slice < args.n ? (id + 1) * slice : args.n;
  for (int64_t i = id * slice; i < end; ++i)
    AddElement(args, i, tiny, &t, keys);
  tree[threadIdx.x] = t;
  __syncthreads();
  for (int half = kThreads / 2; half >= 1; half /= 2) {
    if (threadIdx.x < half)
      Combine(&tree[threadIdx.x], tree[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = tree[0];
}

__global__ void DriftCombineKernel(const DriftTotals* partials, int blocks,
                                   DriftTotals* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  DriftTotals t;
  for (int b = 0; b < blocks; ++b) Combine(&t, partials[b]);
  *out = t;
}

// Radix select state: the k-th smallest key (1-based) is being narrowed
// down a byte at a time, most significant first.
struct SelectState {
  unsigned long long prefix;
  unsigned long long k;
  unsigned int hist[256];
};

__global__ void SelectInitKernel(const DriftTotals* totals, SelectState* s) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  s->prefix = 0;
  // Nearest rank: the ceil(0.99 * count)-th smallest |diff|.
  s->k = static_cast<unsigned long long>((99 * totals->count + 99) / 100);
}

__global__ void __launch_bounds__(kThreads)
    HistogramKernel(const unsigned long long* keys, int64_t n, int pass,
                    SelectState* s) {
  __shared__ unsigned int hist[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const int shift = 56 - 8 * pass;
  const unsigned long long high_mask = pass == 0 ? 0ull : ~0ull << (shift + 8);
  const unsigned long long prefix = s->prefix;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const unsigned long long key = keys[i];
    if ((key & high_mask) == (prefix & high_mask)) {
      atomicAdd(&hist[(key >> shift) & 0xff], 1u);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    if (hist[i] != 0) atomicAdd(&s->hist[i], hist[i]);
  }
}

__global__ void SelectDigitKernel(int pass, SelectState* s) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int shift = 56 - 8 * pass;
  unsigned long long below = 0;
  int digit = 255;
  for (int d = 0; d < 256; ++d) {
    if (below + s->hist[d] >= s->k) {
      digit = d;
      break;
    }
    below += s->hist[d];
  }
  s->k -= below;
  s->prefix |= static_cast<unsigned long long>(digit) << shift;
  for (int d = 0; d < 256; ++d) s->hist[d] = 0;
}

__global__ void SelectStoreKernel(const SelectState* s, DriftTotals* totals) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  totals->p99_abs = totals->count > 0 ? kmath::BitsAsDouble(s->prefix) : 0.0;
}

int64_t Align(int64_t x) { return (x + 255) / 256 * 256; }

}  // namespace

int64_t DriftScratchBytes(int64_t n) {
  return Align(static_cast<int64_t>(sizeof(unsigned long long)) * n) +
         Align(static_cast<int64_t>(sizeof(DriftTotals)) * kMaxBlocks) +
         Align(sizeof(SelectState));
}

absl::Status LaunchDrift(const DriftArgs& args, void* scratch,
                         DriftTotals* totals_device, cudaStream_t stream) {
  char* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<unsigned long long*>(base);
  auto* partials = reinterpret_cast<DriftTotals*>(
      base + Align(static_cast<int64_t>(sizeof(unsigned long long)) * args.n));
  auto* state = reinterpret_cast<SelectState*>(
      reinterpret_cast<char*>(partials) +
      Align(static_cast<int64_t>(sizeof(DriftTotals)) * kMaxBlocks));
  const int blocks = Blocks(args.n);
  DriftBlocksKernel<<<blocks, kThreads, 0, stream>>>(args, partials, keys);
  ATTNAUDIT_RETURN_IF_ERROR(LaunchStatus("DriftBlocksKernel"));
  DriftCombineKernel<<<1, 1, 0, stream>>>(partials, blocks, totals_device);
  ATTNAUDIT_RETURN_IF_ERROR(LaunchStatus("DriftCombineKernel"));
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(state, 0, sizeof(SelectState), stream));
  SelectInitKernel<<<1, 1, 0, stream>>>(totals_device, state);
  for (int pass = 0; pass < 8; ++pass) {
    HistogramKernel<<<blocks, kThreads, 0, stream>>>(keys, args.n, pass, state);
    SelectDigitKernel<<<1, 1, 0, stream>>>(pass, state);
  }
  SelectStoreKernel<<<1, 1, 0, stream>>>(state, totals_device);
  return LaunchStatus("drift select kernels");
}

}  // namespace cuda_internal
}  // namespace attnaudit
