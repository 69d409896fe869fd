// Every RPC of attnaudit.v1.AuditService, walked from the proto's service
// descriptor, has exactly one row in server/rpc/rpc_methods.h (the
// permission its reactor checks), and every row names an RPC: a method
// added to service.proto without its permission fails here.
#include "server/rpc/rpc_methods.h"

#include <set>
#include <string>

#include "attnaudit/v1/service.pb.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

const google::protobuf::ServiceDescriptor& Service() {
  // Linking service.pb.cc registers the file in the generated pool.
  (void)v1::AuditRequest::descriptor();
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(kRpcServiceName));
  EXPECT_NE(service, nullptr);
  return *service;
}

TEST(RpcMethodsTest, EveryRpcHasOnePermissionEntry) {
  const google::protobuf::ServiceDescriptor& service = Service();
  ASSERT_GT(service.method_count(), 0);
  std::set<std::string> rpcs;
  for (int i = 0; i < service.method_count(); ++i) {
    const std::string& name = service.method(i)->name();
    rpcs.insert(name);
    EXPECT_NE(PermissionOf(name), kNoPermissionEntry)
        << name << " has no row in server/rpc/rpc_methods.h";
  }
  std::set<std::string> rows;
  for (const RpcMethod& m : kRpcMethods) {
    EXPECT_TRUE(rows.insert(m.name).second) << m.name << ": two rows";
    EXPECT_EQ(rpcs.count(m.name), 1u)
        << m.name << " is not an RPC of attnaudit.v1.AuditService";
    EXPECT_EQ(m.permission & ~kAllPermissions, 0u) << m.name;
  }
}

TEST(RpcMethodsTest, AMethodWithoutARowNeedsAPermissionNobodyHas) {
  EXPECT_EQ(PermissionOf("NoSuchMethod"), kNoPermissionEntry);
  EXPECT_EQ(kNoPermissionEntry & kAllPermissions, 0u);
  // The reads and writes of jobs need their permissions; capabilities only
  // an identity.
  EXPECT_EQ(PermissionOf("Submit"), uint32_t{kPermSubmit});
  EXPECT_EQ(PermissionOf("Cancel"), uint32_t{kPermCancel});
  EXPECT_EQ(PermissionOf("GetCapabilities"), 0u);
}

}  // namespace
}  // namespace attnaudit::server
