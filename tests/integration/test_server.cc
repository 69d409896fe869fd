#include "tests/integration/test_server.h"

#include <dirent.h>
#include <grpcpp/generic/generic_stub.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/audit/audit.h"
#include "gtest/gtest.h"
#include "server/log/log.h"

namespace attnaudit::testing {

Snapshot SmallSnapshot(int64_t tag, Fault fault, int64_t context) {
  SynthOptions o;
  o.preset = "llama3-8b";
  o.batch = 1;
  o.context = context;
  o.vocab = 16;
  o.fault = fault;
  o.seed = static_cast<uint64_t>(tag) + 1;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return Snapshot();
  s->labels.step = tag;
  return *std::move(s);
}

namespace {

// Removes every directory MakeTempDir made when the test program exits
// (after the fixtures, and so the servers, are gone).
class TempDirs {
 public:
  ~TempDirs() {
    for (const std::string& dir : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  void Add(std::string dir) {
    absl::MutexLock lock(&mu_);
    dirs_.push_back(std::move(dir));
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> dirs_;
};
TempDirs& AllTempDirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr ? base : "/tmp",
                                  "/attnaudit_", name, "_XXXXXX");
  char* made = mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  AllTempDirs().Add(tmpl);
  return tmpl;
}

int CountFiles(const std::string& dir, const std::string& suffix) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (absl::EndsWith(e->d_name, suffix)) ++n;
  }
  closedir(d);
  return n;
}

void GateState::Open() {
  absl::MutexLock lock(&mu_);
  open_ = true;
}

bool GateState::WaitStarted(size_t n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [this, n]() {
    mu_.AssertReaderHeld();
    return started_.size() >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

std::vector<int64_t> GateState::started() {
  absl::MutexLock lock(&mu_);
  return started_;
}

int GateState::cancelled_runs() {
  absl::MutexLock lock(&mu_);
  return cancelled_runs_;
}

absl::Status GateState::Pass(int64_t tag, const std::atomic<bool>* cancelled) {
  absl::MutexLock lock(&mu_);
  started_.push_back(tag);
  const absl::Time give_up = absl::Now() + kWait;
  auto open = [this]() {
    mu_.AssertReaderHeld();
    return open_;
  };
  // The cancel flag is an atomic nobody signals through mu_: poll it the
  // way a real device polls between work items.
  while (!open_) {
    if (cancelled != nullptr && cancelled->load()) {
      ++cancelled_runs_;
      return absl::CancelledError("gate device saw the cancel flag");
    }
    if (absl::Now() > give_up) {
      return absl::InternalError("gate never opened (test bug)");
    }
    mu_.AwaitWithTimeout(absl::Condition(&open), absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

absl::StatusOr<AuditReport> GateDevice::Run(const Snapshot& snapshot,
                                            const AuditOptions& options) {
  if (absl::Status s = gate_->Pass(snapshot.labels.step, options.cancelled);
      !s.ok()) {
    return s;
  }
  AuditOptions own = options;
  own.threads = 1;
  return RunAudit(snapshot, own);
}

server::AuditServerOptions TestOptions(const std::string& data_dir) {
  server::AuditServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.data_dir = data_dir;
  o.cpu_workers = 1;
  o.threads_per_job = 1;
  o.sync_storage = false;
  o.drain_timeout = absl::Seconds(5);
  o.blocking_threads = 2;
  return o;
}

std::unique_ptr<TestServer> StartServer(server::AuditServerOptions options,
                                        client::ClientOptions client_options) {
  // Start-up and shutdown lines at info level would drown the test output.
  server::ConfigureLogging(spdlog::level::warn);
  auto t = std::make_unique<TestServer>();
  t->data_dir = options.data_dir;
  absl::StatusOr<std::unique_ptr<server::AuditServer>> server =
      server::AuditServer::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  t->server = *std::move(server);
  t->address = absl::StrCat("127.0.0.1:", t->server->port());
  client_options.address = t->address;
  if (client_options.timeout == absl::Seconds(120)) {
    client_options.timeout = kWait;
  }
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Connect(client_options);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  t->client = *std::move(c);
  t->channel =
      grpc::CreateChannel(t->address, grpc::InsecureChannelCredentials());
  t->stub = v1::AuditService::NewStub(t->channel);
  return t;
}

namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// A length-delimited protobuf field (strings under 128 bytes).
std::string StringField(int number, const std::string& value) {
  std::string out;
  out.push_back(static_cast<char>((number << 3) | 2));
  out.push_back(static_cast<char>(value.size()));
  out += value;
  return out;
}

bool Next(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  const auto deadline = absl::ToChronoTime(absl::Now() + kWait);
  return cq->AsyncNext(&tag, &ok, deadline) ==
             grpc::CompletionQueue::GOT_EVENT &&
         ok;
}

void DrainQueue(grpc::CompletionQueue* cq) {
  cq->Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
  }
}

}  // namespace

int HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                const std::string& service, grpc::Status* status) {
  grpc::GenericStub stub(channel);
  const std::string request = service.empty() ? "" : StringField(1, service);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", in, &cq);
  call->StartCall();
  call->Finish(&out, status, reinterpret_cast<void*>(1));
  Next(&cq);
  DrainQueue(&cq);
  if (!status->ok()) return -1;
  const std::string bytes = Flatten(out);
  // HealthCheckResponse { ServingStatus status = 1; }; absent means 0.
  if (bytes.size() >= 2 && bytes[0] == 0x08) return bytes[1];
  return 0;
}

grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method, const std::string& request,
                          std::string* response,
                          const std::string& bearer_token) {
  grpc::GenericStub stub(channel);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  if (!bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + bearer_token);
  }
  grpc::CompletionQueue cq;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&context, method, in, &cq);
  call->StartCall();
  call->Finish(&out, &status, reinterpret_cast<void*>(1));
  Next(&cq);
  DrainQueue(&cq);
  if (response != nullptr && status.ok()) *response = Flatten(out);
  return status;
}

