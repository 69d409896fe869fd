// Snapshot files (atomic write, read, truncation and corruption errors) and
// report JSON.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "attnaudit/v1/snapshot.pb.h"
#include "core/tensor/dtype.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "proto/codec/tensor_paths.h"
#include "tests/unit/proto/codec_test_util.h"

namespace attnaudit {
namespace {

using testing::ExpectReportEq;
using testing::ExpectSnapshotEq;
using testing::ExpectTensorEq;
using testing::FullReport;
using testing::FullSnapshot;

class SnapshotFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/attnaudit_codec_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const std::string& name : ListDir()) {
      std::remove((dir_ + "/" + name).c_str());
    }
    ::rmdir(dir_.c_str());
  }
  std::vector<std::string> ListDir() const {
    std::vector<std::string> names;
    DIR* d = ::opendir(dir_.c_str());
    if (d == nullptr) return names;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void WriteAll(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  std::string dir_;
};

TEST_F(SnapshotFileTest, RoundTripLeavesOnlyTheFile) {
  const std::string path = dir_ + "/w1.pb";
  const Snapshot original = FullSnapshot(3);
  ASSERT_TRUE(WriteSnapshotFile(path, original).ok());
  EXPECT_EQ(ListDir(), std::vector<std::string>{"w1.pb"});  // no temp left

  // Any protobuf parser reads the file as the snapshot's message; the only
  // extra is the writer's alignment filler (Tensor.padding).
  v1::Snapshot expected_msg;
  SnapshotToProto(original, &expected_msg);
  v1::Snapshot file_msg;
  ASSERT_TRUE(file_msg.ParseFromString(ReadAll(path)));
  google::protobuf::util::MessageDifferencer diff;
  diff.IgnoreField(v1::Tensor::descriptor()->FindFieldByName("padding"));
  EXPECT_TRUE(diff.Compare(expected_msg, file_msg));

  absl::StatusOr<Snapshot> read = ReadSnapshotFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSnapshotEq(original, *read);
}

// The reader maps the file and never copies tensor bytes: every present
// tensor is a view; writing to one copies it first and leaves the file and
// the other readers' views alone; views outlive the snapshot they came in.
// A file from another writer (plain protobuf serialization) puts payloads
// wherever the encoding lands them; the reader copies the misaligned ones
// and the snapshot is the same.
TEST_F(SnapshotFileTest, PlainProtobufFilesReadTheSameWithAlignedTensors) {
  for (int shift = 0; shift < 4; ++shift) {
    Snapshot original = FullSnapshot(3);
    original.labels.model = std::string(5 + shift, 'm');
    v1::Snapshot msg;
    SnapshotToProto(original, &msg);
    const std::string path = dir_ + "/plain.pb";
    WriteAll(path, msg.SerializeAsString());
    absl::StatusOr<Snapshot> read = ReadSnapshotFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectSnapshotEq(original, *read);
    for (absl::string_view p : SnapshotTensorPaths()) {
      const Tensor* t = FindSnapshotTensor(*read, p);
      if (!t->present() || t->bytes().empty()) continue;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->bytes().data()) %
                    DTypeSize(t->dtype()),
                0u)
          << p << " shift " << shift;
    }
  }
}

