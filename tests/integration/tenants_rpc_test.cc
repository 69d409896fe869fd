// Tenants and permissions end to end: every RPC x own/other tenant x
// permission answers the documented code (the matrix in docs/SECURITY.md;
// ATTNAUDIT_PRINT_MATRIX=1 prints it as measured), another tenant's job is
// NOT_FOUND word for word as an unknown one, idempotency keys are scoped
// per tenant, watchers see only their tenant's results, the token file is
// re-read on reload, and a verified mTLS client certificate stands for its
// tenant.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

constexpr char kTokens[] =
    "# the tenants of this test\n"
    "token:tok-a       tenant-a    audit,submit,read,cancel\n"
    "token:tok-b       tenant-b    audit,submit,read,cancel\n"
    "token:tok-a-audit tenant-a    audit\n"
    "token:tok-reader  ops-read    read_all\n"
    "token:tok-admin   ops         admin\n";

grpc::StatusCode Code(const absl::Status& s) {
  return static_cast<grpc::StatusCode>(s.code());
}

const char* Name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "OTHER";
  }
}

// The job ids a watch received, in order.
std::vector<std::string> Ids(WatchThread& watch) {
  std::vector<std::string> ids;
  for (const v1::JobResult& r : watch.results()) ids.push_back(r.job_id());
  return ids;
}

class TenantsRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::AuditServerOptions o = TestOptions(MakeTempDir("tenants"));
    o.auth_tokens = kTokens;
    client::ClientOptions co;
    co.auth_token = "tok-a";
    t_ = StartServer(std::move(o), co);
    ASSERT_NE(t_, nullptr);
    for (const char* who :
         {"tok-a", "tok-b", "tok-a-audit", "tok-reader", "tok-admin", ""}) {
      callers_[who] = ConnectAs(t_->address, who);
    }
    callers_["bad-token"] = ConnectAs(t_->address, "tok-nobody");
  }

  client::Client* C(const std::string& who) { return callers_[who].get(); }

  // Submits a small snapshot as `who` and waits for it to finish.
  std::string SubmitAndWait(const std::string& who, const std::string& key,
                            int64_t tag) {
    client::SubmitOptions so;
    so.idempotency_key = key;
    absl::StatusOr<v1::SubmitResponse> r =
        C(who)->Submit(SmallSnapshot(tag), so);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(WaitFinished(C(who), r->job_id()).state(), v1::JOB_STATE_DONE);
    return r->job_id();
  }

  void Record(const std::string& rpc, const std::string& caller,
              const std::string& job, grpc::StatusCode want,
              grpc::StatusCode got) {
    EXPECT_EQ(got, want) << rpc << " by " << caller << " on " << job;
    rows_.push_back(absl::StrCat("| ", rpc, " | ", caller, " | ", job, " | ",
                                 Name(want), " |"));
  }

  void TearDown() override {
    if (std::getenv("ATTNAUDIT_PRINT_MATRIX") == nullptr || rows_.empty()) {
      return;
    }
    std::cout << "| RPC | caller | job | code |\n|---|---|---|---|\n";
    for (const std::string& row : rows_) std::cout << row << "\n";
  }

  std::unique_ptr<TestServer> t_;
  std::map<std::string, std::unique_ptr<client::Client>> callers_;
  std::vector<std::string> rows_;
};

