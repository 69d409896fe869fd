#include "tests/unit/server/store/postgres_testing.h"

#include <libpq-fe.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnaudit::testing {

bool PostgresAvailable() { return getenv("PGHOST") != nullptr; }

absl::Status RunPostgresSql(const std::string& url, const std::string& sql) {
  PGconn* conn = PQconnectdb(url.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("connect ", url, ": ", PQerrorMessage(conn)));
    PQfinish(conn);
    return s;
  }
  PGresult* r = PQexec(conn, sql.c_str());
  const ExecStatusType st = PQresultStatus(r);
  absl::Status s = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK
                       ? absl::OkStatus()
                       : absl::InternalError(
                             absl::StrCat(sql, ": ", PQresultErrorMessage(r)));
  PQclear(r);
  PQfinish(conn);
  return s;
}

absl::StatusOr<std::string> FreshPostgresDatabase() {
  if (!PostgresAvailable()) return absl::FailedPreconditionError(kNoPostgres);
  static std::atomic<int> counter{0};
  const std::string name =
      absl::StrCat("attnaudit_test_", getpid(), "_", counter.fetch_add(1));
  absl::Status s = RunPostgresSql("postgresql:///postgres",
                                  absl::StrCat("CREATE DATABASE ", name));
  if (!s.ok()) return s;
  return absl::StrCat("postgresql:///", name);
}

}  // namespace attnaudit::testing
