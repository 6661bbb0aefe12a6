#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace ember
