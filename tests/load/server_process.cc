#include "tests/load/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace attnaudit::testing {
namespace {

// The port after "msg=\"<what> listening\" addr=127.0.0.1:" in the log.
int PortIn(const std::string& log, const std::string& what) {
  const std::string key =
      absl::StrCat("msg=\"", what, " listening\" addr=127.0.0.1:");
  const size_t at = log.rfind(key);
  if (at == std::string::npos) return 0;
  int port = 0;
  const std::string rest = log.substr(at + key.size(), 6);
  absl::SimpleAtoi(rest.substr(0, rest.find_first_not_of("0123456789")), &port);
  return port;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    std::vector<std::string> flags, const std::string& log_path,
    absl::Duration timeout) {
  const char* bin = std::getenv("ATTNAUDIT_SERVER_BIN");
  if (bin == nullptr) {
    return absl::FailedPreconditionError(
        "ATTNAUDIT_SERVER_BIN is not set (ctest sets it)");
  }
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  p->log_path_ = log_path;
  flags.insert(flags.begin(),
               {"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"});
  std::vector<std::string> args = {bin};
  args.insert(args.end(), flags.begin(), flags.end());
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd = ::open(log_path.c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) ::dup2(fd, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin, argv.data());
    ::_exit(127);
  }
  p->pid_ = pid;
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    const std::string log = ReadFile(log_path);
    p->grpc_port_ = PortIn(log, "grpc");
    p->metrics_port_ = PortIn(log, "metrics");
    if (p->grpc_port_ > 0 && p->metrics_port_ > 0) return p;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      p->reaped_ = true;
      return absl::InternalError(
          absl::StrCat("the server exited at start:\n", log));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the server did not log its ports:\n", ReadFile(log_path)));
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

std::string ServerProcess::address() const {
  return absl::StrCat("127.0.0.1:", grpc_port_);
}

int64_t ServerProcess::StatusField(const char* field) const {
  std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) != 0) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int64_t kb = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb << 10;
  }
  return -1;
}

int64_t ServerProcess::RssBytes() const { return StatusField("VmRSS:"); }
int64_t ServerProcess::PeakRssBytes() const { return StatusField("VmHWM:"); }

void ServerProcess::Signal(int signal) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, signal);
}

int ServerProcess::Wait(absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (!reaped_) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (absl::Now() > until) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

absl::StatusOr<std::string> ServerProcess::Scrape(const std::string& token,
                                                  bool with_head) const {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in a;
  std::memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(metrics_port_));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string request = absl::StrCat(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n",
        token.empty() ? ""
                      : absl::StrCat("Authorization: Bearer ", token, "\r\n"),
        "\r\n");
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) {
        response.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::UnavailableError("no response");
  return with_head ? response : response.substr(body + 4);
}

std::string ServerProcess::Log() const { return ReadFile(log_path_); }

double MetricValue(const std::string& scrape, const std::string& name,
                   const std::string& labels) {
  const std::string key = labels.empty()
                              ? absl::StrCat(name, " ")
                              : absl::StrCat(name, "{", labels, "} ");
  std::istringstream in(scrape);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(key.size()), &v)) return v;
  }
  return 0;
}

}  // namespace attnaudit::testing
