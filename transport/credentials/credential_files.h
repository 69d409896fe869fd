// The files behind the transport's credentials, read the same way by the
// server (--tls-cert, --tls-key, --tls-client-ca, --auth-token-file) and
// the client (--tls-ca, --tls-cert, --tls-key, --auth-token-file).
//
// In transport/, which client and server both depend on: the client must
// not depend on the server, and core does no I/O. Errors are
// InvalidArgument naming the flag and the path, never the file's contents
// (tokens stay out of messages and logs).
// Thread-safe (plain functions).
#ifndef ATTNAUDIT_TRANSPORT_CREDENTIALS_CREDENTIAL_FILES_H_
#define ATTNAUDIT_TRANSPORT_CREDENTIALS_CREDENTIAL_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnaudit {

// The whole PEM file (a certificate chain, a private key or a CA bundle).
// "--tls-cert: cannot read PATH" / "--tls-cert: PATH is empty".
absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path);

// A bearer token file: its first line without surrounding whitespace.
// "--auth-token-file: cannot read PATH" / "...: PATH holds no token".
absl::StatusOr<std::string> ReadTokenFile(absl::string_view flag,
                                          const std::string& path);

}  // namespace attnaudit

#endif  // ATTNAUDIT_TRANSPORT_CREDENTIALS_CREDENTIAL_FILES_H_
