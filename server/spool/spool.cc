#include "server/spool/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/spool/spool_format.h"

namespace attnaudit::server {
namespace {

namespace format = spool_internal;

absl::Status ErrnoStatus(int err, absl::string_view op,
                         absl::string_view path) {
  const std::string msg =
      absl::StrCat(path, ": ", op, " failed: ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Closes a file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the error close() may carry (NFS, quotas).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, const char* data, size_t size,
                      absl::string_view path) {
  while (size > 0) {
    // Linux writes at most ~2 GiB per call.
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::write(fd, data, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes; DataLoss on a short file.
absl::Status ReadExact(int fd, char* data, size_t size,
                       absl::string_view path) {
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::read(fd, data, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (n == 0) return absl::DataLossError(absl::StrCat(path, ": truncated"));
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", dir);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync", dir);
  return absl::OkStatus();
}

uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return v;
}

// Reads and checks one entry file. With payload == nullptr only the header,
// metadata and file size are checked (no CRC) unless verify_crc.
absl::Status ReadEntryFile(const std::string& path, uint64_t max_payload,
                           bool verify_crc, SpoolMetadata* metadata,
                           std::string* payload, int64_t* payload_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", path);
  char head[format::kHeaderBytes];
  if (static_cast<uint64_t>(st.st_size) < sizeof(head)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  absl::Status s = ReadExact(fd.get(), head, sizeof(head), path);
  if (!s.ok()) return s;
  format::Header header;
  s = format::DecodeHeader(absl::string_view(head, sizeof(head)), max_payload,
                           &header);
  if (!s.ok())
    return absl::DataLossError(absl::StrCat(path, ": ", s.message()));
  if (static_cast<uint64_t>(st.st_size) != header.file_bytes()) {
    return absl::DataLossError(
        absl::StrCat(path, ": size ", st.st_size, " != ", header.file_bytes(),
                     " declared (torn or truncated write)"));
  }
  std::string meta(header.metadata_bytes, '\0');
  s = ReadExact(fd.get(), &meta[0], meta.size(), path);
  if (!s.ok()) return s;
  s = format::DecodeMetadata(header.version, meta, metadata);
  if (!s.ok())
    return absl::DataLossError(absl::StrCat(path, ": ", s.message()));
  *payload_bytes = static_cast<int64_t>(header.payload_bytes);
  if (payload == nullptr && !verify_crc) return absl::OkStatus();

  uint32_t crc = Crc32c(0, head, sizeof(head));
  crc = Crc32c(crc, meta.data(), meta.size());
  std::string scratch;
  std::string* body = payload != nullptr ? payload : &scratch;
  // The size matches the file we just measured, so this allocation is
  // bounded by what is on disk (and by max_payload).
  body->resize(header.payload_bytes);
  s = ReadExact(fd.get(), &(*body)[0], body->size(), path);
  if (!s.ok()) return s;
  crc = Crc32c(crc, body->data(), body->size());
  char trailer[format::kTrailerBytes];
  s = ReadExact(fd.get(), trailer, sizeof(trailer), path);
  if (!s.ok()) return s;
  if (LoadU32(trailer) != crc) {
    return absl::DataLossError(absl::StrCat(path, ": CRC-32C mismatch"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobId(absl::string_view job_id) {
  if (job_id.empty() || job_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: must be 1-128 characters, got ", job_id.size()));
  }
  if (job_id[0] == '.') {
    return absl::InvalidArgumentError("job_id: must not start with '.'");
  }
  for (char c : job_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(
          "job_id: only [A-Za-z0-9_.-] characters are allowed");
    }
  }
  return absl::OkStatus();
}

Spool::Spool(std::string dir, const SpoolOptions& options)
    : dir_(std::move(dir)), options_(options) {}

std::string Spool::PathOf(absl::string_view job_id,
                          absl::string_view ext) const {
  return absl::StrCat(dir_, "/", job_id, ext);
}

absl::StatusOr<std::unique_ptr<Spool>> Spool::Open(
    const std::string& data_dir, const SpoolOptions& options) {
  if (data_dir.empty()) return absl::InvalidArgumentError("data_dir: empty");
  if (options.subdir.empty() || options.subdir.find('/') != std::string::npos) {
    return absl::InvalidArgumentError("subdir: one folder name");
  }
  const std::string dir = data_dir + "/" + options.subdir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoStatus(ec.value(), "create_directories", dir);
  }
  std::unique_ptr<Spool> spool(new Spool(dir, options));
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "opendir", dir);
  bool removed_tmp = false;
  {
    absl::MutexLock lock(&spool->mu_);
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (absl::EndsWith(name, ".tmp")) {
        // A Put that crashed before its rename: never acknowledged.
        ::unlink((dir + "/" + name).c_str());
        removed_tmp = true;
      } else if (absl::EndsWith(name, ".job")) {
        struct stat st;
        if (::stat((dir + "/" + name).c_str(), &st) == 0) {
          const std::string id = name.substr(0, name.size() - 4);
          spool->sizes_[id] = st.st_size;
          spool->total_bytes_ += st.st_size;
        }
      }
    }
  }
  ::closedir(d);
  if (removed_tmp && options.sync) {
    absl::Status s = SyncDir(dir);
    if (!s.ok()) return s;
  }
  return spool;
}

absl::Status Spool::Put(absl::string_view job_id, const SpoolMetadata& metadata,
                        absl::string_view payload) {
  absl::Status s = ValidateJobId(job_id);
  if (!s.ok()) return s;
  if (static_cast<int64_t>(payload.size()) > options_.max_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("payload: ", payload.size(),
                                                   " bytes, limit ",
                                                   options_.max_payload_bytes));
  }
  std::string prefix;
  s = spool_internal::EncodePrefix(metadata, payload.size(), &prefix);
  if (!s.ok()) return s;
  const int64_t file_bytes = static_cast<int64_t>(
      prefix.size() + payload.size() + spool_internal::kTrailerBytes);
  const std::string id(job_id);
  {
    absl::MutexLock lock(&mu_);
    if (sizes_.contains(id) || writing_.contains(id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("job_id: ", id, " is already spooled"));
    }
    if (options_.max_total_bytes > 0 &&
        total_bytes_ + file_bytes > options_.max_total_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("spool full: ", total_bytes_, " + ", file_bytes,
                       " bytes > limit ", options_.max_total_bytes));
    }
    total_bytes_ += file_bytes;  // reserved while writing
    writing_.insert(id);
  }

  const std::string tmp = PathOf(id, ".tmp");
  const std::string final_path = PathOf(id, ".job");
  bool renamed = false;
  s = [&]() -> absl::Status {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return ErrnoStatus(errno, "open", tmp);
    uint32_t crc = Crc32c(0, prefix.data(), prefix.size());
    crc = Crc32c(crc, payload.data(), payload.size());
    char trailer[4];
    for (int i = 0; i < 4; ++i) trailer[i] = static_cast<char>(crc >> (8 * i));
    absl::Status w = WriteAll(fd.get(), prefix.data(), prefix.size(), tmp);
    if (w.ok()) w = WriteAll(fd.get(), payload.data(), payload.size(), tmp);
    if (w.ok()) w = WriteAll(fd.get(), trailer, sizeof(trailer), tmp);
    if (!w.ok()) return w;
    if (options_.sync && ::fsync(fd.get()) != 0) {
      return ErrnoStatus(errno, "fsync", tmp);
    }
    if (fd.Close() != 0) return ErrnoStatus(errno, "close", tmp);
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
      return ErrnoStatus(errno, "rename", tmp);
    }
    renamed = true;
    return options_.sync ? SyncDir(dir_) : absl::OkStatus();
  }();

  absl::MutexLock lock(&mu_);
  writing_.erase(id);
  if (!s.ok()) {
    ::unlink((renamed ? final_path : tmp).c_str());
    total_bytes_ -= file_bytes;
    return s;
  }
  sizes_[id] = file_bytes;
  return absl::OkStatus();
}

absl::Status Spool::Quarantine(absl::string_view job_id) {
  const std::string from = PathOf(job_id, ".job");
  const std::string to = PathOf(job_id, ".corrupt");
  const bool moved = ::rename(from.c_str(), to.c_str()) == 0;
  const int err = errno;
  absl::MutexLock lock(&mu_);
  auto it = sizes_.find(std::string(job_id));
  if (it != sizes_.end()) {
    total_bytes_ -= it->second;
    sizes_.erase(it);
  }
  if (!moved && err != ENOENT) return ErrnoStatus(err, "rename", from);
  return absl::OkStatus();
}

absl::StatusOr<SpoolEntry> Spool::Read(absl::string_view job_id) {
  absl::Status s = ValidateJobId(job_id);
  if (!s.ok()) return s;
  SpoolEntry entry;
  entry.job_id = std::string(job_id);
  int64_t payload_bytes = 0;
  s = ReadEntryFile(PathOf(job_id, ".job"), options_.max_payload_bytes,
                    /*verify_crc=*/true, &entry.metadata, &entry.payload,
                    &payload_bytes);
  if (s.code() == absl::StatusCode::kDataLoss) Quarantine(job_id).IgnoreError();
  if (!s.ok()) return s;
  return entry;
}

absl::StatusOr<SpoolMetadata> Spool::ReadMetadata(absl::string_view job_id) {
  absl::Status s = ValidateJobId(job_id);
  if (!s.ok()) return s;
  SpoolMetadata metadata;
  int64_t payload_bytes = 0;
  s = ReadEntryFile(PathOf(job_id, ".job"), options_.max_payload_bytes,
                    /*verify_crc=*/false, &metadata, nullptr, &payload_bytes);
  if (!s.ok()) return s;
  return metadata;
}

absl::StatusOr<std::vector<SpoolListing>> Spool::List(bool verify_crc) {
  std::vector<std::string> ids;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "opendir", dir_);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (absl::EndsWith(name, ".job"))
      ids.push_back(name.substr(0, name.size() - 4));
  }
  ::closedir(d);

