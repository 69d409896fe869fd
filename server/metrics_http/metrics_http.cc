#include "server/metrics_http/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/credentials/credential_files.h"

namespace attnaudit::server {
namespace {

constexpr size_t kMaxHead = 8 << 10;

std::string Sha256(absl::string_view text) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d);
  return std::string(reinterpret_cast<const char*>(d), sizeof(d));
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown TLS error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

// "HOST:PORT" -> a socket address (see MetricsHttpOptions).
absl::Status ParseAddress(const std::string& address, sockaddr_storage* out,
                          socklen_t* len) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen: expected HOST:PORT, got \"", address, "\""));
  }
  std::string host = address.substr(0, colon);
  std::memset(out, 0, sizeof(*out));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(),
                  &v6->sin6_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics-listen: bad IPv6 address \"", host, "\""));
    }
    *len = sizeof(sockaddr_in6);
    return absl::OkStatus();
  }
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  v4->sin_family = AF_INET;
  v4->sin_port = htons(static_cast<uint16_t>(port));
  *len = sizeof(sockaddr_in);
  if (host.empty() || host == "*") {
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    return absl::OkStatus();
  }
  if (absl::AsciiStrToLower(host) == "localhost") host = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen: host must be an IP literal or localhost, got \"",
        host, "\""));
  }
  return absl::OkStatus();
}

void SetSocketTimeout(int fd, int option, absl::Duration timeout) {
  timeout = std::max(timeout, absl::Milliseconds(1));  // 0 would mean never
  timeval tv;
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  tv.tv_usec =
      static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000);
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

// One connection's transport: plain socket or TLS over it. It does not
// close the socket (its owner does, see Connection).
class Conn {
 public:
  Conn(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~Conn() {
    if (ssl_ != nullptr) {
      SSL_shutdown(ssl_);
      SSL_free(ssl_);
    }
  }
  // Bytes read, 0 at the end, -1 on error or timeout.
  ssize_t Read(char* buf, size_t n) {
    if (ssl_ != nullptr) {
      const int r = SSL_read(ssl_, buf, static_cast<int>(n));
      return r > 0 ? r
                   : (SSL_get_error(ssl_, r) == SSL_ERROR_ZERO_RETURN ? 0 : -1);
    }
    ssize_t r;
    do {
      r = ::recv(fd_, buf, n, 0);
    } while (r < 0 && errno == EINTR);
    return r;
  }
  // Ends the exchange without resetting the connection: unread request
  // bytes at close() would make the kernel send a reset, which can discard
  // the response before the client reads it. Bounded: 64 KiB, and
  // `timeout` in all, however the client trickles.
  void LingeringClose(absl::Duration timeout) {
    if (ssl_ != nullptr) return;  // SSL_shutdown in the destructor
    ::shutdown(fd_, SHUT_WR);
    const absl::Time deadline = absl::Now() + timeout;
    char buf[4096];
    for (size_t drained = 0; drained < (64 << 10);) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      SetSocketTimeout(fd_, SO_RCVTIMEO, left);
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }
  // Writes everything before `deadline` (a client reading slowly cannot
  // hold the connection longer).
  bool WriteAll(absl::string_view data, absl::Time deadline) {
    while (!data.empty()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      SetSocketTimeout(fd_, SO_SNDTIMEO, left);
      ssize_t w;
      if (ssl_ != nullptr) {
        const int r =
            SSL_write(ssl_, data.data(),
                      static_cast<int>(std::min<size_t>(data.size(), 1 << 30)));
        w = r > 0 ? r : -1;
      } else {
        do {
          w = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
        } while (w < 0 && errno == EINTR);
      }
      if (w <= 0) return false;
      data.remove_prefix(static_cast<size_t>(w));
    }
    return true;
  }

 private:
  const int fd_;
  SSL* const ssl_;
};

std::string HttpResponse(absl::string_view status, absl::string_view type,
                         absl::string_view extra_headers,
                         absl::string_view body, bool head_only) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                   "Connection: close\r\n\r\n");
  if (!head_only) out.append(body.data(), body.size());
  return out;
}

// The peer's address without its port: what per-source limits count.
std::string SourceOf(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = "";
  if (peer.ss_family == AF_INET6) {
    inet_ntop(AF_INET6,
              &reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr, text,
              sizeof(text));
  } else if (peer.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr,
              text, sizeof(text));
  }
  return text;
}

}  // namespace

