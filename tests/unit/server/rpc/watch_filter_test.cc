// ResultFilter semantics (service.proto): every set criterion must match;
// verdicts match DONE jobs only.
#include "gtest/gtest.h"
#include "server/rpc/watch_hub.h"

namespace attnaudit::server {
namespace {

v1::JobResult Done(const std::string& model, int64_t layer, v1::Verdict v) {
  v1::JobResult r;
  r.set_state(v1::JOB_STATE_DONE);
  r.mutable_labels()->set_model(model);
  r.mutable_labels()->set_layer(layer);
  r.mutable_labels()->set_engine("vllm");
  r.mutable_labels()->set_backend("flashinfer");
  r.mutable_report()->set_verdict(v);
  return r;
}

TEST(WatchFilterTest, EmptyFilterMatchesEveryFinishedJob) {
  v1::JobResult failed;
  failed.set_state(v1::JOB_STATE_FAILED);
  EXPECT_TRUE(MatchesFilter(v1::ResultFilter(), failed));
  EXPECT_TRUE(
      MatchesFilter(v1::ResultFilter(), Done("m", 1, v1::VERDICT_PASS)));
}

TEST(WatchFilterTest, EveryCriterionMustMatch) {
  const v1::JobResult r = Done("llama", 3, v1::VERDICT_DRIFT);
  v1::ResultFilter f;
  f.set_model("llama");
  EXPECT_TRUE(MatchesFilter(f, r));
  f.set_layer(3);
  EXPECT_TRUE(MatchesFilter(f, r));
  f.set_layer(4);
  EXPECT_FALSE(MatchesFilter(f, r));
  f.set_layer(3);
  f.set_engine("sglang");
  EXPECT_FALSE(MatchesFilter(f, r));
  f.set_engine("vllm");
  f.set_backend("flashinfer");
  EXPECT_TRUE(MatchesFilter(f, r));
  f.set_model("qwen");
  EXPECT_FALSE(MatchesFilter(f, r));
}

TEST(WatchFilterTest, LayerZeroIsASetCriterion) {
  v1::ResultFilter f;
  f.set_layer(0);
  EXPECT_TRUE(MatchesFilter(f, Done("m", 0, v1::VERDICT_PASS)));
  v1::JobResult no_layer = Done("m", 0, v1::VERDICT_PASS);
  no_layer.mutable_labels()->clear_layer();
  EXPECT_FALSE(MatchesFilter(f, no_layer));
}

TEST(WatchFilterTest, VerdictsMatchOnlyDoneJobsWithAListedVerdict) {
  v1::ResultFilter f;
  f.add_verdicts(v1::VERDICT_DRIFT);
  f.add_verdicts(v1::VERDICT_INVALID);
  EXPECT_TRUE(MatchesFilter(f, Done("m", 1, v1::VERDICT_DRIFT)));
  EXPECT_TRUE(MatchesFilter(f, Done("m", 1, v1::VERDICT_INVALID)));
  EXPECT_FALSE(MatchesFilter(f, Done("m", 1, v1::VERDICT_PASS)));
  v1::JobResult cancelled;
  cancelled.set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(MatchesFilter(f, cancelled));
}

}  // namespace
}  // namespace attnaudit::server
