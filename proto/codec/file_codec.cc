// Snapshot files (binary attnaudit.v1.Snapshot, written atomically) and
// report JSON.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/tensor/dtype.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/util/json_util.h"
#include "proto/codec/aligned_writer.h"
#include "proto/codec/codec.h"
#include "proto/codec/tensor_data.h"
#include "proto/codec/tensor_paths.h"

namespace attnaudit {
namespace {

// Read/write block of the file streams: large enough that a few hundred MiB
// file costs a few hundred syscalls, not tens of thousands.
constexpr int kIoBlockBytes = 1 << 20;

absl::Status ErrnoError(int error, const std::string& path,
                        absl::string_view what) {
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": ", what));
}

// Closes a file descriptor on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  // Closes now and reports close()'s errno (0 on success).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Unique within the process and across processes (pid) writing the same
// directory.
std::string TempPath(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(path, ".tmp.", ::getpid(), ".",
                      counter.fetch_add(1, std::memory_order_relaxed));
}

absl::Status WriteAndSync(const v1::Snapshot& msg, const std::string& tmp) {
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, tmp, "cannot create");
  FdCloser closer(fd);
  {
    google::protobuf::io::FileOutputStream out(fd, kIoBlockBytes);
    bool serialized = false;
    {
      google::protobuf::io::CodedOutputStream coded(&out);
      serialized = WriteAligned(msg, &coded);
    }  // the coded stream hands its buffer back to `out` here
    const bool flushed = out.Flush();
    if (!serialized || !flushed) {
      const int error = out.GetErrno();
      return error != 0 ? ErrnoError(error, tmp, "write failed")
                        : absl::InternalError(
                              absl::StrCat(tmp, ": serialization failed"));
    }
  }
  if (::fsync(fd) != 0) return ErrnoError(errno, tmp, "fsync failed");
  if (const int error = closer.Close(); error != 0) {
    return ErrnoError(error, tmp, "close failed");
  }
  return absl::OkStatus();
}

// Maps the whole file read-only; the mapping lives as long as the returned
// owner (and every tensor viewing it).
absl::StatusOr<std::shared_ptr<const void>> MapFile(int fd, int64_t size,
                                                    const std::string& path) {
  void* mapped =
      ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapped == MAP_FAILED) return ErrnoError(errno, path, "cannot map");
  const size_t length = static_cast<size_t>(size);
  return std::shared_ptr<const void>(mapped, [length](const void* p) {
    ::munmap(const_cast<void*>(p), length);
  });
}

}  // namespace

absl::StatusOr<Snapshot> DecodeMappedSnapshot(
    absl::string_view file, const std::shared_ptr<const void>& owner) {
  const absl::Status corrupt = absl::InvalidArgumentError(
      "not a valid attnaudit.v1.Snapshot (truncated or corrupt protobuf)");
  std::string skeleton;
  std::vector<TensorDataRange> ranges;
  if (!SplitSnapshotTensorData(file, &skeleton, &ranges).ok()) return corrupt;
  v1::Snapshot msg;
  if (!msg.ParseFromString(skeleton)) return corrupt;
  ATTNAUDIT_ASSIGN_OR_RETURN(Snapshot snapshot, SnapshotFromProto(&msg));
  for (const TensorDataRange& range : ranges) {
    Tensor* tensor = MutableSnapshotTensor(&snapshot, range.path);
    if (tensor == nullptr) {
      return absl::InternalError(
          absl::StrCat(range.path, ": a Tensor field the codec does not know"));
    }
    if (!tensor->present()) {
      // As TensorFromProto: data without a dtype is an error, and an empty
      // message is an absent tensor.
      if (range.bytes.empty()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(range.path, ".dtype: must be set"));
    }
    *tensor =
        Tensor::View(tensor->dtype(), tensor->shape(), range.bytes, owner);
    // The core reads elements through typed pointers, which must be
    // naturally aligned; a payload's offset in the file is wherever the
    // protobuf encoding put it. A misaligned one is copied (mutable_bytes
    // turns the view into an owned, aligned buffer).
    const int element = DTypeSize(tensor->dtype());
    if (element > 1 &&
        reinterpret_cast<uintptr_t>(range.bytes.data()) % element != 0) {
      tensor->mutable_bytes();
    }
  }
  return snapshot;
}

absl::StatusOr<Snapshot> ReadSnapshotFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, path, "cannot open");
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, path, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const int64_t size = st.st_size;
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": empty file, not an attnaudit.v1.Snapshot"));
  }
  if (size > kMaxSnapshotFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", size,
        " bytes is over the 2 GiB limit of a snapshot file "
        "(a protobuf message); audit larger snapshots with AuditStream"));
  }

  ATTNAUDIT_ASSIGN_OR_RETURN(std::shared_ptr<const void> mapping,
                             MapFile(fd, size, path));
  const absl::string_view file(static_cast<const char*>(mapping.get()),
                               static_cast<size_t>(size));
  absl::StatusOr<Snapshot> snapshot = DecodeMappedSnapshot(file, mapping);
  if (!snapshot.ok()) {
    return absl::Status(snapshot.status().code(),
                        absl::StrCat(path, ": ", snapshot.status().message()));
  }
  return snapshot;
}

absl::Status WriteSnapshotFile(const std::string& path,
                               const Snapshot& snapshot) {
  v1::Snapshot msg;
  SnapshotToProto(snapshot, &msg);
  const size_t bytes = AlignedByteSize(msg);
  if (bytes > static_cast<size_t>(kMaxSnapshotFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the snapshot encodes to ", bytes,
        " bytes, over the 2 GiB limit of a snapshot file (a protobuf "
        "message)"));
  }
  const std::string tmp = TempPath(path);
  absl::Status status = WriteAndSync(msg, tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, path, "rename failed");
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Make the rename itself durable.
  const std::string dir = DirName(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, dir, "cannot open directory");
  FdCloser dir_closer(dir_fd);
  if (::fsync(dir_fd) != 0) return ErrnoError(errno, dir, "fsync failed");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReportToJson(const AuditReport& report,
                                         bool pretty) {
  v1::AuditReport msg;
  ReportToProto(report, &msg);
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(msg, &json, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "report JSON: ",
        std::string(status.message().data(), status.message().size())));
  }
  return json;
}

}  // namespace attnaudit
