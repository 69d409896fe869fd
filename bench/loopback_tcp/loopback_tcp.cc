// loopback_tcp: the raw loopback TCP transfer rate on this machine, the
// ceiling the service's ingest (bytes of snapshot per second over gRPC) is
// compared against in docs/PERF.md.
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

bool ParseInt(const char* s, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || end == s) return false;
  // Accept K/M/G suffixes (binary).
  int64_t mul = 1;
  if (*end == 'K' || *end == 'k')
    mul = int64_t{1} << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    mul = int64_t{1} << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    mul = int64_t{1} << 30, ++end;
  if (*end != '\0' || v < 0) return false;
  *out = static_cast<int64_t>(v) * mul;
  return true;
}

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

// One transfer of opts.bytes over a fresh connection.
Result RunOnce(const Options& opts) {
  Result result;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) {
    result.error = std::string("socket: ") + std::strerror(errno);
    return result;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    result.error = std::string("bind/listen: ") + std::strerror(errno);
    close(lfd);
    return result;
  }
  SetTimeouts(lfd);

  std::atomic<bool> receiver_ok{false};
  std::string receiver_error;
  std::chrono::steady_clock::time_point first, last;
  int64_t received = 0;
  std::thread receiver([&] {
    int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) {
      receiver_error = std::string("accept: ") + std::strerror(errno);
      return;
    }
    SetTimeouts(fd);
    std::vector<char> buf(static_cast<size_t>(opts.chunk));
    std::vector<char> dest;
    const int64_t dest_size = std::min<int64_t>(opts.bytes, int64_t{1} << 30);
    if (opts.copy) dest.resize(static_cast<size_t>(dest_size));
    bool started = false;
    while (received < opts.bytes) {
      ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        receiver_error = n == 0 ? "peer closed early"
                                : std::string("recv: ") + std::strerror(errno);
        close(fd);
        return;
      }
      if (!started) {
        first = std::chrono::steady_clock::now();
        started = true;
      }
      if (opts.copy) {
        int64_t off = received % dest_size;
        int64_t take = std::min<int64_t>(n, dest_size - off);
        std::memcpy(dest.data() + off, buf.data(), static_cast<size_t>(take));
        if (take < n) {
          std::memcpy(dest.data(), buf.data() + take,
                      static_cast<size_t>(n - take));
        }
      }
      received += n;
    }
    last = std::chrono::steady_clock::now();
    close(fd);
    receiver_ok = true;
  });

  int cfd = socket(AF_INET, SOCK_STREAM, 0);
  bool sent_ok = false;
  if (cfd >= 0) {
    SetTimeouts(cfd);
    if (connect(cfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      std::vector<char> src(static_cast<size_t>(opts.chunk), '\x5a');
      int64_t sent = 0;
      sent_ok = true;
      while (sent < opts.bytes) {
        size_t want = static_cast<size_t>(
            std::min<int64_t>(opts.chunk, opts.bytes - sent));
        ssize_t n = send(cfd, src.data(), want, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          result.error = std::string("send: ") + std::strerror(errno);
          sent_ok = false;
          break;
        }
        sent += n;
      }
    } else {
      result.error = std::string("connect: ") + std::strerror(errno);
    }
    close(cfd);
  } else {
    result.error = std::string("socket: ") + std::strerror(errno);
  }
  // A failed connect leaves the receiver in accept() until its timeout.
  receiver.join();
  close(lfd);
  if (!sent_ok) return result;
  if (!receiver_ok) {
    result.error = receiver_error;
    return result;
  }
  result.ok = true;
  result.received = received;
  result.seconds = std::chrono::duration<double>(last - first).count();
  return result;
}

void Usage() {
  std::fprintf(stderr,
               "usage: loopback_tcp [--bytes N[K|M|G]] (default 2G, max 64G)\n"
               "                    [--chunk N[K|M|G]] (default 4M)\n"
               "                    [--repeat N] (default 3, max 100)\n"
               "                    [--copy] (also copy into a buffer)\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](int64_t* out) {
      if (i + 1 >= argc || !ParseInt(argv[i + 1], out)) return false;
      ++i;
      return true;
    };
    int64_t v = 0;
    if (a == "--bytes" && value(&v)) {
      opts.bytes = v;
    } else if (a == "--chunk" && value(&v)) {
      opts.chunk = v;
    } else if (a == "--repeat" && value(&v)) {
      opts.repeat = static_cast<int>(std::min<int64_t>(v, 100));
    } else if (a == "--copy") {
      opts.copy = true;
    } else {
      Usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (opts.bytes <= 0 || opts.bytes > kMaxBytes || opts.chunk <= 0 ||
      opts.chunk > kMaxChunk || opts.repeat <= 0) {
    std::fprintf(stderr,
                 "loopback_tcp: --bytes must be in (0, 64G], "
                 "--chunk in (0, 256M], --repeat > 0\n");
    return 2;
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
