// Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/):
// small synthetic snapshots that pass FuzzLimits and reach the audit, in
// the layout each target reads. Run once by hand when the wire contract
// changes:
//   build/tests/fuzz/attnaudit_fuzz_seeds tests/fuzz/corpus
// (the files are committed; tests never regenerate them).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnaudit/v1/service.pb.h"
#include "proto/codec/codec.h"
#include "proto/codec/stream.h"
#include "sim/simulator.h"

namespace attnaudit {
namespace {

struct Seed {
  const char* preset;
  int64_t batch, context, queries, prefix;
  Fault fault;
  DType kv;
  bool permute;
};

constexpr Seed kSeeds[] = {
    {"llama3-8b", 1, 16, 1, 0, Fault::kNone, DType::kBF16, false},
    {"llama3-8b", 2, 24, 1, 0, Fault::kStalePage, DType::kBF16, true},
    {"qwen3-8b", 1, 20, 2, 0, Fault::kNone, DType::kF16, false},
    {"gemma2-9b", 1, 24, 1, 0, Fault::kLseBase2, DType::kBF16, false},
    {"gpt-oss-20b", 1, 33, 1, 16, Fault::kNone, DType::kBF16, true},
    {"glm4-9b", 1, 20, 1, 0, Fault::kFp8Scale, DType::kF8E4M3, false},
    {"phi4-mini", 1, 17, 1, 0, Fault::kRopeOffset, DType::kF16, false},
};

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// stream_fuzz's layout: u16 header length, header, u8 chunk code, bytes.
std::string StreamInput(const Snapshot& s) {
  v1::AuditStreamHeader header;
  std::vector<const Tensor*> streamed = BuildAuditStreamHeader(s, 256, &header);
  const std::string h = header.SerializeAsString();
  if (h.size() > 0xffff) return "";
  std::string out;
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  out += h;
  out.push_back(static_cast<char>(40));  // chunks of 41 * 61 bytes
  for (const Tensor* t : streamed)
    out.append(t->bytes().data(), t->bytes().size());
  return out;
}

int Main(const std::string& root) {
  int n = 0;
  for (const Seed& seed : kSeeds) {
    SynthOptions o;
    o.preset = seed.preset;
    o.batch = seed.batch;
    o.context = seed.context;
    o.queries = seed.queries;
    o.prefix = seed.prefix;
    o.fault = seed.fault;
    o.kv_dtype = seed.kv;
    o.permute_pages = seed.permute;
    o.vocab = 4;
    o.threads = 1;
    o.seed = static_cast<uint64_t>(n + 1);
    absl::StatusOr<Snapshot> s = Synthesize(o);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", seed.preset,
                   std::string(s.status().message()).c_str());
      return 1;
    }
    v1::Snapshot msg;
    SnapshotToProto(*s, &msg);
    const std::string bytes = msg.SerializeAsString();
    const std::string name = absl::StrCat("seed-", n, "-", seed.preset);
    Write(absl::StrCat(root, "/snapshot_fuzz/", name), bytes);
    Write(absl::StrCat(root, "/file_reader_fuzz/", name), bytes);
    const std::string stream = StreamInput(*s);
    if (!stream.empty()) {
      Write(absl::StrCat(root, "/stream_fuzz/", name), stream);
    }
    ++n;
  }
  std::printf("wrote %d seeds per target under %s\n", n, root.c_str());
  return 0;
}

}  // namespace
}  // namespace attnaudit

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  return attnaudit::Main(argv[1]);
}
