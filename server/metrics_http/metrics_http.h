// MetricsHttpServer: the /metrics endpoint, over HTTP or HTTPS, optionally
// behind a bearer token (Prometheus `authorization` and `tls_config`).
//
// Why not prometheus-cpp's exposer (civetweb): it offers only HTTP Basic
// auth, Debian's civetweb gets TLS by loading "libssl.so" at run time (a
// file only libssl-dev installs), and its few worker threads are held by
// idle connections, so a handful of clients that connect and send nothing
// starve every scrape. Nor cpp-httplib (Debian 12 ships 0.11 as
// libcpp-httplib-dev), which would bring HTTPS and the request parsing: its
// server hands every accepted connection to a pool of max(8, cores - 1)
// threads, each blocking on the request with a timeout per read (a
// trickled head renews it), and offers no hook at accept to bound or
// evict connections, so eight idle clients hold every worker the same way.
// This server is built so that cannot happen:
//
//   - one accept thread and one short-lived thread per connection;
//   - a connection must finish its TLS handshake and request head within
//     `header_timeout` (total, not per read) or it is closed; the response
//     must be written within `io_timeout` (total), and once answered a
//     connection lingers (reading what the client still sends, so the
//     close does not reset the response away) for `drain_timeout` at most,
//     however the client trickles, then is closed;
//   - at `max_connections`, or at `max_connections_per_source` from one
//     peer address, a new connection is not refused: an older one is
//     closed instead, taken from the source at its limit (or else from the
//     source that holds the most): first one already answered (lingering),
//     then one still waiting for its head, then one being answered, oldest
//     first. A scraper sends its head at once and reads its answer at
//     once, so lingering, idle or slow connections -- from other addresses
//     or from the scraper's own (a proxy) -- can only push out each other
//     (answered connections that trickle a byte every few seconds would
//     otherwise hold their slots and starve every scrape);
//   - GET or HEAD /metrics only: 200 with the text exposition format; a
//     missing or wrong token 401 (WWW-Authenticate: Bearer); other paths
//     404, other methods 405, an incomplete head 400.
//
// The token is compared as a SHA-256 digest in constant time and never
// logged or echoed. Errors of Start name the flag (--metrics-listen,
// --metrics-tls-cert, --metrics-token-file); a port in use is UNAVAILABLE.
// Thread safety: Start and the destructor from one thread; `render` is
// called from connection threads, possibly at once. The destructor closes
// every connection and waits for their threads.
#ifndef ATTNAUDIT_SERVER_METRICS_HTTP_METRICS_HTTP_H_
#define ATTNAUDIT_SERVER_METRICS_HTTP_METRICS_HTTP_H_

#include <cstdint>
#include <functional>
#include <map>
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
  // Connections held at once, in total and from one peer address.
  int max_connections = 256;
  int max_connections_per_source = 64;
  // Handshake + request head, from accept.
  absl::Duration header_timeout = absl::Seconds(3);
  // Writing the response (total).
  absl::Duration io_timeout = absl::Seconds(10);
  // Lingering after the response (total).
  absl::Duration drain_timeout = absl::Seconds(1);
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
  // Connections closed to make room for others or past header_timeout.
  int64_t evicted() const;
  // Connections held now.
  int connections() const;

 private:
  struct Request;
  // Where a connection is; eviction takes the earliest stage first.
  enum class Stage { kDraining = 0, kReading = 1, kWriting = 2 };
  // One accepted connection. Its thread closes `fd` only after erasing
  // the connection under mu_, so the accept thread may shut down the fd
  // of any connection it finds (eviction, header timeout) at any stage.
  struct Connection {
    int fd = -1;
    std::string source;  // peer address without port
    absl::Time accepted;
    Stage stage = Stage::kReading;  // handshake or request head first
    bool evicted = false;
  };
  MetricsHttpServer(MetricsHttpOptions options, Render render)
      : options_(std::move(options)), render_(std::move(render)) {}
  absl::Status Listen();
  absl::Status LoadTls();
  void AcceptLoop();
  // Makes room for a connection from `source` (see the file comment).
  void MakeRoomLocked(const std::string& source)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shuts down connections still reading past header_timeout.
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Serve(uint64_t id, int fd);
  void SetStage(uint64_t id, Stage stage);
  // The request a head holds (complete: a whole head arrived).
  static Request ParseRequest(const std::string& head);
  // The response to one request head.
  std::string Respond(const Request& request) const;

  const MetricsHttpOptions options_;
  const Render render_;
  std::string token_digest_;  // SHA-256 of the token; empty: no token
  void* ssl_ctx_ = nullptr;   // SSL_CTX*
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Connection> connections_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_METRICS_HTTP_METRICS_HTTP_H_
