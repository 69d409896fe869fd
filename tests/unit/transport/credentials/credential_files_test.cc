// Credential files: PEM files are read whole, token files trimmed to their
// first line; errors name the flag and the path but never the contents.
#include "transport/credentials/credential_files.h"

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  return path;
}

TEST(CredentialFilesTest, PemFileIsReadWhole) {
  const std::string pem =
      "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  absl::StatusOr<std::string> read =
      ReadPemFile("tls-cert", WriteTemp("cert.pem", pem));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, pem);
}

TEST(CredentialFilesTest, PemErrorsNameFlagAndPath) {
  const std::string empty = WriteTemp("empty.pem", "");
  absl::StatusOr<std::string> none = ReadPemFile("tls-key", empty);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(), "--tls-key: " + empty + " is empty");
  const std::string missing = ::testing::TempDir() + "/missing.pem";
  absl::StatusOr<std::string> gone = ReadPemFile("tls-ca", missing);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().message(), "--tls-ca: cannot read " + missing);
}

TEST(CredentialFilesTest, TokenFileIsTrimmedAndMustHoldAToken) {
  absl::StatusOr<std::string> token = ReadTokenFile(
      "auth-token-file", WriteTemp("token_good", "  s3cret \nsecond line\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
  absl::StatusOr<std::string> none =
      ReadTokenFile("auth-token-file", WriteTemp("token_empty", " \n"));
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::StartsWith(none.status().message(), "--auth-token-file"));
  EXPECT_TRUE(absl::EndsWith(none.status().message(), "holds no token"));
  absl::StatusOr<std::string> gone =
      ReadTokenFile("auth-token-file", ::testing::TempDir() + "/missing_token");
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "cannot read"));
}

TEST(CredentialFilesTest, ErrorsNeverEchoTheContents) {
  // A file that is only whitespace around nothing, and one whose first
  // line is blank but whose second holds a secret: neither message may
  // carry the secret.
  absl::StatusOr<std::string> blank_first = ReadTokenFile(
      "auth-token-file", WriteTemp("token_blank_first", "\nsup3rsecret\n"));
  ASSERT_FALSE(blank_first.ok());
  EXPECT_FALSE(absl::StrContains(blank_first.status().message(), "sup3r"));
}

}  // namespace
}  // namespace attnaudit
