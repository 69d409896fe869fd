// The token file: principals, permissions, quotas, the legacy one-token
// form, errors that name the line but never a secret, certificate
// identities, and reloads that keep the old table when the new file is bad.
#include "server/auth/tenants.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr TenantQuota kDefaultQuota{/*max_jobs=*/7, /*max_bytes=*/1024};

Credentials Bearer(const std::string& token) {
  Credentials c;
  c.authorization = "Bearer " + token;
  return c;
}

Credentials Cert(std::vector<std::string> identities) {
  Credentials c;
  c.certificate_identities = std::move(identities);
  return c;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/tenants_test_", name);
  std::ofstream(path) << text;
  return path;
}

TEST(TenantTableTest, ParsesPrincipalsPermissionsAndQuotas) {
  absl::StatusOr<TenantTable> t = TenantTable::Parse(
      "# comment\n"
      "\n"
      "token:aaa   fleet-a  audit,submit,read,cancel  max_jobs=3 "
      "max_bytes=2MiB\n"
      "token:bbb\tfleet-a\tread\n"
      "token:ops   ops      admin\n"
      "cert:b.example  fleet-b  submit,read_all\n",
      kDefaultQuota);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokens(), 3u);
  EXPECT_EQ(t->certificates(), 1u);
  const Principal* a = t->FindToken("aaa");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->tenant, "fleet-a");
  EXPECT_TRUE(a->Has(kPermAudit));
  EXPECT_TRUE(a->Has(kPermCancel));
  EXPECT_FALSE(a->Has(kPermReadAll));
  EXPECT_FALSE(a->ReadsAll());
  EXPECT_EQ(a->quota.max_jobs, 3);
  EXPECT_EQ(a->quota.max_bytes, 2 << 20);
  // The second fleet-a token shares the tenant's quota.
  const Principal* b = t->FindToken("bbb");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->quota.max_jobs, 3);
  EXPECT_FALSE(b->Has(kPermSubmit));
  const Principal* ops = t->FindToken("ops");
  ASSERT_NE(ops, nullptr);
  EXPECT_TRUE(ops->Has(kPermSubmit));
  EXPECT_TRUE(ops->ReadsAll());
  EXPECT_TRUE(ops->CancelsAll());
  EXPECT_EQ(ops->quota.max_jobs, kDefaultQuota.max_jobs);
  EXPECT_EQ(t->FindToken("aab"), nullptr);
  EXPECT_EQ(t->FindToken(""), nullptr);

  absl::optional<Principal> cert = t->FindCertificate({"x", "b.example"});
  ASSERT_TRUE(cert.has_value());
  EXPECT_EQ(cert->tenant, "fleet-b");
  EXPECT_TRUE(cert->ReadsAll());
  EXPECT_FALSE(cert->CancelsAll());
  EXPECT_FALSE(t->FindCertificate({"c.example"}).has_value());
}

TEST(TenantTableTest, LegacySingleTokenIsTheDefaultTenantWithEverything) {
  absl::StatusOr<TenantTable> t =
      TenantTable::Parse("  s3cret-token  \n", kDefaultQuota);
  ASSERT_TRUE(t.ok()) << t.status();
  const Principal* p = t->FindToken("s3cret-token");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->tenant, kDefaultTenant);
  EXPECT_EQ(p->permissions, kAllPermissions);
}

TEST(TenantTableTest, AnyCertificateBecomesItsOwnTenant) {
  absl::StatusOr<TenantTable> t = TenantTable::Parse(
      "cert:admin.example ops admin\ncert:* * audit,read\n", kDefaultQuota);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::optional<Principal> p = t->FindCertificate({"spiffe://x/fleet-c"});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->tenant, "cert:spiffe://x/fleet-c");
  EXPECT_TRUE(p->Has(kPermAudit));
  EXPECT_FALSE(p->Has(kPermSubmit));
  EXPECT_EQ(t->FindCertificate({"admin.example"})->tenant, "ops");
  // An identity that is not a valid tenant name matches nothing.
  EXPECT_FALSE(t->FindCertificate({"has space"}).has_value());
  EXPECT_FALSE(t->FindCertificate({}).has_value());
}

// A certificate named like a token tenant must not become that tenant
// (it would read the tenant's results); a line can still share a
// certificate tenant by naming it.
TEST(TenantTableTest, CertificateTenantsNeverTakeATokenTenantsName) {
  absl::StatusOr<TenantTable> t = TenantTable::Parse(
      "token:aaa fleet-a audit,read\n"
      "token:bbb cert:shared.example read\n"
      "cert:* * read\n",
      kDefaultQuota);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::optional<Principal> squatter = t->FindCertificate({"fleet-a"});
  ASSERT_TRUE(squatter.has_value());
  EXPECT_EQ(squatter->tenant, "cert:fleet-a");
  EXPECT_NE(squatter->tenant, t->FindToken("aaa")->tenant);
  EXPECT_EQ(t->FindCertificate({"shared.example"})->tenant,
            t->FindToken("bbb")->tenant);
  // Identities too long for a tenant name once prefixed match nothing.
  EXPECT_TRUE(t->FindCertificate({std::string(123, 'x')}).has_value());
  EXPECT_FALSE(t->FindCertificate({std::string(124, 'x')}).has_value());
}

