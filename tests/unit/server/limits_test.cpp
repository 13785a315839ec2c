#include "infera/server/limits.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace infera::server {
namespace {

using namespace std::chrono;
using Kind = LimitDenial::Kind;

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

TEST(TokenBucket, RefundsNeverExceedTheCapacity) {
  TokenBucket b(100);
  const auto t0 = TokenBucket::Clock::now();
  b.charge(30, t0);
  b.refund(500, t0);
  EXPECT_DOUBLE_EQ(b.level(t0), 100);
  double retry = 0;
  EXPECT_TRUE(b.can_take(100, &retry, t0));
  EXPECT_FALSE(b.can_take(101, &retry, t0));
  EXPECT_DOUBLE_EQ(b.level(t0), 100) << "can_take takes nothing";
}

TEST(KeyLimiter, TokensAreReservedAtAdmissionAndTheRestRefunded) {
  KeyLimiter l({0, 1000, 0});
  const auto t0 = KeyLimiter::Clock::now();
  EXPECT_FALSE(l.admit(1, 600, t0));
  EXPECT_DOUBLE_EQ(l.tokens_level(t0), 400);
  auto d = l.admit(1, 600, t0);  // only 400 left: not admitted, nothing taken
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, Kind::kTokens);
  EXPECT_GE(d->retry_after_s, 12);  // 200 tokens at 1000 per minute
  EXPECT_NE(d->message.find("1000 tokens per minute"), std::string::npos) << d->message;
  EXPECT_DOUBLE_EQ(l.tokens_level(t0), 400);
  l.settle(600, 100, t0);  // used 100 of its 600: 500 come back
  EXPECT_DOUBLE_EQ(l.tokens_level(t0), 900);
  EXPECT_FALSE(l.admit(1, 600, t0));
  l.settle(600, 900, t0);  // used more than reserved: the excess is charged
  EXPECT_DOUBLE_EQ(l.tokens_level(t0), 0);
}

TEST(KeyLimiter, AConcurrentBurstGetsOnlyItsBudget) {
  // 60 requests admitted at once, each estimated at 50 tokens, against 1000 per minute:
  // 20 fit. (Charged only at the end, all 60 would have been admitted.)
  KeyLimiter l({0, 1000, 0});
  const auto t0 = KeyLimiter::Clock::now();
  int admitted = 0;
  for (int i = 0; i < 60; ++i) admitted += l.admit(1, 50, t0) ? 0 : 1;
  EXPECT_EQ(admitted, 20);
  EXPECT_EQ(l.in_flight(), 20);
}

TEST(KeyLimiter, ARequestLargerThanTheBucketWaitsForAFullOne) {
  KeyLimiter l({0, 100, 0});
  const auto t0 = KeyLimiter::Clock::now();
  EXPECT_FALSE(l.admit(1, 500, t0));  // a full bucket admits it, and goes negative
  EXPECT_DOUBLE_EQ(l.tokens_level(t0), -400);
  EXPECT_TRUE(l.admit(1, 1, t0));
  l.settle(500, 50, t0);
  EXPECT_DOUBLE_EQ(l.tokens_level(t0), 50);
  EXPECT_TRUE(l.admit(1, 500, t0)) << "only a full bucket admits a request over the capacity";
  EXPECT_FALSE(l.admit(1, 500, t0 + seconds(30)));
}

TEST(KeyLimiter, EveryChoiceCountsAsARequest) {
  KeyLimiter l({4, 0, 0});
  const auto t0 = KeyLimiter::Clock::now();
  EXPECT_FALSE(l.admit(3, 0, t0));  // n = 3
  auto d = l.admit(2, 0, t0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, Kind::kRequests);
  EXPECT_FALSE(l.admit(1, 0, t0));
  EXPECT_TRUE(l.admit(1, 0, t0));
  EXPECT_TRUE(l.precheck(t0));
  // Refilled after a minute; n over the whole budget is admitted only from a full bucket.
  EXPECT_FALSE(l.admit(9, 0, t0 + seconds(61)));
  EXPECT_TRUE(l.admit(1, 0, t0 + seconds(62)));
}

TEST(KeyLimiter, ConcurrencyCapCountsRequestsInFlight) {
  KeyLimiter l({0, 0, 2});
  EXPECT_FALSE(l.admit(1, 0));
  EXPECT_FALSE(l.admit(1, 0));
  auto d = l.admit(1, 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, Kind::kConcurrency);
  EXPECT_EQ(d->retry_after_s, 1);
  ASSERT_TRUE(l.precheck());
  EXPECT_EQ(l.precheck()->kind, Kind::kConcurrency);
  l.settle(0, 0);
  EXPECT_EQ(l.in_flight(), 1);
  EXPECT_FALSE(l.admit(1, 0));
}

TEST(KeyLimiter, PrecheckTakesNothing) {
  KeyLimiter l({1, 10, 1});
  const auto t0 = KeyLimiter::Clock::now();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(l.precheck(t0));
  EXPECT_DOUBLE_EQ(l.requests_level(t0), 1);
  EXPECT_DOUBLE_EQ(l.tokens_level(t0), 10);
  EXPECT_EQ(l.in_flight(), 0);
  EXPECT_FALSE(l.admit(1, 10, t0));
  auto d = l.precheck(t0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, Kind::kConcurrency);
  l.settle(10, 10, t0);
  d = l.precheck(t0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, Kind::kRequests);
}

TEST(KeyLimiter, UnlimitedAdmitsEverything) {
  KeyLimiter l({0, 0, 0});
  for (int i = 0; i < 1000; ++i) ASSERT_FALSE(l.admit(100, 1e9));
  EXPECT_EQ(l.in_flight(), 1000);
}

TEST(Admission, SettlesOnceWithWhatWasUsed) {
  KeyLimiter l({0, 1000, 3});
  const auto t0 = KeyLimiter::Clock::now();
  {
    ASSERT_FALSE(l.admit(1, 300, t0));
    Admission a(&l, 300);
    EXPECT_TRUE(a.active());
    a.set_used(100);
    a.settle();
    EXPECT_FALSE(a.active());
    a.settle();  // twice is once
  }
  EXPECT_EQ(l.in_flight(), 0);
  EXPECT_NEAR(l.tokens_level(), 900, 1);
  {
    ASSERT_FALSE(l.admit(1, 200));
    Admission a(&l, 200);  // nothing reported: the reservation is kept
    Admission b = std::move(a);
    EXPECT_FALSE(a.active());
    EXPECT_EQ(l.in_flight(), 1);
  }
  EXPECT_EQ(l.in_flight(), 0);
  EXPECT_NEAR(l.tokens_level(), 700, 1);
  Admission none;  // requests without a key
  EXPECT_FALSE(none.active());
}

TEST(KeyLimiter, ConcurrentAdmissionsBalance) {
  KeyLimiter l({0, 1e6, 4});
  std::atomic<int> admitted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (l.admit(1, 10)) {
          ++refused;
          continue;
        }
        ++admitted;
        EXPECT_LE(l.in_flight(), 4);
        Admission a(&l, 10);
        a.set_used(3);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted + refused, 16000);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(l.in_flight(), 0);
}

}  // namespace
}  // namespace infera::server
