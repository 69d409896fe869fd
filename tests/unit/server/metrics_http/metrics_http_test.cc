// MetricsHttpServer: /metrics behind a bearer token (401 without or with a
// wrong one, 200 with it), only GET/HEAD /metrics, HTTPS with the given
// certificate (checked by an OpenSSL client against the CA), bad options
// named by their flag, and scrapes that keep succeeding while hundreds of
// idle or slow connections try to starve them.
#include "server/metrics_http/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

std::string TempDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/metrics_http_" + name;
  std::system(absl::StrCat("rm -rf '", dir, "'; mkdir -p '", dir, "'").c_str());
  return dir;
}

// A connection to 127.0.0.1:port from `source` (another loopback address
// stands for another client machine).
int Connect(int port, const char* source = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (source != nullptr) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    inet_pton(AF_INET, source, &from.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One plain HTTP exchange; the whole response.
std::string Http(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

std::string Get(int port, const std::string& path, const std::string& auth) {
  return Http(
      port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n",
                         auth.empty() ? "" : "Authorization: " + auth + "\r\n",
                         "\r\n"));
}

TEST(MetricsHttpTest, TheTokenGuardsMetricsAndNothingElseIsServed) {
  const std::string dir = TempDir("token");
  std::ofstream(dir + "/token") << "scrape-s3cret\n";
  MetricsHttpOptions o;
  o.listen_address = "127.0.0.1:0";
  o.token_file = dir + "/token";
  auto server = MetricsHttpServer::Start(o, [] { return "up 1\n"; });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_FALSE((*server)->tls());

  const std::string none = Get(port, "/metrics", "");
  EXPECT_TRUE(absl::StartsWith(none, "HTTP/1.1 401")) << none;
  EXPECT_TRUE(absl::StrContains(none, "WWW-Authenticate: Bearer")) << none;
  EXPECT_FALSE(absl::StrContains(none, "up 1"));
  const std::string wrong = Get(port, "/metrics", "Bearer scrape-s3creX");
  EXPECT_TRUE(absl::StartsWith(wrong, "HTTP/1.1 401")) << wrong;
  EXPECT_TRUE(absl::StartsWith(Get(port, "/metrics", "Basic c2NyYXBl"),
                               "HTTP/1.1 401"));
  const std::string ok = Get(port, "/metrics", "Bearer scrape-s3cret");
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200")) << ok;
  EXPECT_TRUE(absl::EndsWith(ok, "\r\n\r\nup 1\n")) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "text/plain; version=0.0.4"));
  EXPECT_TRUE(absl::StartsWith(Get(port, "/other", "Bearer scrape-s3cret"),
                               "HTTP/1.1 404"));
  EXPECT_TRUE(absl::StartsWith(Http(port, "POST /metrics HTTP/1.1\r\n\r\n"),
                               "HTTP/1.1 405"));
  EXPECT_TRUE(absl::StartsWith(Http(port, "garbage\r\n\r\n"), "HTTP/1.1 400"));
  // A head that never ends is cut off at 8 KiB, not buffered forever.
  EXPECT_TRUE(absl::StartsWith(
      Http(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a')),
      "HTTP/1.1 400"));
}

TEST(MetricsHttpTest, ServesOverTlsWithTheGivenCertificate) {
  const std::string dir = TempDir("tls");
  const std::string script = absl::StrCat(
      "set -e; cd '", dir,
      "'; openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=ca; "
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-keyout s.key -out s.csr -subj /CN=localhost; "
      "echo subjectAltName=DNS:localhost,IP:127.0.0.1 > s.ext; "
      "openssl x509 -req -in s.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-days 2 -extfile s.ext -out s.pem");
  std::ofstream(dir + "/certs.sh") << script << "\n";
  ASSERT_EQ(
      std::system(
          absl::StrCat("bash '", dir, "/certs.sh' >/dev/null 2>&1").c_str()),
      0);
  MetricsHttpOptions o;
  o.listen_address = "127.0.0.1:0";
  o.tls_cert_file = dir + "/s.pem";
  o.tls_key_file = dir + "/s.key";
  auto server = MetricsHttpServer::Start(o, [] { return "up 1\n"; });
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->tls());

  // A client that verifies the server against the CA.
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_EQ(
      SSL_CTX_load_verify_locations(ctx, (dir + "/ca.pem").c_str(), nullptr),
      1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  SSL_set_tlsext_host_name(ssl, "localhost");
  ASSERT_EQ(SSL_connect(ssl), 1);
  EXPECT_EQ(SSL_get_verify_result(ssl), X509_V_OK);
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(SSL_write(ssl, req.data(), static_cast<int>(req.size())),
            static_cast<int>(req.size()));
  std::string out;
  char buf[4096];
  int n;
  while ((n = SSL_read(ssl, buf, sizeof(buf))) > 0) out.append(buf, n);
  SSL_free(ssl);
  ::close(fd);
  SSL_CTX_free(ctx);
  EXPECT_TRUE(absl::StartsWith(out, "HTTP/1.1 200")) << out;
  EXPECT_TRUE(absl::EndsWith(out, "up 1\n"));
  // Plain HTTP to the TLS port gets nothing useful.
  EXPECT_FALSE(
      absl::StartsWith(Get((*server)->port(), "/metrics", ""), "HTTP/1.1 200"));
}

TEST(MetricsHttpTest, BadOptionsNameTheirFlag) {
  MetricsHttpOptions o;
  o.listen_address = "127.0.0.1:0";
  o.tls_cert_file = "/nonexistent.pem";
  EXPECT_TRUE(absl::StrContains(
      MetricsHttpServer::Start(o, [] { return ""; }).status().message(),
      "--metrics-tls-cert"));
  o.tls_key_file = "/nonexistent.key";
  EXPECT_TRUE(absl::StrContains(
      MetricsHttpServer::Start(o, [] { return ""; }).status().message(),
      "--metrics-tls-cert"));
  MetricsHttpOptions t;
  t.listen_address = "127.0.0.1:0";
  t.token_file = "/nonexistent.token";
  EXPECT_TRUE(absl::StrContains(
      MetricsHttpServer::Start(t, [] { return ""; }).status().message(),
      "--metrics-token-file"));
  MetricsHttpOptions a;
  a.listen_address = "no-port";
  EXPECT_TRUE(absl::StrContains(
      MetricsHttpServer::Start(a, [] { return ""; }).status().message(),
      "--metrics-listen"));
}

TEST(MetricsHttpTest, AddressesAreCheckedAndAPortInUseIsUnavailable) {
  for (const char* address : {"nonsense", "localhost:99999", "localhost:http",
                              "metrics.example.com:9464", "1.2.3:80"}) {
    MetricsHttpOptions o;
    o.listen_address = address;
    EXPECT_EQ(MetricsHttpServer::Start(o, [] { return ""; }).status().code(),
              absl::StatusCode::kInvalidArgument)
        << address;
  }
  MetricsHttpOptions o;
  o.listen_address = "localhost:0";
  auto first = MetricsHttpServer::Start(o, [] { return "up 1\n"; });
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(
      absl::StartsWith(Get((*first)->port(), "/metrics", ""), "HTTP/1.1 200"));
  o.listen_address = absl::StrCat("127.0.0.1:", (*first)->port());
  EXPECT_EQ(MetricsHttpServer::Start(o, [] { return ""; }).status().code(),
            absl::StatusCode::kUnavailable);
}

// The attack: clients that connect and send nothing, more of them than the
// server holds, from the scraper's own address and from another one. Every
// scrape must still be answered.
TEST(MetricsHttpTest, IdleConnectionsCannotStarveScrapes) {
  MetricsHttpOptions o;
  o.listen_address = "127.0.0.1:0";
  o.max_connections = 32;
  o.max_connections_per_source = 16;
  o.header_timeout = absl::Seconds(30);  // only eviction can help here
  auto server = MetricsHttpServer::Start(o, [] { return "up 1\n"; });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (const char* source : {"127.0.0.2", "127.0.0.3", "127.0.0.1"}) {
    for (int i = 0; i < 60; ++i) {
      const int fd = Connect(port, source);
      ASSERT_GE(fd, 0) << source;
      idle.push_back(fd);
    }
  }
  int answered = 0;
  for (int i = 0; i < 40; ++i) {
    answered += absl::StartsWith(Get(port, "/metrics", ""), "HTTP/1.1 200");
  }
  EXPECT_EQ(answered, 40);
  // 180 idle connections against room for 32: the rest were closed.
  EXPECT_GE((*server)->evicted(), 180 - 32);
  for (int fd : idle) ::close(fd);
}

// Slow clients are closed once header_timeout has passed since they
// connected, however steadily they trickle bytes.
TEST(MetricsHttpTest, AHeadMustArriveWithinTheHeaderTimeout) {
  MetricsHttpOptions o;
  o.listen_address = "127.0.0.1:0";
  o.header_timeout = absl::Milliseconds(500);
  auto server = MetricsHttpServer::Start(o, [] { return "up 1\n"; });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  // 100 ms per byte: the head would take ~3.5 s.
  bool closed = false;
  for (char c : head) {
    if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
      closed = true;
      break;
    }
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 100) == 1) {
      char buf[256];
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      EXPECT_FALSE(n > 0 &&
                   absl::StartsWith(absl::string_view(buf, n), "HTTP/1.1 200"));
      closed = true;
      break;
    }
  }
  ::close(fd);
  EXPECT_TRUE(closed) << "a head trickled over 3.5 s was served";
  EXPECT_GE((*server)->evicted(), 1);
  EXPECT_TRUE(
      absl::StartsWith(Get((*server)->port(), "/metrics", ""), "HTTP/1.1 200"));
}

