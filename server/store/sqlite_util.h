// Internal: a thin RAII wrapper over sqlite3 prepared statements, turning
// SQLite errors into absl::Status ("results.db: <what>: <sqlite message>").
// Not thread-safe; ResultStore serialises all use with its mutex.
#ifndef ATTNAUDIT_SERVER_STORE_SQLITE_UTIL_H_
#define ATTNAUDIT_SERVER_STORE_SQLITE_UTIL_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attnaudit::server {
namespace store_internal {

inline absl::Status Error(sqlite3* db, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("results.db: ", what, ": ", sqlite3_errmsg(db)));
}

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  // The prepare error, if any; check before binding.
  absl::Status status() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : Error(db_, "prepare");
  }

  // Binds are 1-based like SQLite's. Errors surface in Step().
  Stmt& Bind(int i, int64_t v) {
    Check(sqlite3_bind_int64(stmt_, i, v));
    return *this;
  }
  Stmt& Bind(int i, absl::string_view v) {
    Check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& BindBlob(int i, absl::string_view v) {
    // An empty string must still be a zero-length blob, not NULL.
    Check(sqlite3_bind_blob64(stmt_, i, v.empty() ? "" : v.data(), v.size(),
                              SQLITE_TRANSIENT));
    return *this;
  }

  // Back to before the first step, bindings cleared: the statement runs
  // again with new values.
  Stmt& Reset() {
    if (stmt_ != nullptr) {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
    }
    return *this;
  }

  // One step: true when a row is available, false when done.
  absl::StatusOr<bool> Step() {
    if (rc_ != SQLITE_OK) return Error(db_, "prepare/bind");
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return Error(db_, "step");
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p), n);
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p), n);
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && rc_ == SQLITE_OK) rc_ = rc;
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

}  // namespace store_internal
}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_STORE_SQLITE_UTIL_H_