TEST_F(SnapshotFileTest, TensorsAreAlignedViewsOfTheMappedFile) {
  const std::string path = dir_ + "/v.pb";
  const Snapshot original = FullSnapshot(6);
  ASSERT_TRUE(WriteSnapshotFile(path, original).ok());
  absl::StatusOr<Snapshot> read = ReadSnapshotFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  // Every tensor is naturally aligned (a payload at a misaligned offset in
  // the file is copied: the core reads through typed pointers; found by
  // file_reader_fuzz under UBSan), and the aligned ones are views.
  std::string viewed;
  int views = 0;
  for (absl::string_view p : SnapshotTensorPaths()) {
    const Tensor* t = FindSnapshotTensor(*read, p);
    if (!t->present() || t->bytes().empty()) continue;
    EXPECT_EQ(
        reinterpret_cast<uintptr_t>(t->bytes().data()) % DTypeSize(t->dtype()),
        0u)
        << p;
    // WriteSnapshotFile aligns every payload (aligned_writer.h): nothing
    // it wrote is copied on the way back.
    EXPECT_TRUE(t->is_view()) << p;
    if (t->is_view()) {
      ++views;
      viewed = std::string(p);
    }
  }
  ASSERT_GT(views, 0);
  Tensor* view = MutableSnapshotTensor(&*read, viewed);
  Tensor kept = *view;  // shares the mapping
  const Tensor before = *FindSnapshotTensor(original, viewed);
  Snapshot mutated = *read;
  read = absl::InternalError("dropped");  // the first snapshot is gone
  Tensor* m = MutableSnapshotTensor(&mutated, viewed);
  ASSERT_TRUE(m->is_view());
  m->mutable_data<char>()[0] ^= 0x55;
  EXPECT_FALSE(m->is_view());
  ExpectTensorEq(before, kept, "a view after a copy's write");
  absl::StatusOr<Snapshot> again = ReadSnapshotFile(path);
  ASSERT_TRUE(again.ok());
  ExpectSnapshotEq(original, *again);
}

TEST_F(SnapshotFileTest, OverwriteReplacesAtomically) {
  const std::string path = dir_ + "/s.pb";
  ASSERT_TRUE(WriteSnapshotFile(path, FullSnapshot(1)).ok());
  const Snapshot second = FullSnapshot(2);
  ASSERT_TRUE(WriteSnapshotFile(path, second).ok());
  absl::StatusOr<Snapshot> read = ReadSnapshotFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSnapshotEq(second, *read);
  EXPECT_EQ(ListDir().size(), 1u);
}

TEST_F(SnapshotFileTest, WriteIntoMissingDirectoryFailsCleanly) {
  const absl::Status status =
      WriteSnapshotFile(dir_ + "/no/such/dir/s.pb", FullSnapshot());
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), "no/such/dir"))
      << status.message();
  EXPECT_TRUE(ListDir().empty());
}

TEST_F(SnapshotFileTest, MissingFileNamesThePath) {
  const std::string path = dir_ + "/absent.pb";
  absl::StatusOr<Snapshot> read = ReadSnapshotFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(read.status().message(), path + ": cannot open"))
      << read.status();
}

TEST_F(SnapshotFileTest, EmptyFileIsRejected) {
  const std::string path = dir_ + "/empty.pb";
  WriteAll(path, "");
  absl::StatusOr<Snapshot> read = ReadSnapshotFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().message(),
            path + ": empty file, not an attnaudit.v1.Snapshot");
}

TEST_F(SnapshotFileTest, DirectoryIsRejected) {
  absl::StatusOr<Snapshot> read = ReadSnapshotFile(dir_);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(), "not a regular file"))
      << read.status();
}

TEST_F(SnapshotFileTest, TruncationInsideATensorIsACorruptFile) {
  const std::string path = dir_ + "/w1.pb";
  Snapshot original = FullSnapshot(5);
  original.k_pages = Tensor(DType::kBF16, {3, 2, 4, 64});
  for (size_t i = 0; i < original.k_pages.bytes().size(); ++i) {
    (*original.k_pages.mutable_bytes())[i] = static_cast<char>(i * 7 + 1);
  }
  ASSERT_TRUE(WriteSnapshotFile(path, original).ok());
  const std::string full = ReadAll(path);
  const size_t start = full.find(std::string(original.k_pages.bytes()));
  ASSERT_NE(start, std::string::npos);
  const size_t end = start + original.k_pages.bytes().size();

  const std::string want =
      ": not a valid attnaudit.v1.Snapshot (truncated or corrupt protobuf)";
  const std::string cut = dir_ + "/cut.pb";
  // Every cut strictly inside k_pages' bytes (and the half-file cut a user
  // would make with `head -c`) must be reported, never decoded.
  std::vector<size_t> cuts;
  for (size_t n = start + 1; n < end; n += 37) cuts.push_back(n);
  cuts.push_back(end - 1);
  for (size_t n : cuts) {
    WriteAll(cut, full.substr(0, n));
    absl::StatusOr<Snapshot> read = ReadSnapshotFile(cut);
    ASSERT_FALSE(read.ok()) << "cut at " << n << " of " << full.size();
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(read.status().message(), cut + want) << "cut at " << n;
  }
}

