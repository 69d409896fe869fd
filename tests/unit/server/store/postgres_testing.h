// Test helper: fresh databases on the throwaway PostgreSQL cluster a test
// runs in. CTest starts such tests under pg_virtualenv (postgresql-common),
// which creates a cluster on a free loopback port, exports PGHOST, PGPORT,
// PGUSER and PGPASSWORD, and drops the cluster when the test exits; libpq
// reads those for every part a URL leaves out.
#ifndef ATTNAUDIT_TESTS_UNIT_SERVER_STORE_POSTGRES_TESTING_H_
#define ATTNAUDIT_TESTS_UNIT_SERVER_STORE_POSTGRES_TESTING_H_

#include <string>

#include "absl/status/statusor.h"

namespace attnaudit::testing {

// Whether the environment names a cluster (PGHOST is set). Tests skip,
// saying so, when it does not: run them under `pg_virtualenv`.
bool PostgresAvailable();
inline constexpr const char* kNoPostgres =
    "no PostgreSQL cluster: PGHOST is unset (ctest runs this test under "
    "pg_virtualenv; run it the same way by hand)";

// Creates an empty database with a unique name and returns its URL
// ("postgresql:///NAME": host, port and user from the environment).
absl::StatusOr<std::string> FreshPostgresDatabase();

// Runs one SQL statement on `url` (tests that tamper with a schema).
absl::Status RunPostgresSql(const std::string& url, const std::string& sql);

}  // namespace attnaudit::testing

#endif  // ATTNAUDIT_TESTS_UNIT_SERVER_STORE_POSTGRES_TESTING_H_
