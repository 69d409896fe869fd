// Two small macros for absl::Status plumbing. Abseil 20220623 (Debian 12)
// ships neither; these are the only definitions in the project.
//
//   ATTNAUDIT_RETURN_IF_ERROR(expr);         // expr yields absl::Status
//   ATTNAUDIT_ASSIGN_OR_RETURN(lhs, expr);   // expr yields absl::StatusOr<T>
#ifndef ATTNAUDIT_CORE_COMMON_STATUS_MACROS_H_
#define ATTNAUDIT_CORE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ATTNAUDIT_RETURN_IF_ERROR(expr)                    \
  do {                                                     \
    const ::absl::Status attnaudit_status_ = (expr);       \
    if (!attnaudit_status_.ok()) return attnaudit_status_; \
  } while (0)

#define ATTNAUDIT_STATUS_CONCAT_INNER_(a, b) a##b
#define ATTNAUDIT_STATUS_CONCAT_(a, b) ATTNAUDIT_STATUS_CONCAT_INNER_(a, b)

#define ATTNAUDIT_ASSIGN_OR_RETURN(lhs, expr) \
  ATTNAUDIT_ASSIGN_OR_RETURN_IMPL_(           \
      ATTNAUDIT_STATUS_CONCAT_(attnaudit_statusor_, __LINE__), lhs, expr)

#define ATTNAUDIT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = std::move(statusor).value()

#endif  // ATTNAUDIT_CORE_COMMON_STATUS_MACROS_H_
