// loopback_tcp: the raw loopback TCP transfer rate on this machine, the
// ceiling the service's ingest (bytes of snapshot per second over gRPC) is
// compared against (the journal docs/perf-history.md points to).
//
// A receiver thread accepts one connection on 127.0.0.1 (an ephemeral port)
// and reads into a reusable buffer; the sender writes --bytes in --chunk
// sized writes. The rate is measured at the receiver, from the first byte to
// the last. Loopback only, bounded: --bytes is capped at 64 GiB, sockets have
// 10 s send/receive timeouts, so a stuck transfer ends with an error instead
// of hanging.
//
//   loopback_tcp [--bytes N] [--chunk N] [--repeat N] [--copy]
//
// --copy also memcpy's every received chunk into a destination buffer of the
// same total size modulo 1 GiB, the work a server does when it assembles
// chunks into tensor buffers (closer to what gRPC ingest must do).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kMaxBytes = int64_t{64} << 30;
constexpr int64_t kMaxChunk = int64_t{256} << 20;

struct Options {
  int64_t bytes = int64_t{2} << 30;
  int64_t chunk = int64_t{4} << 20;
  int repeat = 3;
  bool copy = false;
};

void SetTimeouts(int fd) {
  timeval tv{};
  tv.tv_sec = 10;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

struct Result {
  bool ok = false;
  double seconds = 0;
  int64_t received = 0;
  std::string error;
};

std::string Errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// A socket listening on 127.0.0.1 at an ephemeral port (*addr), or -1.
int Listen(sockaddr_in* addr, std::string* error) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) {
    *error = Errno("socket");
    return -1;
  }
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr->sin_port = 0;
  socklen_t len = sizeof(*addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(addr), sizeof(*addr)) != 0 ||
      listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(addr), &len) != 0) {
    *error = Errno("bind/listen");
    close(lfd);
    return -1;
  }
  SetTimeouts(lfd);
  return lfd;
}

// Copies `n` received bytes into the ring `dest` at offset received % size.
void CopyIntoRing(const char* data, int64_t n, int64_t received,
                  std::vector<char>* dest) {
  const int64_t size = static_cast<int64_t>(dest->size());
  const int64_t off = received % size;
  const int64_t take = std::min<int64_t>(n, size - off);
  std::memcpy(dest->data() + off, data, static_cast<size_t>(take));
  if (take < n) {
    std::memcpy(dest->data(), data + take, static_cast<size_t>(n - take));
  }
}

// Accepts one connection and reads opts.bytes; the rate is timed from the
// first byte to the last.
Result Receive(int lfd, const Options& opts) {
  Result result;
  int fd = accept(lfd, nullptr, nullptr);
  if (fd < 0) {
    result.error = Errno("accept");
    return result;
  }
  SetTimeouts(fd);
  std::vector<char> buf(static_cast<size_t>(opts.chunk));
  std::vector<char> dest;
  if (opts.copy) {
    dest.resize(
        static_cast<size_t>(std::min<int64_t>(opts.bytes, int64_t{1} << 30)));
  }
  std::chrono::steady_clock::time_point first;
  while (result.received < opts.bytes) {
    ssize_t n = recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      result.error = n == 0 ? "peer closed early" : Errno("recv");
      close(fd);
      return result;
    }
    if (result.received == 0) first = std::chrono::steady_clock::now();
    if (opts.copy) CopyIntoRing(buf.data(), n, result.received, &dest);
    result.received += n;
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first)
          .count();
  close(fd);
  result.ok = true;
  return result;
}

// Connects to `addr` and writes opts.bytes in opts.chunk writes. Returns
// the error, empty on success.
std::string Send(const sockaddr_in& addr, const Options& opts) {
  int cfd = socket(AF_INET, SOCK_STREAM, 0);
  if (cfd < 0) return Errno("socket");
  SetTimeouts(cfd);
  std::string error;
  if (connect(cfd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    error = Errno("connect");
  }
  std::vector<char> src(static_cast<size_t>(opts.chunk), '\x5a');
  for (int64_t sent = 0; error.empty() && sent < opts.bytes;) {
    const size_t want =
        static_cast<size_t>(std::min<int64_t>(opts.chunk, opts.bytes - sent));
    ssize_t n = send(cfd, src.data(), want, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) error = Errno("send");
    sent += std::max<ssize_t>(n, 0);
  }
  close(cfd);
  return error;
}

// One transfer of opts.bytes over a fresh connection.
Result RunOnce(const Options& opts) {
  Result result;
  sockaddr_in addr;
  int lfd = Listen(&addr, &result.error);
  if (lfd < 0) return result;
  std::thread receiver([&] { result = Receive(lfd, opts); });
  const std::string send_error = Send(addr, opts);
  // A failed connect leaves the receiver in accept() until its timeout.
  receiver.join();
  close(lfd);
  if (!send_error.empty()) {
    result.ok = false;
    result.error = send_error;
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  CLI::App app("raw loopback TCP transfer rate (the ingest ceiling)",
               "loopback_tcp");
  app.add_option("--bytes", opts.bytes, "bytes per transfer (max 64G)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{1}, kMaxBytes))
      ->capture_default_str();
  app.add_option("--chunk", opts.chunk, "bytes per send and recv (max 256M)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{1}, kMaxChunk))
      ->capture_default_str();
  app.add_option("--repeat", opts.repeat, "transfers (best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_flag("--copy", opts.copy,
               "also copy every received chunk into a buffer");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // usage errors exit 2
  }
  double best = 0;
  for (int r = 0; r < opts.repeat; ++r) {
    Result res = RunOnce(opts);
    if (!res.ok) {
      std::fprintf(stderr, "loopback_tcp: %s\n", res.error.c_str());
      return 1;
    }
    const double gbps = res.seconds > 0 ? res.received / res.seconds / 1e9 : 0;
    best = std::max(best, gbps);
    std::printf("run=%d bytes=%lld seconds=%.4f GB/s=%.3f\n", r,
                static_cast<long long>(res.received), res.seconds, gbps);
  }
  std::printf("loopback_tcp best GB/s=%.3f chunk=%lld copy=%s\n", best,
              static_cast<long long>(opts.chunk), opts.copy ? "yes" : "no");
  return 0;
}