TEST_F(TenantsRpcTest, EveryRpcByOwnOtherTenantAndPermission) {
  using grpc::StatusCode;
  const std::string ja = SubmitAndWait("tok-a", "k1", 1);
  const std::string jb = SubmitAndWait("tok-b", "k1", 2);
  ASSERT_FALSE(ja.empty());
  ASSERT_FALSE(jb.empty());
  const Snapshot snap = SmallSnapshot(3);

  // Audit and AuditStream need `audit`.
  for (const auto& [who, want] :
       std::vector<std::pair<std::string, StatusCode>>{
           {"tok-a", StatusCode::OK},
           {"tok-a-audit", StatusCode::OK},
           {"tok-reader", StatusCode::PERMISSION_DENIED},
           {"bad-token", StatusCode::UNAUTHENTICATED},
           {"", StatusCode::UNAUTHENTICATED}}) {
    Record("Audit", who, "-", want,
           Code(C(who)->Audit(snap, {}, client::Transport::kUnary).status()));
    Record("AuditStream", who, "-", want,
           Code(C(who)->AuditStream(snap).status()));
  }
  // Submit needs `submit`.
  for (const auto& [who, want] :
       std::vector<std::pair<std::string, StatusCode>>{
           {"tok-a", StatusCode::OK},
           {"tok-admin", StatusCode::OK},
           {"tok-a-audit", StatusCode::PERMISSION_DENIED},
           {"tok-reader", StatusCode::PERMISSION_DENIED}}) {
    Record("Submit", who, "-", want, Code(C(who)->Submit(snap).status()));
  }
  // GetResult: own or read_all; another tenant's job is unknown.
  for (const auto& [who, job, want] :
       std::vector<std::tuple<std::string, std::string, StatusCode>>{
           {"tok-a", "own", StatusCode::OK},
           {"tok-b", "other", StatusCode::NOT_FOUND},
           {"tok-a-audit", "own", StatusCode::PERMISSION_DENIED},
           {"tok-a-audit", "unknown", StatusCode::PERMISSION_DENIED},
           {"tok-reader", "other", StatusCode::OK},
           {"tok-admin", "other", StatusCode::OK},
           {"tok-a", "unknown", StatusCode::NOT_FOUND}}) {
    const std::string id = job == "unknown" ? "s0000000000000nosuchjob" : ja;
    Record("GetResult", who, job, want, Code(C(who)->GetResult(id).status()));
  }
  // Cancel: own with `cancel`, any with `admin`; a job the caller cannot
  // see is unknown; one it can see (read_all) but not cancel is denied.
  for (const auto& [who, job, want] :
       std::vector<std::tuple<std::string, std::string, StatusCode>>{
           {"tok-b", "other", StatusCode::NOT_FOUND},
           {"tok-reader", "other", StatusCode::PERMISSION_DENIED},
           {"tok-a-audit", "own", StatusCode::PERMISSION_DENIED},
           {"tok-a", "own", StatusCode::OK},
           {"tok-admin", "other", StatusCode::OK},
           {"tok-b", "unknown", StatusCode::NOT_FOUND}}) {
    const std::string id = job == "unknown" ? "s0000000000000nosuchjob" : ja;
    Record("Cancel", who, job, want, Code(C(who)->Cancel(id).status()));
  }
  // GetCapabilities: any valid identity.
  for (const auto& [who, want] :
       std::vector<std::pair<std::string, StatusCode>>{
           {"tok-a-audit", StatusCode::OK},
           {"tok-reader", StatusCode::OK},
           {"bad-token", StatusCode::UNAUTHENTICATED}}) {
    Record("GetCapabilities", who, "-", want,
           Code(C(who)->Capabilities(/*refresh=*/true).status()));
  }
  // WatchResults needs `read`.
  const absl::Status denied =
      C("tok-a-audit")
          ->Watch(
              v1::ResultFilter(), [](const v1::JobResult&) { return false; },
              absl::Seconds(10));
  Record("WatchResults", "tok-a-audit", "-", StatusCode::PERMISSION_DENIED,
         Code(denied));
}

TEST_F(TenantsRpcTest, AnotherTenantsJobLooksExactlyLikeAnUnknownOne) {
  const std::string ja = SubmitAndWait("tok-a", "", 1);
  // Same length and alphabet as a real id, never issued.
  const std::string unknown =
      std::string("s") + std::string(ja.size() - 1, '7');
  for (const bool cancel : {false, true}) {
    const absl::Status other = cancel ? C("tok-b")->Cancel(ja).status()
                                      : C("tok-b")->GetResult(ja).status();
    const absl::Status none = cancel ? C("tok-b")->Cancel(unknown).status()
                                     : C("tok-b")->GetResult(unknown).status();
    EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(absl::StrReplaceAll(other.message(), {{ja, "ID"}}),
              absl::StrReplaceAll(none.message(), {{unknown, "ID"}}));
  }
}

