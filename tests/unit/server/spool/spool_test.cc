// Spool: round trips, crash leftovers (.tmp, truncated and bit-flipped
// .job files), id validation, quotas, CRC-32C against published vectors
// and a bitwise reference, and the format: entries an older server wrote
// (format 1) still read, new ones are format 2 (protobuf metadata).
#include "server/spool/spool.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/spool/spool_format.h"
#include "server/spool/spool_record.pb.h"

namespace attnaudit::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/spool_test_XXXXXX";
    path_ = mkdtemp(&tmpl[0]);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  return out;
}

std::vector<std::string> Ids(const std::vector<SpoolListing>& listing) {
  std::vector<std::string> out;
  for (const auto& l : listing) out.push_back(l.job_id);
  return out;
}

std::unique_ptr<Spool> OpenSpool(const std::string& dir,
                                 SpoolOptions options = {}) {
  options.sync = false;  // the protocol is unchanged; tests need no fsync
  auto s = Spool::Open(dir, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

SpoolMetadata Meta(int64_t created_us) {
  SpoolMetadata m;
  m.created = absl::FromUnixMicros(created_us);
  return m;
}

// Bitwise CRC-32C, the definition itself.
uint32_t NaiveCrc32c(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32cTest, MatchesPublishedVectors) {
  // The check value of CRC-32C and the RFC 3720 (iSCSI) B.4 vectors.
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  const std::string ones(32, '\xFF');
  EXPECT_EQ(Crc32c(0, ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(0, "", 0), 0u);
}

TEST(Crc32cTest, MatchesBitwiseReferenceAndExtends) {
  std::mt19937 rng(7);
  for (size_t n : {1u, 7u, 8u, 9u, 63u, 1000u, 4099u}) {
    std::string s(n, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng());
    EXPECT_EQ(Crc32c(0, s.data(), s.size()), NaiveCrc32c(s)) << n;
    const size_t cut = n / 3;
    const uint32_t first = Crc32c(0, s.data(), cut);
    EXPECT_EQ(Crc32c(first, s.data() + cut, n - cut), NaiveCrc32c(s)) << n;
  }
}

TEST(SpoolTest, PutThenReadRoundTripsEverything) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  SpoolMetadata m;
  m.priority = 0;
  m.created = absl::FromUnixMicros(1700000000123456);
  m.deadline = absl::InfiniteFuture();
  m.model = "llama";
  m.layer = 17;
  m.engine = "vllm";
  m.attributes = std::string("\0opaque\xff", 8);
  std::string payload(100000, '\0');
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<char>(i * 31);
  ASSERT_TRUE(spool->Put("job-1", m, payload).ok());
  EXPECT_THAT(Files(tmp.path() + "/spool"), UnorderedElementsAre("job-1.job"));
  EXPECT_TRUE(spool->Contains("job-1"));

  auto e = spool->Read("job-1");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->job_id, "job-1");
  EXPECT_EQ(e->payload, payload);
  EXPECT_EQ(e->metadata.priority, 0);
  EXPECT_EQ(e->metadata.created, m.created);
  EXPECT_EQ(e->metadata.deadline, absl::InfiniteFuture());
  EXPECT_EQ(e->metadata.model, "llama");
  EXPECT_EQ(e->metadata.layer, 17);
  EXPECT_EQ(e->metadata.engine, "vllm");
  EXPECT_EQ(e->metadata.attributes, m.attributes);
  EXPECT_EQ(e->metadata.tenant, "default");

  m.deadline = absl::FromUnixMicros(1700000009000000);
  m.tenant = "fleet-a";
  ASSERT_TRUE(spool->Put("job-2", m, "").ok());
  auto e2 = spool->Read("job-2");
  ASSERT_TRUE(e2.ok()) << e2.status();
  EXPECT_EQ(e2->metadata.deadline, m.deadline);
  EXPECT_EQ(e2->metadata.tenant, "fleet-a");
  EXPECT_EQ(e2->payload, "");
}

// ReadMetadata reads the header only: the metadata of a whole entry, NotFound
// for an absent one, and DataLoss for a torn one, which it leaves in place
// (quarantine is Read's and List's decision).
TEST(SpoolTest, ReadMetadataReadsTheHeaderOnly) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  SpoolMetadata m = Meta(5);
  m.tenant = "fleet-b";
  m.model = "qwen";
  ASSERT_TRUE(spool->Put("job-m", m, std::string(4096, 'p')).ok());
  absl::StatusOr<SpoolMetadata> read = spool->ReadMetadata("job-m");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->tenant, "fleet-b");
  EXPECT_EQ(read->model, "qwen");
  EXPECT_EQ(read->created, m.created);
  EXPECT_EQ(spool->ReadMetadata("absent").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(spool->ReadMetadata("../x").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string path = tmp.path() + "/spool/job-m.job";
  fs::resize_file(path, fs::file_size(path) - 1);
  EXPECT_EQ(spool->ReadMetadata("job-m").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_THAT(Files(tmp.path() + "/spool"), UnorderedElementsAre("job-m.job"));
}

TEST(SpoolTest, RejectsDuplicatesAndBadIds) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  ASSERT_TRUE(spool->Put("a", Meta(1), "x").ok());
  EXPECT_EQ(spool->Put("a", Meta(1), "y").code(),
            absl::StatusCode::kAlreadyExists);
  for (const std::string& bad :
       {std::string(""), std::string("../a"), std::string(".hidden"),
        std::string("a/b"), std::string("sp ace"), std::string(129, 'a')}) {
    absl::Status s = spool->Put(bad, Meta(1), "x");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("job_id: "))
        << bad;
  }
  EXPECT_TRUE(ValidateJobId(std::string(128, 'a')).ok());
  EXPECT_TRUE(ValidateJobId("A-z_0.9").ok());
  EXPECT_EQ(spool->Read("missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SpoolTest, RemoveIsIdempotentAndAccountsBytes) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  ASSERT_TRUE(spool->Put("a", Meta(1), std::string(1000, 'a')).ok());
  ASSERT_TRUE(spool->Put("b", Meta(2), std::string(10, 'b')).ok());
  const int64_t both = spool->total_bytes();
  EXPECT_EQ(both,
            static_cast<int64_t>(fs::file_size(tmp.path() + "/spool/a.job") +
                                 fs::file_size(tmp.path() + "/spool/b.job")));
  ASSERT_TRUE(spool->Remove("a").ok());
  EXPECT_TRUE(spool->Remove("a").ok());
  EXPECT_FALSE(spool->Contains("a"));
  EXPECT_EQ(spool->total_bytes(),
            static_cast<int64_t>(fs::file_size(tmp.path() + "/spool/b.job")));
  // A reopened spool sizes what is on disk.
  spool.reset();
  spool = OpenSpool(tmp.path());
  EXPECT_TRUE(spool->Contains("b"));
  EXPECT_EQ(spool->total_bytes(),
            static_cast<int64_t>(fs::file_size(tmp.path() + "/spool/b.job")));
}

TEST(SpoolTest, QuotaAndPayloadLimits) {
  TempDir tmp;
  SpoolOptions options;
  options.max_total_bytes = 2000;
  options.max_payload_bytes = 1500;
  auto spool = OpenSpool(tmp.path(), options);
  EXPECT_EQ(spool->Put("big", Meta(1), std::string(1501, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(spool->Put("a", Meta(1), std::string(1200, 'x')).ok());
  absl::Status s = spool->Put("b", Meta(1), std::string(1000, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(spool->Contains("b"));
  EXPECT_THAT(Files(tmp.path() + "/spool"), UnorderedElementsAre("a.job"));
  ASSERT_TRUE(spool->Remove("a").ok());
  EXPECT_TRUE(spool->Put("b", Meta(1), std::string(1000, 'x')).ok());
}

TEST(SpoolTest, ListIsOldestFirst) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  ASSERT_TRUE(spool->Put("c", Meta(300), "3").ok());
  ASSERT_TRUE(spool->Put("a", Meta(200), "22").ok());
  ASSERT_TRUE(spool->Put("b", Meta(200), "1").ok());
  auto list = spool->List();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(Ids(*list), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ((*list)[0].payload_bytes, 2);
}

TEST(SpoolCrashTest, LeftoverTmpFromACrashedPutIsDeletedOnOpen) {
  TempDir tmp;
  {
    auto spool = OpenSpool(tmp.path());
    ASSERT_TRUE(spool->Put("done", Meta(1), "complete").ok());
  }
  // A Put that died after writing part of its temporary file.
  const std::string full = tmp.path() + "/spool/done.job";
  std::string bytes(fs::file_size(full), '\0');
  std::ifstream(full, std::ios::binary).read(&bytes[0], bytes.size());
  std::ofstream(tmp.path() + "/spool/crashed.tmp", std::ios::binary)
      .write(bytes.data(), bytes.size() / 2);
  // Even a complete-looking .tmp was never acknowledged (no rename).
  std::ofstream(tmp.path() + "/spool/whole.tmp", std::ios::binary)
      .write(bytes.data(), bytes.size());

  auto spool = OpenSpool(tmp.path());
  EXPECT_THAT(Files(tmp.path() + "/spool"), UnorderedElementsAre("done.job"));
  auto list = spool->List(/*verify_crc=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(Ids(*list), (std::vector<std::string>{"done"}));
  EXPECT_EQ(spool->Read("done")->payload, "complete");
}

TEST(SpoolCrashTest, TruncatedJobIsSkippedAndQuarantined) {
  TempDir tmp;
  {
    auto spool = OpenSpool(tmp.path());
    ASSERT_TRUE(spool->Put("torn", Meta(1), std::string(500, 't')).ok());
    ASSERT_TRUE(spool->Put("good", Meta(2), "g").ok());
  }
  const std::string torn = tmp.path() + "/spool/torn.job";
  fs::resize_file(torn, fs::file_size(torn) - 7);
  // A file shorter than the header, and one that is not ours at all.
  std::ofstream(tmp.path() + "/spool/tiny.job", std::ios::binary) << "AAS";
  std::ofstream(tmp.path() + "/spool/alien.job", std::ios::binary)
      << std::string(64, 'z');

  auto spool = OpenSpool(tmp.path());
  auto list = spool->List();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(Ids(*list), (std::vector<std::string>{"good"}));
  EXPECT_THAT(Files(tmp.path() + "/spool"),
              UnorderedElementsAre("good.job", "torn.corrupt", "tiny.corrupt",
                                   "alien.corrupt"));
  EXPECT_FALSE(spool->Contains("torn"));
  EXPECT_EQ(spool->Read("torn").status().code(), absl::StatusCode::kNotFound);
}

TEST(SpoolCrashTest, FlippedPayloadBitIsCaughtByTheChecksum) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  ASSERT_TRUE(spool->Put("flip", Meta(1), std::string(4096, 'p')).ok());
  ASSERT_TRUE(spool->Put("flip2", Meta(2), std::string(4096, 'p')).ok());
  for (const char* id : {"flip", "flip2"}) {
    std::fstream f(tmp.path() + "/spool/" + id + ".job",
                   std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(2000);
    f.put('q');
  }
  // Sizes still match, so the cheap listing keeps them ...
  auto list = spool->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
  // ... the CRC does not.
  absl::StatusOr<SpoolEntry> e = spool->Read("flip");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(e.status().message(), HasSubstr("CRC-32C mismatch"));
  auto verified = spool->List(/*verify_crc=*/true);
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->empty());
  EXPECT_THAT(Files(tmp.path() + "/spool"),
              UnorderedElementsAre("flip.corrupt", "flip2.corrupt"));
  EXPECT_EQ(spool->total_bytes(), 0);
}

TEST(SpoolTest, ConcurrentPutsOfDifferentIds) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&spool, t] {
      for (int i = 0; i < 25; ++i) {
        const std::string id =
            "t" + std::to_string(t) + "-" + std::to_string(i);
        EXPECT_TRUE(spool->Put(id, Meta(i), id).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  auto list = spool->List(/*verify_crc=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 100u);
  for (const auto& l : *list) {
    EXPECT_EQ(spool->Read(l.job_id)->payload, l.job_id);
  }
}

TEST(SpoolTest, SyncedPutAndRemove) {
  TempDir tmp;
  auto spool = Spool::Open(tmp.path());  // default options: fsync on
  ASSERT_TRUE(spool.ok()) << spool.status();
  ASSERT_TRUE((*spool)->Put("s", Meta(1), "synced").ok());
  EXPECT_EQ((*spool)->Read("s")->payload, "synced");
  ASSERT_TRUE((*spool)->Remove("s").ok());
  EXPECT_TRUE(Files(tmp.path() + "/spool").empty());
}

TEST(SpoolTest, OpenFailsCleanlyOnAnUnusableDirectory) {
  TempDir tmp;
  const std::string file = tmp.path() + "/not_a_dir";
  std::ofstream(file) << "x";
  auto s = Spool::Open(file);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("not_a_dir"));
}

// The format-1 writer as it was (before the metadata became a protobuf
// message), kept here to make the files older servers left in a spool:
// little-endian fields, the tenant last and absent before tenants existed.
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutString(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
uint64_t V1Micros(absl::Time t) {
  if (t == absl::InfiniteFuture()) {
    return static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  return static_cast<uint64_t>(absl::ToUnixMicros(t));
}
std::string Version1File(const SpoolMetadata& m, const std::string& payload,
                         bool with_tenant) {
  std::string meta;
  PutU32(&meta, static_cast<uint32_t>(m.priority));
  PutU64(&meta, V1Micros(m.created));
  PutU64(&meta, V1Micros(m.deadline));
  PutU64(&meta, static_cast<uint64_t>(m.layer));
  PutString(&meta, m.model);
  PutString(&meta, m.engine);
  PutString(&meta, m.attributes);
  if (with_tenant) PutString(&meta, m.tenant);
  std::string file("AASPOOL1", 8);
  PutU32(&file, 1);
  PutU32(&file, static_cast<uint32_t>(meta.size()));
  PutU64(&file, payload.size());
  file += meta;
  file += payload;
  PutU32(&file, NaiveCrc32c(file));
  return file;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(SpoolFormatTest, EntriesOfTheOldFormatAreListedAndReadBack) {
  TempDir tmp;
  OpenSpool(tmp.path());  // creates <dir>/spool
  SpoolMetadata m;
  m.priority = 0;
  m.created = absl::FromUnixMicros(1700000000123456);
  m.deadline = absl::FromUnixMicros(1700000009000000);
  m.model = "llama";
  m.layer = 17;
  m.engine = "vllm";
  m.attributes = std::string("\0opaque\xff", 8);
  m.tenant = "fleet-a";
  std::string payload(70000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<char>(i * 29);
  }
  WriteFile(tmp.path() + "/spool/old.job", Version1File(m, payload, true));
  SpoolMetadata before_tenants = m;
  before_tenants.created = absl::FromUnixMicros(1700000000000000);
  before_tenants.deadline = absl::InfiniteFuture();
  WriteFile(tmp.path() + "/spool/older.job",
            Version1File(before_tenants, "x", false));

  // A server started on that spool resumes both, then spools new entries
  // in the new format next to them.
  auto spool = OpenSpool(tmp.path());
  ASSERT_TRUE(spool->Put("new", Meta(1800000000000000), "n").ok());
  auto list = spool->List(/*verify_crc=*/true);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(Ids(*list), (std::vector<std::string>{"older", "old", "new"}));
  EXPECT_EQ((*list)[1].payload_bytes, static_cast<int64_t>(payload.size()));

  auto old = spool->Read("old");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->payload, payload);
  EXPECT_EQ(old->metadata.priority, 0);
  EXPECT_EQ(old->metadata.created, m.created);
  EXPECT_EQ(old->metadata.deadline, m.deadline);
  EXPECT_EQ(old->metadata.model, "llama");
  EXPECT_EQ(old->metadata.layer, 17);
  EXPECT_EQ(old->metadata.engine, "vllm");
  EXPECT_EQ(old->metadata.attributes, m.attributes);
  EXPECT_EQ(old->metadata.tenant, "fleet-a");
  auto older = spool->Read("older");
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->metadata.tenant, "default");
  EXPECT_EQ(older->metadata.deadline, absl::InfiniteFuture());
  EXPECT_EQ(older->payload, "x");
}

TEST(SpoolFormatTest, NewEntriesAreVersion2WithAProtobufMetadataMessage) {
  TempDir tmp;
  auto spool = OpenSpool(tmp.path());
  SpoolMetadata m = Meta(1700000000000001);
  m.model = "qwen";
  m.layer = 3;
  m.tenant = "fleet-b";
  ASSERT_TRUE(spool->Put("j", m, "payload").ok());
  std::ifstream in(tmp.path() + "/spool/j.job", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  ASSERT_GT(file.size(), spool_internal::kHeaderBytes);
  EXPECT_EQ(file.substr(0, 8), "AASPOOL1");
  EXPECT_EQ(file[8], 2);  // the version, little-endian
  const uint32_t meta_bytes = static_cast<unsigned char>(file[12]) |
                              static_cast<unsigned char>(file[13]) << 8;
  // Parsed by the generated class itself, not by the spool's reader.
  spool::SpoolRecordMetadata record;
  ASSERT_TRUE(record.ParseFromString(
      file.substr(spool_internal::kHeaderBytes, meta_bytes)));
  EXPECT_EQ(record.model(), "qwen");
  EXPECT_EQ(record.layer(), 3);
  EXPECT_EQ(record.tenant(), "fleet-b");
  EXPECT_EQ(record.created_unix_micros(), 1700000000000001);
  EXPECT_EQ(record.deadline_unix_micros(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(file.substr(spool_internal::kHeaderBytes + meta_bytes, 7),
            "payload");
  EXPECT_EQ(file.size(), spool_internal::kHeaderBytes + meta_bytes + 7 +
                             spool_internal::kTrailerBytes);
  // The trailer covers everything before it.
  const std::string body = file.substr(0, file.size() - 4);
  std::string crc;
  PutU32(&crc, NaiveCrc32c(body));
  EXPECT_EQ(file.substr(file.size() - 4), crc);
}

TEST(SpoolFormatTest, DamagedOldEntriesAndUnknownVersionsAreQuarantined) {
  TempDir tmp;
  OpenSpool(tmp.path());
  const std::string old = Version1File(Meta(1), std::string(3000, 'o'), true);
  // A flipped payload byte (sizes still match), a torn tail, a version
  // this server does not know (CRC recomputed: only the version is wrong),
  // and an old header whose metadata runs past its declared length.
  std::string flipped = old;
  flipped[2000] ^= 1;
  WriteFile(tmp.path() + "/spool/flipped.job", flipped);
  WriteFile(tmp.path() + "/spool/torn.job", old.substr(0, old.size() - 9));
  std::string future = old.substr(0, old.size() - 4);
  future[8] = 3;
  PutU32(&future, NaiveCrc32c(future));
  WriteFile(tmp.path() + "/spool/future.job", future);
  std::string cut = Version1File(Meta(2), "", true);
  cut[12] = 10;  // metadata length 10: a cut field
  cut = cut.substr(0, cut.size() - 4);
  cut.resize(spool_internal::kHeaderBytes + 10);
  PutU32(&cut, NaiveCrc32c(cut));
  WriteFile(tmp.path() + "/spool/cut.job", cut);
  WriteFile(tmp.path() + "/spool/good.job", old);

  auto spool = OpenSpool(tmp.path());
  auto list = spool->List(/*verify_crc=*/true);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(Ids(*list), (std::vector<std::string>{"good"}));
  EXPECT_THAT(
      Files(tmp.path() + "/spool"),
      UnorderedElementsAre("good.job", "flipped.corrupt", "torn.corrupt",
                           "future.corrupt", "cut.corrupt"));
  SpoolMetadata bad;
  EXPECT_EQ(spool_internal::DecodeMetadata(spool_internal::kVersionProto,
                                           "\xff\xff\xff", &bad)
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace attnaudit::server
