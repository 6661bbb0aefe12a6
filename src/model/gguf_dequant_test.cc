// DequantizeRow against llama.cpp gguf-py's numpy dequantization, bitwise: random and edge-case
// blocks of every type Ember reads, and every tensor of the GGUF fixtures. The golden comes from
// scripts/gguf-dequant-reference.py (its docstring gives the line format).
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "model/gguf.h"
#include "model/gguf_quants.h"
#include "util/testing.h"

namespace ember {
namespace {

// zlib's CRC-32 (reflected polynomial 0xEDB88320), as Python's zlib.crc32.
uint32_t Crc32(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::string Crc32Hex(const std::vector<float>& values) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", Crc32(values.data(), values.size() * sizeof(float)));
  return text;
}

std::vector<uint8_t> FromHex(const std::string& hex) {
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return bytes;
}

// The float32 bit patterns, 8 hex digits each.
std::vector<uint32_t> FloatBitsFromHex(const std::string& hex) {
  std::vector<uint32_t> bits(hex.size() / 8);
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = static_cast<uint32_t>(std::stoul(hex.substr(8 * i, 8), nullptr, 16));
  }
  return bits;
}

// Compares the first values bitwise, naming the first index that differs.
void ExpectBitsEqual(const std::vector<float>& got, const std::string& want_hex,
                     const std::string& what) {
  const std::vector<uint32_t> want = FloatBitsFromHex(want_hex);
  ASSERT_LE(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &got[i], 4);
    ASSERT_EQ(bits, want[i]) << what << ": value " << i << " is " << got[i];
  }
}

std::vector<std::vector<std::string>> GoldenLines(const std::string& kind) {
  std::ifstream in(EMBER_GGUF_TESTDATA "/gguf_dequant_golden.txt");
  EXPECT_TRUE(in.good()) << "cannot read " << EMBER_GGUF_TESTDATA "/gguf_dequant_golden.txt";
  std::vector<std::vector<std::string>> lines;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string w; fields >> w;) words.push_back(w);
    if (!words.empty() && words[0] == kind) lines.push_back(words);
  }
  return lines;
}

TEST(GgufDequant, BlocksMatchGgufPyBitwise) {
  std::set<std::string> types_seen;
  int num_cases = 0;
  for (const auto& w : GoldenLines("block")) {
    // block TYPE CASE NUM_ELEMENTS CRC32 INPUT_HEX FIRST_BLOCK_OUTPUT_HEX
    ASSERT_EQ(w.size(), 7u);
    const std::string what = w[1] + " " + w[2];
    Result<GgmlType> type = ParseGgmlTypeName(w[1]);
    ASSERT_TRUE(type.ok()) << type.message();
    const int64_t num_elements = std::stoll(w[3]);
    const std::vector<uint8_t> input = FromHex(w[5]);
    ASSERT_EQ(*GgmlRowBytes(*type, num_elements), input.size()) << what;
    std::vector<float> out(num_elements);
    DequantizeRow(*type, input.data(), num_elements, out.data());
    ExpectBitsEqual(out, w[6], what);
    EXPECT_EQ(Crc32Hex(out), w[4]) << what << ": the values past the first block differ";
    types_seen.insert(w[1]);
    ++num_cases;
  }
  EXPECT_EQ(num_cases, 21);
  // Every type Ember reads has a reference.
  std::istringstream names(DequantizableTypeNames());
  for (std::string name; std::getline(names >> std::ws, name, ',');) {
    EXPECT_TRUE(types_seen.count(name)) << "no gguf-py golden for " << name;
  }
}

TEST(GgufDequant, UnalignedSourceGivesTheSameValues) {
  for (const auto& w : GoldenLines("block")) {
    if (w[2] != "random") continue;
    const GgmlType type = *ParseGgmlTypeName(w[1]);
    const int64_t num_elements = std::stoll(w[3]);
    const std::vector<uint8_t> input = FromHex(w[5]);
    std::vector<uint8_t> shifted(input.size() + 1);
    std::memcpy(shifted.data() + 1, input.data(), input.size());
    std::vector<float> out(num_elements);
    DequantizeRow(type, shifted.data() + 1, num_elements, out.data());
    EXPECT_EQ(Crc32Hex(out), w[4]) << w[1];
  }
}

TEST(GgufDequant, FixtureTensorsMatchGgufPyBitwise) {
  const std::string dir = testing::FixturesDir() + "/gguf";
  EMBER_REQUIRE_DIR(dir);
  std::map<std::string, GgufFile> files;
  std::set<std::string> types_seen;
  int num_tensors = 0;
  for (const auto& w : GoldenLines("tensor")) {
    // tensor FILE TENSOR TYPE NUM_ELEMENTS TENSOR_CRC32 ROW0_CRC32 ROW0_FIRST16_HEX
    ASSERT_EQ(w.size(), 8u);
    const std::string what = w[1] + " " + w[2];
    if (!files.count(w[1])) {
      Result<GgufFile> file = GgufFile::Open(dir + "/" + w[1]);
      ASSERT_TRUE(file.ok()) << file.message();
      files.emplace(w[1], std::move(file).value());
    }
    const GgufTensorInfo* tensor = files.at(w[1]).FindTensor(w[2]);
    ASSERT_NE(tensor, nullptr) << what;
    ASSERT_EQ(GgmlTypeName(tensor->type), w[3]) << what;
    ASSERT_EQ(tensor->num_elements(), std::stoll(w[4])) << what;
    std::vector<float> out(tensor->num_elements());
    DequantizeRow(tensor->type, tensor->data, tensor->num_elements(), out.data());
    std::vector<float> row0(out.begin(), out.begin() + tensor->row_length());
    ExpectBitsEqual(row0, w[7], what);
    EXPECT_EQ(Crc32Hex(row0), w[6]) << what << " row 0";
    EXPECT_EQ(Crc32Hex(out), w[5]) << what;
    // Row by row gives the same values as the whole tensor at once.
    std::vector<float> last_row(tensor->row_length());
    DequantizeRow(tensor->type, tensor->data + (tensor->num_rows() - 1) * tensor->row_bytes(),
                  tensor->row_length(), last_row.data());
    EXPECT_EQ(0, std::memcmp(last_row.data(), out.data() + out.size() - last_row.size(),
                             last_row.size() * sizeof(float)))
        << what << " last row";
    types_seen.insert(w[3]);
    ++num_tensors;
  }
  EXPECT_EQ(num_tensors, 200);
  EXPECT_EQ(types_seen, (std::set<std::string>{"F32", "F16", "Q8_0", "Q4_0", "Q5_1", "Q4_K",
                                               "Q5_K", "Q6_K", "IQ4_XS"}));
}

TEST(GgufDequantDeathTest, RefusesPartialBlocksAndUnreadableTypes) {
  std::vector<uint8_t> block(210);
  std::vector<float> out(256);
  EXPECT_DEATH(DequantizeRow(GgmlType::kQ6_K, block.data(), 128, out.data()), "not whole");
  EXPECT_DEATH(DequantizeRow(GgmlType::kIQ2_XXS, block.data(), 256, out.data()),
               "IQ2_XXS is not dequantizable");
}

}  // namespace
}  // namespace ember
