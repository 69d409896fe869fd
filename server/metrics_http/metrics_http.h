// MetricsHttpServer: /metrics over HTTP or HTTPS, optionally behind a
// bearer token, for Prometheus scrapes with `authorization` and
// `tls_config`.
//
// Why not prometheus-cpp's exposer: prometheus-cpp 1.0 serves through
// civetweb, whose only access control is HTTP Basic (Exposer::
// RegisterAuth), and Debian's civetweb gets TLS by loading "libssl.so" at
// run time, a file that exists only where libssl-dev is installed (not in
// a runtime image). attnaudit-server therefore keeps the exposer for plain
// /metrics and uses this small server when TLS or a token is asked for:
//
//   - one accept thread and one short-lived thread per connection, at most
//     `max_connections` at once (more are closed at once);
//   - TLS 1.2+ through OpenSSL; the handshake and the request are bounded
//     by `io_timeout`;
//   - one request per connection (Connection: close), a request head of at
//     most 8 KiB;
//   - GET or HEAD /metrics only: 200 with the text exposition format; a
//     missing or wrong token 401 (WWW-Authenticate: Bearer); other paths
//     404, other methods 405.
//
// The token is compared as a SHA-256 digest in constant time and never
// logged or echoed. Errors of Start name the flag (--metrics-listen,
// --metrics-tls-cert, --metrics-token-file). Thread safety: Start and the
// destructor from one thread; `render` is called from connection threads,
// possibly at once.
#ifndef ATTNAUDIT_SERVER_METRICS_HTTP_METRICS_HTTP_H_
#define ATTNAUDIT_SERVER_METRICS_HTTP_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnaudit::server {

struct MetricsHttpOptions {
  // HOST:PORT. HOST: an IPv4 literal, "localhost", "[v6]", or empty / "*"
  // (every interface). Port 0 picks a free one.
  std::string listen_address = "localhost:9464";
  // PEM certificate chain and key (both or neither): HTTPS.
  std::string tls_cert_file;
  std::string tls_key_file;
  // First line: the bearer token scrapes must send. Empty: none.
  std::string token_file;
  int max_connections = 8;
  absl::Duration io_timeout = absl::Seconds(10);
};

class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;

  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const MetricsHttpOptions& options, Render render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  bool tls() const { return ssl_ctx_ != nullptr; }

 private:
  struct Request;
  MetricsHttpServer(MetricsHttpOptions options, Render render)
      : options_(std::move(options)), render_(std::move(render)) {}
  absl::Status Listen();
  absl::Status LoadTls();
  void AcceptLoop();
  void Serve(int fd);
  // The response to one request head.
  std::string Respond(const Request& request) const;

  const MetricsHttpOptions options_;
  const Render render_;
  std::string token_digest_;  // SHA-256 of the token; empty: no token
  void* ssl_ctx_ = nullptr;   // SSL_CTX*
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  absl::Mutex mu_;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_METRICS_HTTP_METRICS_HTTP_H_
