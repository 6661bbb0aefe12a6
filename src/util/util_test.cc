#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "util/flags.h"
#include "util/half.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace ember {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::Error("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  EMBER_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(StatusTest, PropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.message(), "odd: 3");
  EXPECT_EQ(Status::Error("x").WithContext("file.json").message(), "file.json: x");
}

TEST(HalfTest, RoundTripsAndRounds) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f}) {
    EXPECT_NEAR(F16ToF32(F32ToF16(f)), f, std::fabs(f) * 1e-3 + 1e-9) << f;
    EXPECT_NEAR(Bf16ToF32(F32ToBf16(f)), f, std::fabs(f) * 1e-2 + 1e-9) << f;
  }
  // Exhaustive f16 round trip: every finite f16 value survives f32 and back.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    EXPECT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3f80);  // tie rounds to even
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
}

TEST(MappedFileTest, MissingFileNamesPath) {
  auto r = MappedFile::Open("/nonexistent/file.bin");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("/nonexistent/file.bin"), std::string::npos);
}

// Parses `args` (after a program name) with an int flag and an int-list flag.
Status ParseNumbers(std::vector<std::string> args, int64_t* n, std::vector<int64_t>* list) {
  FlagParser flags("test");
  flags.AddInt("--n", n, "an integer");
  flags.AddIntList("--list", list, "integers");
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool help = false;
  return flags.Parse(static_cast<int>(argv.size()), argv.data(), 1, &help);
}

TEST(FlagParserTest, IntListReplacesTheDefault) {
  int64_t n = 0;
  std::vector<int64_t> list = {1, 4};
  ASSERT_TRUE(ParseNumbers({"--n", "-7", "--list=16,-2,300"}, &n, &list).ok());
  EXPECT_EQ(n, -7);
  EXPECT_EQ(list, (std::vector<int64_t>{16, -2, 300}));
  ASSERT_TRUE(ParseNumbers({"--list", "5"}, &n, &list).ok());
  EXPECT_EQ(list, (std::vector<int64_t>{5}));
}

TEST(FlagParserTest, RepeatedFlagAppendsEachOccurrence) {
  FlagParser flags("test");
  std::vector<std::string> values;
  flags.AddRepeated("--lora", &values, "adapters");
  std::vector<std::string> args = {"prog", "--lora", "a=/x", "--lora=b=/y"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool help = false;
  ASSERT_TRUE(flags.Parse(static_cast<int>(argv.size()), argv.data(), 1, &help).ok());
  EXPECT_EQ(values, (std::vector<std::string>{"a=/x", "b=/y"}));
}

TEST(FlagParserTest, MalformedNumbersNameTheFlag) {
  int64_t n = 3;
  std::vector<int64_t> list = {1, 4};
  for (const char* bad : {"", "1,,2", "1,2,", ",1", "1,x", "1.5", "99999999999999999999"}) {
    const Status st = ParseNumbers({"--list", bad}, &n, &list);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("--list: expected comma-separated integers"), std::string::npos)
        << st.message();
    EXPECT_EQ(list, (std::vector<int64_t>{1, 4})) << "a rejected list leaves the default";
  }
  const Status st = ParseNumbers({"--n", "12a"}, &n, &list);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--n: expected an integer, got '12a'"), std::string::npos);
  EXPECT_EQ(n, 3);
}

}  // namespace
}  // namespace ember