  std::vector<SpoolListing> out;
  for (const std::string& id : ids) {
    if (!ValidateJobId(id).ok()) {
      Quarantine(id).IgnoreError();
      continue;
    }
    SpoolListing l;
    l.job_id = id;
    absl::Status s =
        ReadEntryFile(PathOf(id, ".job"), options_.max_payload_bytes,
                      verify_crc, &l.metadata, nullptr, &l.payload_bytes);
    if (s.code() == absl::StatusCode::kDataLoss) {
      Quarantine(id).IgnoreError();
      continue;
    }
    if (s.code() == absl::StatusCode::kNotFound) continue;  // removed meanwhile
    if (!s.ok()) return s;
    out.push_back(std::move(l));
  }
  std::sort(out.begin(), out.end(),
            [](const SpoolListing& a, const SpoolListing& b) {
              if (a.metadata.created != b.metadata.created) {
                return a.metadata.created < b.metadata.created;
              }
              return a.job_id < b.job_id;
            });
  return out;
}

absl::Status Spool::Remove(absl::string_view job_id) {
  absl::Status s = ValidateJobId(job_id);
  if (!s.ok()) return s;
  const std::string path = PathOf(job_id, ".job");
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "unlink", path);
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = sizes_.find(std::string(job_id));
    if (it != sizes_.end()) {
      total_bytes_ -= it->second;
      sizes_.erase(it);
    }
  }
  return options_.sync ? SyncDir(dir_) : absl::OkStatus();
}

bool Spool::Contains(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  return sizes_.contains(std::string(job_id));
}

int64_t Spool::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

}  // namespace attnaudit::server