struct MetricsHttpServer::Request {
  std::string method;
  std::string path;
  std::string authorization;
  bool complete = false;  // a whole head arrived
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options, Render render) {
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(options, std::move(render)));
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadTokenFile("metrics-token-file", options.token_file);
    if (!token.ok()) return token.status();
    server->token_digest_ = Sha256(*token);
  }
  if (absl::Status s = server->LoadTls(); !s.ok()) return s;
  if (absl::Status s = server->Listen(); !s.ok()) return s;
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

absl::Status MetricsHttpServer::LoadTls() {
  const MetricsHttpOptions& o = options_;
  if (o.tls_cert_file.empty() && o.tls_key_file.empty())
    return absl::OkStatus();
  if (o.tls_cert_file.empty() || o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--metrics-tls-cert: --metrics-tls-cert and --metrics-tls-key go "
        "together");
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError(OpenSslError());
  ssl_ctx_ = ctx;  // freed by the destructor
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx, o.tls_cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-tls-cert: cannot use ", o.tls_cert_file, ": ",
                     OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, o.tls_key_file.c_str(),
                                  SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-tls-key: cannot use ", o.tls_key_file, ": ",
                     OpenSslError()));
  }
  return absl::OkStatus();
}

absl::Status MetricsHttpServer::Listen() {
  sockaddr_storage addr;
  socklen_t len = 0;
  if (absl::Status s = ParseAddress(options_.listen_address, &addr, &len);
      !s.ok()) {
    return s;
  }
  listen_fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen: socket: ", std::strerror(errno)));
  }
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen ", options_.listen_address,
                     ": cannot listen: ", std::strerror(errno)));
  }
  sockaddr_storage bound;
  socklen_t bound_len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  port_ = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return absl::OkStatus();
}

void MetricsHttpServer::AcceptLoop() {
  // Wakes at least this often to close connections past header_timeout.
  const int sweep_ms = static_cast<int>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(options_.header_timeout) / 4, 10, 250));
  while (true) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, sweep_ms);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      ExpireLocked(absl::Now());
    }
    if (ready <= 0) continue;
    sockaddr_storage peer;
    socklen_t peer_len = sizeof(peer);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer),
                             &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;  // EINTR, ECONNABORTED, EMFILE: poll again
    Connection c;
    c.fd = fd;
    c.source = SourceOf(peer);
    c.accepted = absl::Now();
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      MakeRoomLocked(c.source);
      id = next_id_++;
      connections_.emplace(id, std::move(c));
    }
    std::thread([this, id, fd] {
      // A write to a closed peer must not kill the process.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      Serve(id, fd);
      // Closed only once no eviction can reach it (Connection).
      absl::MutexLock lock(&mu_);
      connections_.erase(id);
      ::close(fd);
    }).detach();
  }
}

void MetricsHttpServer::MakeRoomLocked(const std::string& source) {
  absl::flat_hash_map<std::string, int> held;  // live connections per source
  int total = 0;
  for (const auto& [id, c] : connections_) {
    if (c.evicted) continue;
    ++held[c.source];
    ++total;
  }
  const bool source_full = held[source] >= options_.max_connections_per_source;
  if (!source_full && total < options_.max_connections) return;
  // From this source when it is the one at its limit, else from the
  // source holding the most: the earliest stage (answered, then waiting
  // for its head, then being answered), then the oldest.
  auto before = [&held](const Connection& a, const Connection& b) {
    if (a.stage != b.stage) return a.stage < b.stage;
    if (held[a.source] != held[b.source]) {
      return held[a.source] > held[b.source];
    }
    return a.accepted < b.accepted;
  };
  Connection* victim = nullptr;
  for (auto& [id, c] : connections_) {
    if (c.evicted || (source_full && c.source != source)) continue;
    if (victim == nullptr || before(c, *victim)) victim = &c;
  }
  if (victim != nullptr) EvictLocked(victim);
}

void MetricsHttpServer::ExpireLocked(absl::Time now) {
  for (auto& [id, c] : connections_) {
    if (c.stage == Stage::kReading && !c.evicted &&
        now - c.accepted > options_.header_timeout) {
      EvictLocked(&c);
    }
  }
}

void MetricsHttpServer::EvictLocked(Connection* c) {
  // The connection's thread is blocked reading, writing or lingering; this
  // makes that fail at once, and the thread closes the socket.
  ::shutdown(c->fd, SHUT_RDWR);
  c->evicted = true;
  ++evicted_;
}