TEST(TenantTableTest, ErrorsNameTheLineButNeverTheSecret) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& c : {
           Case{"token:abc fleet-a\n", "line 1: expected token:SECRET"},
           Case{"# x\ntoken:abc fleet-a reed\n",
                "line 2: unknown permission \"reed\""},
           Case{"abc fleet-a audit\n", "line 1: the first field must start"},
           Case{"token:abc bad|name audit\n", "line 1: tenant:"},
           Case{"token:abc * audit\n", "line 1: tenant \"*\""},
           Case{"token:abc a audit max_jobs=-1\n", "line 1: max_jobs"},
           Case{"token:abc a audit max_bytes=lots\n", "line 1: max_bytes"},
           Case{"token:abc a audit color=red\n", "line 1: expected max_jobs"},
           Case{"token:abc a audit\ntoken:abc b read\n",
                "line 2: the same token is listed twice"},
           Case{"token:abc a audit max_jobs=1\ntoken:def a read max_jobs=2\n",
                "line 2: tenant a has other quotas on line 1"},
           Case{"token: a audit\n", "line 1: empty token"},
           Case{"# only comments\n", "no token: or cert: line"},
       }) {
    absl::StatusOr<TenantTable> t = TenantTable::Parse(c.text, kDefaultQuota);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.error)) << c.text;
    EXPECT_THAT(t.status().message(), Not(HasSubstr("abc"))) << c.text;
  }
}

TEST(AuthenticatorTest, WithoutATokenFileEveryoneIsTheDefaultTenant) {
  auto auth = Authenticator::Create("", kDefaultQuota);
  ASSERT_TRUE(auth.ok());
  EXPECT_FALSE((*auth)->enabled());
  absl::StatusOr<Principal> p = (*auth)->Authenticate(Credentials{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->tenant, kDefaultTenant);
  EXPECT_EQ(p->permissions, kAllPermissions);
  EXPECT_EQ(p->quota.max_jobs, kDefaultQuota.max_jobs);
  EXPECT_TRUE((*auth)->Authenticate(Bearer("anything")).ok());
}

TEST(AuthenticatorTest, AuthenticatesTokensAndCertificates) {
  const std::string path = WriteFile(
      "auth", "token:t1 fleet-a audit\ncert:c.example fleet-c read\n");
  auto auth = Authenticator::Create(path, kDefaultQuota);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->principals(), 2u);
  EXPECT_EQ((*auth)->Authenticate(Bearer("t1"))->tenant, "fleet-a");
  Credentials lower;
  lower.authorization = "bearer t1";  // the scheme is case-insensitive
  EXPECT_TRUE((*auth)->Authenticate(lower).ok());

  const absl::Status wrong = (*auth)->Authenticate(Bearer("t2")).status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.message(), Not(HasSubstr("t2")));
  Credentials basic;
  basic.authorization = "Basic dDE=";
  EXPECT_EQ((*auth)->Authenticate(basic).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_THAT((*auth)->Authenticate(Credentials{}).status().message(),
              HasSubstr("missing"));

  EXPECT_EQ((*auth)->Authenticate(Cert({"c.example"}))->tenant, "fleet-c");
  EXPECT_EQ((*auth)->Authenticate(Cert({"d.example"})).status().code(),
            absl::StatusCode::kUnauthenticated);
  // A token, when sent, decides, even with a listed certificate.
  Credentials both = Cert({"c.example"});
  both.authorization = "Bearer t1";
  EXPECT_EQ((*auth)->Authenticate(both)->tenant, "fleet-a");
  both.authorization = "Bearer nope";
  EXPECT_FALSE((*auth)->Authenticate(both).ok());
}

TEST(AuthenticatorTest, ReloadSwapsTheTableAndKeepsItWhenTheFileIsBad) {
  const std::string path = WriteFile("reload", "token:old a audit\n");
  auto auth = Authenticator::Create(path, kDefaultQuota);
  ASSERT_TRUE(auth.ok()) << auth.status();
  ASSERT_TRUE((*auth)->Authenticate(Bearer("old")).ok());

  WriteFile("reload", "token:new a audit\n");
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_FALSE((*auth)->Authenticate(Bearer("old")).ok());
  EXPECT_TRUE((*auth)->Authenticate(Bearer("new")).ok());

  WriteFile("reload", "token:newer a nonsense\n");
  const absl::Status bad = (*auth)->Reload();
  EXPECT_THAT(bad.message(), HasSubstr("--auth-token-file"));
  EXPECT_THAT(bad.message(), HasSubstr("line 1"));
  EXPECT_TRUE((*auth)->Authenticate(Bearer("new")).ok());  // still in force
  std::remove(path.c_str());
  EXPECT_THAT((*auth)->Reload().message(), HasSubstr("cannot read"));
  EXPECT_TRUE((*auth)->Authenticate(Bearer("new")).ok());
}

TEST(AuthenticatorTest, MissingFileAtStartIsAnErrorNamingTheFlag) {
  auto auth = Authenticator::Create("/nonexistent/tokens", kDefaultQuota);
  EXPECT_THAT(auth.status().message(), HasSubstr("--auth-token-file"));
}

}  // namespace
}  // namespace attnaudit::server