TEST_F(TenantsRpcTest, IdempotencyKeysAreScopedPerTenant) {
  client::SubmitOptions so;
  so.idempotency_key = "rollout-7/step-3";
  const Snapshot snap = SmallSnapshot(5);
  absl::StatusOr<v1::SubmitResponse> a1 = C("tok-a")->Submit(snap, so);
  absl::StatusOr<v1::SubmitResponse> b1 = C("tok-b")->Submit(snap, so);
  absl::StatusOr<v1::SubmitResponse> a2 = C("tok-a")->Submit(snap, so);
  ASSERT_TRUE(a1.ok() && b1.ok() && a2.ok());
  EXPECT_FALSE(a1->deduplicated());
  EXPECT_FALSE(b1->deduplicated());  // b's key is b's own
  EXPECT_NE(a1->job_id(), b1->job_id());
  EXPECT_TRUE(a2->deduplicated());
  EXPECT_EQ(a2->job_id(), a1->job_id());
  EXPECT_EQ(WaitFinished(C("tok-b"), b1->job_id()).state(), v1::JOB_STATE_DONE);
  // b cannot reach a's job through a's key: the id is b's own.
  EXPECT_EQ(C("tok-b")->GetResult(a1->job_id()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TenantsRpcTest, WatchersSeeOnlyTheirTenantUnlessTheyReadAll) {
  WatchThread own(C("tok-a"), 1);
  WatchThread all(C("tok-reader"), 2);
  ASSERT_TRUE(WaitFor(
      [&] { return t_->server->service()->watch_hub()->watchers() == 2; }));
  // b's job finishes first (one worker, FIFO): a's watcher would see it
  // first if it could see it at all.
  const std::string jb = SubmitAndWait("tok-b", "", 1);
  const std::string ja = SubmitAndWait("tok-a", "", 2);
  own.Join();
  all.Join();
  EXPECT_EQ(Ids(own), std::vector<std::string>{ja});
  EXPECT_EQ(Ids(all), (std::vector<std::string>{jb, ja}));
}

TEST(TenantsReloadTest, TheTokenFileIsReadAgainOnReload) {
  const std::string dir = MakeTempDir("tenants_reload");
  const std::string file = dir + "/tokens";
  std::ofstream(file) << "token:old tenant-a audit,read\n";
  server::AuditServerOptions o = TestOptions(dir + "/data");
  o.auth_token_file = file;
  client::ClientOptions co;
  co.auth_token = "old";
  auto t = StartServer(std::move(o), co);
  ASSERT_NE(t, nullptr);
  auto fresh = ConnectAs(t->address, "new");
  EXPECT_TRUE(t->client->Capabilities(true).ok());
  EXPECT_EQ(fresh->Capabilities(true).status().code(),
            absl::StatusCode::kUnauthenticated);

  std::ofstream(file) << "token:new tenant-a audit,read\n";
  ASSERT_TRUE(t->server->ReloadCredentials().ok());
  EXPECT_EQ(t->client->Capabilities(true).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(fresh->Capabilities(true).ok());

  // A broken file keeps the tenants in force.
  std::ofstream(file) << "token:newer tenant-a fly\n";
  EXPECT_FALSE(t->server->ReloadCredentials().ok());
  EXPECT_TRUE(fresh->Capabilities(true).ok());
}

// Certificates for the mTLS test, made with the openssl CLI (as the e2e
// test does): a CA, a server certificate for localhost, and client
// certificates whose subject alternative name is their identity ("fleet-a"
// for the one named like a token tenant).
bool MakeCertificates(const std::string& dir) {
  const std::string script = absl::StrCat(
      "set -e; cd '", dir,
      "'; openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca; "
      "for who in server fleet-c other fleet-a; do "
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-keyout $who.key -out $who.csr -subj /CN=$who.example; "
      "if [ $who = server ]; then "
      "echo subjectAltName=DNS:localhost,IP:127.0.0.1 > $who.ext; "
      "elif [ $who = fleet-a ]; then "
      "echo subjectAltName=DNS:fleet-a > $who.ext; "
      "else echo subjectAltName=DNS:$who.example > $who.ext; fi; "
      "openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key "
      "-CAcreateserial -days 2 -extfile $who.ext -out $who.pem; done");
  const std::string file = dir + "/make_certs.sh";
  std::ofstream(file) << script << "\n";
  return std::system(
             absl::StrCat("bash '", file, "' >/dev/null 2>&1").c_str()) == 0;
}

// A server with TLS and `tokens` in `dir` (certificates made there).
server::AuditServerOptions MtlsServer(const std::string& dir,
                                      const std::string& tokens) {
  server::AuditServerOptions o = TestOptions(dir + "/data");
  o.tls = {dir + "/server.pem", dir + "/server.key", dir + "/ca.pem"};
  o.auth_tokens = tokens;
  return o;
}

// A client presenting certificate `who` (made by MakeCertificates).
client::ClientOptions MtlsClient(const std::string& dir,
                                 const std::string& who) {
  client::ClientOptions co;
  co.tls = true;
  co.tls_ca = dir + "/ca.pem";
  co.tls_cert = dir + "/" + who + ".pem";
  co.tls_key = dir + "/" + who + ".key";
  co.tls_server_name = "localhost";
  return co;
}

TEST(TenantsMtlsTest, TheClientCertificateStandsForTheTenant) {
  const std::string dir = MakeTempDir("tenants_mtls");
  ASSERT_TRUE(MakeCertificates(dir)) << "openssl failed";
  auto t = StartServer(MtlsServer(dir,
                                  "cert:fleet-c.example  fleet-c  submit,read\n"
                                  "cert:*                *        read\n"),
                       MtlsClient(dir, "fleet-c"));
  ASSERT_NE(t, nullptr);
  absl::StatusOr<v1::SubmitResponse> s = t->client->Submit(SmallSnapshot(1));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(WaitFinished(t->client.get(), s->job_id()).state(),
            v1::JOB_STATE_DONE);

  // Another certificate is its own tenant ("other.example", read only).
  client::ClientOptions oo = MtlsClient(dir, "other");
  oo.address = t->address;
  auto other = client::Client::Connect(oo);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->Submit(SmallSnapshot(2)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*other)->GetResult(s->job_id()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE((*other)->Capabilities(true).ok());
}

// The attack: a certificate from the trusted CA whose identity equals a
// token tenant's name, under `cert:* *`, must not become that tenant and
// read its results.
TEST(TenantsMtlsTest, ACertificateNamedLikeATokenTenantIsNotThatTenant) {
  const std::string dir = MakeTempDir("tenants_mtls_squat");
  ASSERT_TRUE(MakeCertificates(dir)) << "openssl failed";
  client::ClientOptions co = MtlsClient(dir, "other");
  co.auth_token = "tok-a";  // the token is what counts
  auto t = StartServer(MtlsServer(dir,
                                  "token:tok-a  fleet-a  submit,read\n"
                                  "cert:*       *        audit,read\n"),
                       co);
  ASSERT_NE(t, nullptr);
  absl::StatusOr<v1::SubmitResponse> s = t->client->Submit(SmallSnapshot(1));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(WaitFinished(t->client.get(), s->job_id()).state(),
            v1::JOB_STATE_DONE);

  client::ClientOptions so = MtlsClient(dir, "fleet-a");
  so.address = t->address;
  auto squatter = client::Client::Connect(so);
  ASSERT_TRUE(squatter.ok());
  EXPECT_EQ((*squatter)->GetResult(s->job_id()).status().code(),
            absl::StatusCode::kNotFound);
  // It is a tenant of its own: its own jobs are its own.
  absl::StatusOr<AuditReport> own = (*squatter)->Audit(SmallSnapshot(2));
  EXPECT_TRUE(own.ok()) << own.status();
}

}  // namespace
}  // namespace attnaudit::testing