std::string ReflectionListServices(
    const std::shared_ptr<grpc::Channel>& channel, grpc::Status* status) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  std::string response;
  if (Next(&cq)) {
    // ServerReflectionRequest { string list_services = 7; } (empty string).
    grpc::Slice slice(StringField(7, ""));
    grpc::ByteBuffer in(&slice, 1);
    call->Write(in, reinterpret_cast<void*>(2));
    if (Next(&cq)) {
      call->WritesDone(reinterpret_cast<void*>(3));
      Next(&cq);
      grpc::ByteBuffer out;
      call->Read(&out, reinterpret_cast<void*>(4));
      if (Next(&cq)) response = Flatten(out);
    }
  }
  call->Finish(status, reinterpret_cast<void*>(5));
  Next(&cq);
  DrainQueue(&cq);
  return response;
}

bool WaitFor(const std::function<bool()>& predicate, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (!predicate()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

v1::JobResult WaitFinished(client::Client* client, const std::string& id) {
  v1::JobResult last;
  WaitFor([&] {
    absl::StatusOr<v1::JobResult> r = client->GetResult(id);
    if (!r.ok()) return false;
    last = *r;
    return r->state() == v1::JOB_STATE_DONE ||
           r->state() == v1::JOB_STATE_FAILED ||
           r->state() == v1::JOB_STATE_CANCELLED;
  });
  return last;
}

std::unique_ptr<client::Client> ConnectAs(const std::string& address,
                                          const std::string& token) {
  client::ClientOptions o;
  o.address = address;
  o.auth_token = token;
  o.timeout = kWait;
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

WatchThread::WatchThread(client::Client* client, int count)
    : thread_([this, client, count] {
        absl::Status s = client->Watch(
            v1::ResultFilter(),
            [this, count](const v1::JobResult& r) {
              absl::MutexLock lock(&mu_);
              results_.push_back(r);
              return static_cast<int>(results_.size()) < count;
            },
            kWait);
        absl::MutexLock lock(&mu_);
        status_ = s;
      }) {}

void WatchThread::Join() {
  if (thread_.joinable()) thread_.join();
}

std::vector<v1::JobResult> WatchThread::results() {
  absl::MutexLock lock(&mu_);
  return results_;
}

absl::Status WatchThread::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace attnaudit::testing
