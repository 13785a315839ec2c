#include "infera/server/auth.h"

#include <gtest/gtest.h>

namespace infera::server {
namespace {

TEST(Auth, ConstantTimeEquals) {
  EXPECT_TRUE(constant_time_equals("secret-key", "secret-key"));
  EXPECT_FALSE(constant_time_equals("secret-key", "secret-kez"));
  EXPECT_FALSE(constant_time_equals("secret-key", "secret-key2"));
  EXPECT_FALSE(constant_time_equals("", "x"));
  EXPECT_TRUE(constant_time_equals("", ""));
}

TEST(Auth, FindsKeysAndModelPermissions) {
  ApiKeyStore store({{"a", "key-aaaaaaaa", {"m1"}, 0, 0, std::nullopt}, {"b", "key-bbbbbbbb", {}, 0, 0, std::nullopt}});
  ASSERT_TRUE(store.enabled());
  auto* a = store.find("key-aaaaaaaa");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->config.id, "a");
  EXPECT_EQ(store.find("key-cccccccc"), nullptr);
  EXPECT_TRUE(ApiKeyStore::allows_model(*a, "m1"));
  EXPECT_FALSE(ApiKeyStore::allows_model(*a, "m2"));
  EXPECT_TRUE(ApiKeyStore::allows_model(*store.find("key-bbbbbbbb"), "m2"));
}

TEST(Auth, KeysCarryTheirLimits) {
  ApiKeyConfig a{"a", "key-aaaaaaaa", {}, 2, 100, std::nullopt};
  ApiKeyConfig b{"b", "key-bbbbbbbb", {}, 0, 0, 3};
  ApiKeyConfig c{"c", "key-cccccccc", {}, 0, 0, 0};
  ApiKeyStore store({a, b, c}, /*default_max_concurrent=*/7);
  const KeyLimits& la = store.find("key-aaaaaaaa")->limiter.limits();
  EXPECT_EQ(la.requests_per_minute, 2);
  EXPECT_EQ(la.tokens_per_minute, 100);
  EXPECT_EQ(la.max_concurrent, 7);  // the server's default
  EXPECT_EQ(store.find("key-bbbbbbbb")->limiter.limits().max_concurrent, 3);
  EXPECT_EQ(store.find("key-cccccccc")->limiter.limits().max_concurrent, 0);  // unlimited, explicitly
}

}  // namespace
}  // namespace infera::server