TEST_F(SnapshotFileTest, EveryPrefixFailsOrDecodesWithoutCrashing) {
  // Cuts at field boundaries parse as a shorter message (protobuf cannot
  // tell); those must still decode to a value, and every other cut must be
  // an error. Neither may crash or allocate more than the file holds.
  const std::string path = dir_ + "/small.pb";
  ASSERT_TRUE(WriteSnapshotFile(path, FullSnapshot(11)).ok());
  const std::string full = ReadAll(path);
  const std::string cut = dir_ + "/cut.pb";
  // Every byte of the first 256 (headers of the first tensors), then a
  // stride through the rest.
  int failures = 0;
  int tries = 0;
  for (size_t n = 1; n < full.size(); n += (n < 256 ? 1 : 13)) {
    WriteAll(cut, full.substr(0, n));
    ++tries;
    if (!ReadSnapshotFile(cut).ok()) ++failures;
  }
  // Most cuts land inside a length-delimited field.
  EXPECT_GT(failures, tries / 2);
}

TEST_F(SnapshotFileTest, GarbageIsACorruptFile) {
  const std::string path = dir_ + "/garbage.pb";
  // Field 1 (q), wire type 2, with a length far past the end of the file:
  // must fail without reserving that much memory.
  WriteAll(path, std::string("\x0a\xff\xff\xff\xff\x07garbage", 13));
  absl::StatusOr<Snapshot> read = ReadSnapshotFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(),
                                "truncated or corrupt protobuf"))
      << read.status();

  // A valid protobuf whose enum is unknown to v1: decoded, then rejected by
  // field path behind the file name.
  v1::Snapshot msg;
  msg.mutable_rope()->set_style(static_cast<v1::RopeStyle>(7));
  WriteAll(path, msg.SerializeAsString());
  read = ReadSnapshotFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().message(), path + ": rope.style: unknown value 7");
}

TEST(ReportJsonTest, UsesProtoFieldNamesAndParsesBack) {
  const AuditReport report = FullReport();
  absl::StatusOr<std::string> json = ReportToJson(report);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(absl::StrContains(*json, "\"verdict\": \"VERDICT_DRIFT\""))
      << *json;
  EXPECT_TRUE(absl::StrContains(*json, "\"max_abs\""));
  EXPECT_TRUE(absl::StrContains(*json, "\"logprob_agreement\""));
  EXPECT_TRUE(absl::StrContains(*json, "\"merge_orders\""));
  EXPECT_FALSE(absl::StrContains(*json, "maxAbs"));  // no lowerCamelCase

  v1::AuditReport parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  absl::StatusOr<AuditReport> decoded = ReportFromProto(parsed);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectReportEq(report, *decoded);
}

TEST(ReportJsonTest, PrintsZeroValuesAndCompactForm) {
  AuditReport report;
  report.verdict = Verdict::kPass;
  ComparisonResult r;
  r.comparison = Comparison::kReplayVsReference;
  r.verdict = Verdict::kPass;
  r.has_out = true;  // all-zero stats
  report.comparisons.push_back(r);
  absl::StatusOr<std::string> json = ReportToJson(report, /*pretty=*/false);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->find('\n'), std::string::npos);
  // A zero drift is reported as zero, not omitted.
  EXPECT_TRUE(absl::StrContains(*json, "\"candidate_nan\":\"0\"")) << *json;
  EXPECT_TRUE(absl::StrContains(*json, "\"max_abs\":0")) << *json;
}

}  // namespace
}  // namespace attnaudit
