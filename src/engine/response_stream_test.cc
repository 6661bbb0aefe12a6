// ResponseStream's consumer hook: an event-driven consumer that polls only when notified must
// see every event and the end, whatever the interleaving of Push, Close and its polls.
#include "engine/response_stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace ember {
namespace {

constexpr auto kNoWait = std::chrono::milliseconds(0);

TokenEvent Token(int32_t id) {
  TokenEvent e;
  e.token_id = id;
  return e;
}

TEST(ResponseStreamNotifyTest, PushAndCloseNotify) {
  ResponseStream stream(1);
  int calls = 0;
  stream.SetNotify([&] { ++calls; });
  EXPECT_EQ(calls, 0);  // nothing pending yet
  stream.Push(Token(5));
  EXPECT_EQ(calls, 1);
  stream.Close();
  EXPECT_EQ(calls, 2);
}

TEST(ResponseStreamNotifyTest, SetNotifyFiresAtOnceWhenEventsArePending) {
  ResponseStream stream(1);
  stream.Push(Token(5));
  int calls = 0;
  stream.SetNotify([&] { ++calls; });
  EXPECT_EQ(calls, 1);
  stream.SetNotify(nullptr);
  stream.Push(Token(6));
  EXPECT_EQ(calls, 1);  // removed
}

// The last events and Close arrive before the consumer's poll: Next hands the events over with
// `true`, so the end must come with one more notification or a notify-driven consumer hangs.
TEST(ResponseStreamNotifyTest, NextWakesTheConsumerForTheEnd) {
  ResponseStream stream(1);
  int calls = 0;
  stream.SetNotify([&] { ++calls; });
  stream.Push(Token(5));
  stream.Close();
  const int before = calls;
  std::vector<TokenEvent> events;
  EXPECT_TRUE(stream.Next(&events, kNoWait));
  EXPECT_EQ(events.size(), 1u);
  EXPECT_EQ(calls, before + 1);
  EXPECT_FALSE(stream.Next(&events, kNoWait));
  EXPECT_EQ(calls, before + 1);  // the end seen: nothing more to announce
}

}  // namespace
}  // namespace ember