// A client that scrapes once, reads the whole answer, then keeps its
// connection open and trickles a byte every 100 ms until destroyed: what
// held the server's lingering drain (10 s per read) open indefinitely.
class LingeringClients {
 public:
  LingeringClients() : thread_([this] { Trickle(); }) {}
  ~LingeringClients() {
    stop_.store(true);
    thread_.join();
    for (int fd : fds_) ::close(fd);
  }
  // One more from `source`; false when its scrape was not answered.
  bool Add(int port, const char* source) {
    const int fd = Connect(port, source);
    if (fd < 0) return false;
    const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    ::send(fd, get.data(), get.size(), MSG_NOSIGNAL);
    std::string answer;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, n);
    absl::MutexLock lock(&mu_);
    fds_.push_back(fd);
    return absl::StartsWith(answer, "HTTP/1.1 200");
  }
  // Whether the server has closed every connection: the byte after the
  // one its close reset fails (the server's earlier half-close only ended
  // the answer).
  bool AllClosed() {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) {
      if (::send(fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0 ||
          (errno != EPIPE && errno != ECONNRESET)) {
        return false;
      }
    }
    return true;
  }

 private:
  void Trickle() {
    while (!stop_.load()) {
      {
        absl::MutexLock lock(&mu_);
        for (int fd : fds_) ::send(fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Connections that were answered and then linger, holding
// every slot (from other addresses) or every slot of the scraper's own
// address (a proxy), cannot starve the scraper: answered connections are
// the first evicted.
TEST(MetricsHttpTest, AnsweredConnectionsThatLingerCannotStarveScrapes) {
  MetricsHttpOptions o;
  o.listen_address = "127.0.0.1:0";
  o.max_connections = 8;
  o.max_connections_per_source = 4;
  o.drain_timeout = absl::Seconds(60);  // only eviction can help here
  auto server = MetricsHttpServer::Start(o, [] { return "up 1\n"; });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  {
    LingeringClients others;
    for (const char* source :
         {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}) {
      for (int i = 0; i < 2; ++i) ASSERT_TRUE(others.Add(port, source));
    }
    int answered = 0;
    for (int i = 0; i < 20; ++i) {
      answered += absl::StartsWith(Get(port, "/metrics", ""), "HTTP/1.1 200");
    }
    EXPECT_EQ(answered, 20);
  }
  LingeringClients proxy;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(proxy.Add(port, "127.0.0.1"));
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    answered += absl::StartsWith(Get(port, "/metrics", ""), "HTTP/1.1 200");
  }
  EXPECT_EQ(answered, 20);
  EXPECT_GE((*server)->evicted(), 2);  // one a phase: the slot is reused
}

// Once answered, a connection is closed within drain_timeout however the
// client trickles (the old drain renewed its 10 s wait with every byte).
TEST(MetricsHttpTest, AnAnsweredConnectionIsClosedAfterTheDrainTimeout) {
  MetricsHttpOptions o;
  o.listen_address = "127.0.0.1:0";
  o.drain_timeout = absl::Milliseconds(300);
  auto server = MetricsHttpServer::Start(o, [] { return "up 1\n"; });
  ASSERT_TRUE(server.ok()) << server.status();
  LingeringClients client;
  ASSERT_TRUE(client.Add((*server)->port(), "127.0.0.1"));
  // A generous bound on logic, not speed: 300 ms drain against 30 s.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!client.AllClosed() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(client.AllClosed());
  EXPECT_TRUE([&] {
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while ((*server)->connections() != 0 && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return (*server)->connections() == 0;
  }());
}

}  // namespace
}  // namespace attnaudit::server
