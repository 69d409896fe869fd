// attnaudit_bench_reference: what the Python benchmarks (bench/peers,
// bench/sweeps) need from attnaudit's own code for one snapshot file, so
// that they never re-derive it:
// - the work, as JSON on stdout, with the same definitions as
//   bench/check/check_bench.cc: active KV bytes (K and V of every cached
//   token of every row, at the cache's dtype), flops per pass
//   4·D·Hq·(seq_len x Sq summed over rows; an FMA counts 2), tokens, file
//   bytes;
// - with --dump PREFIX, attnaudit's fp64 reference R (out [B,Sq,Hq,D] and
//   lse [B,Sq,Hq], float64) and the post-RoPE queries it used
//   ([B,Sq,Hq,D], float64), as PREFIX.out.npy, PREFIX.lse.npy and
//   PREFIX.q.npy, so a peer's output can be checked against R.
//
// usage: attnaudit_bench_reference FILE [--dump PREFIX] [--threads N]
// Exit 0, 2 on a bad argument, an unreadable or invalid snapshot or a
// failed write.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/tensor/dtype.h"
#include "core/validate/validate.h"
#include "proto/codec/codec.h"

namespace attnaudit::bench {
namespace {

constexpr char kUsage[] =
    "usage: attnaudit_bench_reference FILE [--dump PREFIX] [--threads N]\n";

// Writes `values` as a little-endian float64 .npy array of `shape`.
absl::Status WriteNpy(const std::string& path,
                      const std::vector<int64_t>& shape,
                      const std::vector<double>& values) {
  std::string dims;
  for (int64_t d : shape) absl::StrAppend(&dims, d, ",");
  std::string header = absl::StrCat("{'descr': '<f8', 'fortran_order': False, ",
                                    "'shape': (", dims, "), }");
  // Magic (6) + version (2) + length (2) + header + '\n', padded to 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::UnavailableError(path + ": cannot create");
  const unsigned char preamble[10] = {
      0x93,
      'N',
      'U',
      'M',
      'P',
      'Y',
      1,
      0,
      static_cast<unsigned char>(header.size() & 0xff),
      static_cast<unsigned char>(header.size() >> 8)};
  bool ok = std::fwrite(preamble, 1, 10, f) == 10 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(values.data(), sizeof(double), values.size(), f) ==
                values.size();
  ok = (std::fclose(f) == 0) && ok;
  return ok ? absl::OkStatus()
            : absl::UnavailableError(path + ": write failed");
}

absl::Status Dump(const Snapshot& snap, const ResolvedLayout& layout,
                  int threads, const std::string& prefix) {
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(snap, layout, threads);
  if (!prepared.ok()) return prepared.status();
  AttentionRunOptions o;
  o.threads = threads;
  o.record_merge_orders = false;
  o.passes = AttentionPasses::kReferenceOnly;
  absl::StatusOr<AttentionResults> r = ComputeAttention(*prepared, o);
  if (!r.ok()) return r.status();
  const SnapshotDims& d = layout.dims;
  const std::vector<int64_t> out_shape = {d.batch, d.queries, d.q_heads,
                                          d.head_dim};
  absl::Status st = WriteNpy(prefix + ".out.npy", out_shape, r->reference_out);
  if (st.ok()) {
    st = WriteNpy(prefix + ".lse.npy", {d.batch, d.queries, d.q_heads},
                  r->reference_lse);
  }
  if (st.ok()) st = WriteNpy(prefix + ".q.npy", out_shape, prepared->q);
  return st;
}

int Main(int argc, char** argv) {
  std::string path;
  std::string prefix;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dump" && i + 1 < argc) {
      prefix = argv[++i];
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (path.empty() && !arg.empty() && arg[0] != '-') {
      path = arg;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  absl::StatusOr<Snapshot> snap = ReadSnapshotFile(path);
  absl::StatusOr<ResolvedLayout> layout =
      snap.ok() ? ValidateSnapshot(*snap) : snap.status();
  absl::Status st = layout.status();
  if (st.ok() && !prefix.empty()) st = Dump(*snap, *layout, threads, prefix);
  if (!st.ok()) {
    std::fprintf(stderr, "attnaudit_bench_reference: %s\n",
                 st.ToString().c_str());
    return 2;
  }
  const SnapshotDims& d = layout->dims;
  int64_t tokens = 0;
  for (int64_t len : layout->seq_lens) tokens += len;
  const double kv_bytes = static_cast<double>(tokens) * d.kv_heads *
                          d.head_dim * 2 * DTypeSize(snap->k_pages.dtype());
  const double flops =
      4.0 * d.head_dim * d.q_heads * static_cast<double>(tokens) * d.queries;
  FILE* f = std::fopen(path.c_str(), "rb");
  long file_bytes = -1;
  if (f != nullptr && std::fseek(f, 0, SEEK_END) == 0)
    file_bytes = std::ftell(f);
  if (f != nullptr) std::fclose(f);
  std::printf(
      "{\"file\":\"%s\",\"file_bytes\":%ld,\"batch\":%lld,\"queries\":%lld,"
      "\"q_heads\":%lld,\"kv_heads\":%lld,\"head_dim\":%lld,"
      "\"page_size\":%lld,\"tokens\":%lld,\"kv_bytes\":%.0f,"
      "\"flops_per_pass\":%.0f,\"kv_dtype\":\"%s\"}\n",
      path.c_str(), file_bytes, (long long)d.batch, (long long)d.queries,
      (long long)d.q_heads, (long long)d.kv_heads, (long long)d.head_dim,
      (long long)d.page_size, (long long)tokens, kv_bytes, flops,
      std::string(DTypeName(snap->k_pages.dtype())).c_str());
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
