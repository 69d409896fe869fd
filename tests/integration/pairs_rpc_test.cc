// Train-rollout pairs through the RPC surface of one server: a rollout
// snapshot (Submit) and a trainer snapshot (Audit) of the same rows join
// on the server whichever comes first, and ListPairs lists, filters and
// pages them; bad requests name the field. (A fleet's pairs, joined across
// replicas in PostgreSQL: fleet_rpc_test.)
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

// One side of the decode step `tag` of run `run`, layer 2, request "req".
Snapshot Side(SnapshotRole role, const std::string& run, int64_t tag = 7,
              Fault fault = Fault::kNone) {
  Snapshot s = SmallSnapshot(tag, fault);
  s.labels.role = role;
  s.labels.run = run;
  s.labels.layer = 2;
  s.labels.request_ids = {"req"};
  s.labels.weight_version =
      role == SnapshotRole::kRollout ? "rollout-w" : "trainer-w";
  return s;
}

class PairsRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer(TestOptions(MakeTempDir("pairs")));
    ASSERT_NE(server_, nullptr);
  }
  client::Client* client() { return server_->client.get(); }

  std::string SubmitSide(const Snapshot& s) {
    absl::StatusOr<v1::SubmitResponse> r = client()->Submit(s);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(WaitFinished(client(), r->job_id()).state(), v1::JOB_STATE_DONE);
    return r->job_id();
  }
  std::string AuditSide(const Snapshot& s) {
    v1::AuditRequest request;
    SnapshotToProto(s, request.mutable_snapshot());
    absl::StatusOr<v1::AuditResponse> r = client()->AuditUnary(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id() : "";
  }
  // The pairs of `request`, once there are `n` (the join is asynchronous).
  std::vector<v1::PairResult> WaitPairs(v1::ListPairsRequest request, int n) {
    std::vector<v1::PairResult> out;
    EXPECT_TRUE(WaitFor([&] {
      absl::StatusOr<v1::ListPairsResponse> r = client()->ListPairs(request);
      if (!r.ok()) return false;
      out.assign(r->pairs().begin(), r->pairs().end());
      return static_cast<int>(out.size()) >= n;
    })) << "pairs seen: "
        << out.size();
    return out;
  }

  std::unique_ptr<TestServer> server_;
};

TEST_F(PairsRpcTest, ARolloutAndATrainerOfTheSameRowsAreJoinedAndListed) {
  const std::string rollout = SubmitSide(Side(SnapshotRole::kRollout, "grpo"));
  const std::string trainer = AuditSide(Side(SnapshotRole::kTrainer, "grpo"));
  v1::ListPairsRequest by_run;
  by_run.set_run("grpo");
  const std::vector<v1::PairResult> pairs = WaitPairs(by_run, 1);
  ASSERT_EQ(pairs.size(), 1u);
  const v1::PairResult& p = pairs[0];
  EXPECT_EQ(p.rollout_job_id(), rollout);
  EXPECT_EQ(p.trainer_job_id(), trainer);
  EXPECT_EQ(p.layer(), 2);
  EXPECT_EQ(p.rollout_step(), 7);
  EXPECT_EQ(p.rollout_weight_version(), "rollout-w");
  EXPECT_EQ(p.trainer_weight_version(), "trainer-w");
  EXPECT_TRUE(p.has_join_time());
  EXPECT_EQ(p.report().verdict(), v1::PAIR_VERDICT_CONSISTENT);
  ASSERT_EQ(p.report().rows_size(), 1);
  EXPECT_EQ(p.report().rows(0).request_id(), "req");
  EXPECT_TRUE(p.report().rows(0).out_bitwise());
  EXPECT_EQ(p.report().rollout_verdict(), v1::VERDICT_PASS);
  EXPECT_EQ(p.report().trainer_verdict(), v1::VERDICT_PASS);
  // Each side's own result is stored as any audit's.
  EXPECT_EQ(WaitFinished(client(), trainer).state(), v1::JOB_STATE_DONE);
}

TEST_F(PairsRpcTest, ListPairsFiltersAndPages) {
  // run-a: the trainer first and a drifting one; run-b: a clean pair.
  AuditSide(Side(SnapshotRole::kTrainer, "run-a", 7, Fault::kStalePage));
  SubmitSide(Side(SnapshotRole::kRollout, "run-a"));
  SubmitSide(Side(SnapshotRole::kRollout, "run-b", 9));
  AuditSide(Side(SnapshotRole::kTrainer, "run-b", 9));
  const std::vector<v1::PairResult> all = WaitPairs({}, 2);
  ASSERT_EQ(all.size(), 2u);

  v1::ListPairsRequest drift;
  drift.set_verdict(v1::PAIR_VERDICT_TRAINER_DRIFT);
  absl::StatusOr<v1::ListPairsResponse> r = client()->ListPairs(drift);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->pairs_size(), 1);
  EXPECT_EQ(r->pairs(0).run(), "run-a");
  EXPECT_FALSE(r->pairs(0).report().trainer_diagnosis().empty());

  v1::ListPairsRequest other_layer;
  other_layer.set_layer(3);
  r = client()->ListPairs(other_layer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pairs_size(), 0);

  v1::ListPairsRequest by_request;
  by_request.set_request_id("req");
  by_request.set_step(9);
  r = client()->ListPairs(by_request);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->pairs_size(), 1);
  EXPECT_EQ(r->pairs(0).run(), "run-b");

  // Pages of one: each pair once, newest first.
  v1::ListPairsRequest paged;
  paged.set_page_size(1);
  std::vector<std::string> runs;
  for (int page = 0; page < 4; ++page) {
    r = client()->ListPairs(paged);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const v1::PairResult& p : r->pairs()) runs.push_back(p.run());
    if (r->next_page_token().empty()) break;
    paged.set_page_token(r->next_page_token());
  }
  EXPECT_EQ(runs, (std::vector<std::string>{"run-b", "run-a"}));
}

TEST_F(PairsRpcTest, BadListPairsRequestsNameTheField) {
  v1::ListPairsRequest r;
  r.set_page_size(-1);
  absl::StatusOr<v1::ListPairsResponse> got = client()->ListPairs(r);
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_TRUE(absl::StartsWith(got.status().message(), "page_size"))
      << got.status();
  r = v1::ListPairsRequest();
  r.set_page_token("c12");
  got = client()->ListPairs(r);
  EXPECT_TRUE(absl::StartsWith(got.status().message(), "page_token"))
      << got.status();
  r = v1::ListPairsRequest();
  r.set_verdict(static_cast<v1::PairVerdict>(42));
  got = client()->ListPairs(r);
  EXPECT_TRUE(absl::StartsWith(got.status().message(), "verdict"))
      << got.status();
}

TEST_F(PairsRpcTest, AnUnknownRoleIsInvalidNamingTheField) {
  v1::AuditRequest request;
  SnapshotToProto(Side(SnapshotRole::kRollout, "x"),
                  request.mutable_snapshot());
  request.mutable_snapshot()->mutable_labels()->set_role(
      static_cast<v1::SnapshotRole>(9));
  absl::StatusOr<v1::AuditResponse> r = client()->AuditUnary(request);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "labels.role"))
      << r.status();
}

}  // namespace
}  // namespace attnaudit::testing
