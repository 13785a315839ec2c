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
  ApiKeyStore store({{"a", "key-aaaaaaaa", {"m1"}, 0, 0}, {"b", "key-bbbbbbbb", {}, 0, 0}});
  ASSERT_TRUE(store.enabled());
  auto* a = store.find("key-aaaaaaaa");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->config.id, "a");
  EXPECT_EQ(store.find("key-cccccccc"), nullptr);
  EXPECT_TRUE(ApiKeyStore::allows_model(*a, "m1"));
  EXPECT_FALSE(ApiKeyStore::allows_model(*a, "m2"));
  EXPECT_TRUE(ApiKeyStore::allows_model(*store.find("key-bbbbbbbb"), "m2"));
}

TEST(TokenBucket, RefillsOverTime) {
  using namespace std::chrono;
  TokenBucket b(60);  // one per second
  const auto t0 = TokenBucket::Clock::now();
  double retry = 0;
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(b.try_take(1, true, &retry, t0));
  EXPECT_FALSE(b.try_take(1, true, &retry, t0));
  EXPECT_NEAR(retry, 1.0, 1e-2);
  EXPECT_TRUE(b.try_take(1, true, &retry, t0 + seconds(1)));
  // Charged after the fact the level can go negative; positive again after refill.
  b.charge(30, t0 + seconds(1));
  EXPECT_FALSE(b.try_take(0, false, &retry, t0 + seconds(10)));
  EXPECT_TRUE(b.try_take(0, false, &retry, t0 + seconds(40)));
}

TEST(TokenBucket, ZeroMeansUnlimited) {
  TokenBucket b(0);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(b.try_take(1, true, nullptr));
}

TEST(Auth, AdmitChecksRequestsAndTokens) {
  ApiKeyStore store({{"a", "key-aaaaaaaa", {}, 2, 100}});
  auto* k = store.find("key-aaaaaaaa");
  double retry = 0;
  EXPECT_TRUE(store.admit(*k, &retry));
  EXPECT_TRUE(store.admit(*k, &retry));
  EXPECT_FALSE(store.admit(*k, &retry));
  EXPECT_GT(retry, 0);
  ApiKeyStore store2({{"b", "key-bbbbbbbb", {}, 0, 100}});
  auto* k2 = store2.find("key-bbbbbbbb");
  store2.charge_tokens(*k2, 150);
  EXPECT_FALSE(store2.admit(*k2, &retry));
}

}  // namespace
}  // namespace infera::server