void MetricsHttpServer::SetStage(uint64_t id, Stage stage) {
  absl::MutexLock lock(&mu_);
  connections_.at(id).stage = stage;
}

int MetricsHttpServer::connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(connections_.size());
}

int64_t MetricsHttpServer::evicted() const {
  absl::MutexLock lock(&mu_);
  return evicted_;
}

void MetricsHttpServer::Serve(uint64_t id, int fd) {
  // The accept thread enforces header_timeout as a whole; this bounds one
  // read in case it is late.
  SetSocketTimeout(fd, SO_RCVTIMEO, options_.header_timeout);
  SetSocketTimeout(fd, SO_SNDTIMEO, options_.io_timeout);
  SSL* ssl = nullptr;
  if (ssl_ctx_ != nullptr) {
    ssl = SSL_new(static_cast<SSL_CTX*>(ssl_ctx_));
    if (ssl == nullptr) return;
    SSL_set_fd(ssl, fd);
  }
  Conn conn(fd, ssl);
  const bool handshake = ssl == nullptr || SSL_accept(ssl) == 1;
  std::string head;
  char buf[2048];
  while (handshake && head.size() < kMaxHead &&
         !absl::StrContains(head, "\r\n\r\n")) {
    const ssize_t n = conn.Read(buf, sizeof(buf));
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  if (!handshake) return;
  SetStage(id, Stage::kWriting);
  const std::string response = Respond(ParseRequest(head));
  if (!conn.WriteAll(response, absl::Now() + options_.io_timeout)) return;
  SetStage(id, Stage::kDraining);
  conn.LingeringClose(options_.drain_timeout);
}

MetricsHttpServer::Request MetricsHttpServer::ParseRequest(
    const std::string& head) {
  Request request;
  const size_t end = head.find("\r\n\r\n");
  request.complete = end != std::string::npos && end < kMaxHead;
  if (!request.complete) return request;
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(head).substr(0, end), "\r\n");
  std::vector<absl::string_view> first =
      absl::StrSplit(lines[0], ' ', absl::SkipEmpty());
  if (first.size() == 3) {
    request.method = std::string(first[0]);
    request.path = std::string(first[1]);
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    if (absl::StartsWithIgnoreCase(line, "authorization:")) {
      line.remove_prefix(sizeof("authorization:") - 1);
      request.authorization = std::string(absl::StripAsciiWhitespace(line));
    }
  }
  return request;
}

std::string MetricsHttpServer::Respond(const Request& r) const {
  constexpr absl::string_view kText = "text/plain; charset=utf-8";
  if (!r.complete || r.method.empty()) {
    return HttpResponse("400 Bad Request", kText, "", "bad request\n", false);
  }
  const bool head = r.method == "HEAD";
  if (r.method != "GET" && !head) {
    return HttpResponse("405 Method Not Allowed", kText, "Allow: GET, HEAD\r\n",
                        "only GET /metrics\n", false);
  }
  absl::string_view path = r.path;
  path = path.substr(0, path.find('?'));
  if (path != "/metrics") {
    return HttpResponse("404 Not Found", kText, "", "see /metrics\n", head);
  }
  if (!token_digest_.empty()) {
    absl::string_view auth = r.authorization;
    const bool bearer = absl::ConsumePrefix(&auth, "Bearer ") ||
                        absl::ConsumePrefix(&auth, "bearer ");
    const std::string digest = Sha256(auth);
    if (!bearer || CRYPTO_memcmp(digest.data(), token_digest_.data(),
                                 digest.size()) != 0) {
      return HttpResponse("401 Unauthorized", kText,
                          "WWW-Authenticate: Bearer realm=\"attnaudit\"\r\n",
                          "a valid bearer token is required\n", head);
    }
  }
  return HttpResponse("200 OK", "text/plain; version=0.0.4; charset=utf-8", "",
                      render_(), head);
}

MetricsHttpServer::~MetricsHttpServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (accept_thread_.joinable()) accept_thread_.join();  // within a sweep
  if (listen_fd_ >= 0) ::close(listen_fd_);
  absl::MutexLock lock(&mu_);
  for (auto& [id, c] : connections_) {
    if (!c.evicted) EvictLocked(&c);
  }
  // Their threads end at once (their sockets are shut down).
  mu_.Await(absl::Condition(
      +[](std::map<uint64_t, Connection>* m) { return m->empty(); },
      &connections_));
  if (ssl_ctx_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(ssl_ctx_));
}

}  // namespace attnaudit::server
