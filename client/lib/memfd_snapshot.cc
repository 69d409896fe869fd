#include "client/lib/memfd_snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/codec/aligned_writer.h"
#include "proto/codec/codec.h"
#include "transport/boot_id/boot_id.h"

namespace attnaudit::client {
namespace {

absl::Status SystemError(const char* call) {
  return absl::InternalError(absl::StrCat(call, ": ", strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemfdSnapshot>> MemfdSnapshot::Create(
    const Snapshot& snapshot) {
  const int fd =
      ::memfd_create("attnaudit-snapshot", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SystemError("memfd_create");
  std::unique_ptr<MemfdSnapshot> memfd(new MemfdSnapshot(fd));
  struct stat st;
  if (::fstat(fd, &st) != 0) return SystemError("fstat");
  memfd->inode_ = static_cast<uint64_t>(st.st_ino);
  absl::StatusOr<std::string> boot_id = ReadBootId();
  if (!boot_id.ok()) return boot_id.status();
  memfd->boot_id_ = *std::move(boot_id);
  if (absl::Status s = memfd->Write(snapshot); !s.ok()) return s;
  // The server maps the memfd; one that could shrink under the mapping
  // would fault the server, so it refuses memfds without this seal.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return SystemError("fcntl(F_ADD_SEALS)");
  }
  return memfd;
}

MemfdSnapshot::~MemfdSnapshot() { ::close(fd_); }

absl::Status MemfdSnapshot::Write(const Snapshot& snapshot) {
  v1::Snapshot msg;
  SnapshotToProto(snapshot, &msg);
  const size_t n = AlignedByteSize(msg);
  if (n > static_cast<size_t>(kMaxSnapshotFileBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the snapshot encodes to ", n,
                     " bytes, over the 2 GiB limit of one message"));
  }
  const int64_t bytes = static_cast<int64_t>(n);
  if (bytes > size_) {
    if (::ftruncate(fd_, bytes) != 0) return SystemError("ftruncate");
    size_ = bytes;
  }
  void* mapped = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (mapped == MAP_FAILED) return SystemError("mmap");
  bool written = false;
  {
    google::protobuf::io::ArrayOutputStream array(mapped, static_cast<int>(n));
    google::protobuf::io::CodedOutputStream coded(&array);
    written = WriteAligned(msg, &coded) && !coded.HadError();
  }
  ::munmap(mapped, n);
  if (!written) return absl::InternalError("encoding the snapshot failed");
  bytes_ = bytes;
  return absl::OkStatus();
}

void MemfdSnapshot::Describe(v1::AuditRequest* request) const {
  request->clear_snapshot();
  v1::MemfdSnapshot* ref = request->mutable_snapshot_memfd();
  ref->set_path(absl::StrCat("/proc/", ::getpid(), "/fd/", fd_));
  ref->set_bytes(bytes_);
  ref->set_boot_id(boot_id_);
  ref->set_inode(inode_);
}

}  // namespace attnaudit::client
