// SHA-256 against FIPS 180-4 / NIST vectors (incremental updates across block boundaries too), on
// the SHA-NI path where the CPU has it and on the portable one, which agree on random inputs; and
// CRC-32C against its check value and the table path.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "util/crc32c.h"
#include "util/sha256.h"

namespace ember {
namespace {

// Runs the test body with the SHA-NI path allowed (the default) and then with the portable one.
class Sha256Paths : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { Sha256::AllowHardwareForTesting(GetParam()); }
  void TearDown() override { Sha256::AllowHardwareForTesting(true); }
};
INSTANTIATE_TEST_SUITE_P(HardwareAndPortable, Sha256Paths, ::testing::Bool());

TEST_P(Sha256Paths, NistVectors) {
  EXPECT_EQ(HexOf(Sha256Of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexOf(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexOf(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.Update(chunk);
  EXPECT_EQ(HexOf(million.Finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_P(Sha256Paths, IncrementalEqualsOneShot) {
  std::string text;
  for (int i = 0; i < 300; ++i) text.push_back(static_cast<char>(i * 7));
  for (size_t cut : {0u, 1u, 55u, 56u, 63u, 64u, 65u, 128u, 299u}) {
    Sha256 h;
    h.Update(std::string_view(text).substr(0, cut)).Update(std::string_view(text).substr(cut));
    EXPECT_EQ(h.Finish(), Sha256Of(text)) << cut;
  }
}

TEST(Sha256Test, HardwareAndPortableAgree) {
  std::mt19937 rng(7);
  std::string text;
  for (size_t len : {1u, 63u, 64u, 65u, 200u, 1000u, 4096u, 70001u}) {
    text.resize(len);
    for (char& c : text) c = static_cast<char>(rng());
    Sha256::AllowHardwareForTesting(false);
    const Sha256Digest portable = Sha256Of(text);
    Sha256::AllowHardwareForTesting(true);
    EXPECT_EQ(Sha256Of(text), portable) << len;
  }
}

TEST(Crc32cTest, CheckValueAndChaining) {
  const std::string s = "123456789";
  const auto bytes = [](const std::string& x) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(x.data()), x.size());
  };
  EXPECT_EQ(Crc32c(bytes(s)), 0xe3069283u);
  EXPECT_EQ(Crc32c(bytes("6789"), Crc32c(bytes("12345"))), 0xe3069283u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros), 0x8a9136aau);  // RFC 3720 B.4
  std::vector<uint8_t> big(100003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 31 + 7);
  const uint32_t whole = Crc32c(big);
  big[50000] ^= 1;
  EXPECT_NE(Crc32c(big), whole);
}

}  // namespace
}  // namespace ember
