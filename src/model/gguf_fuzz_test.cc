// Fuzz-style robustness of GgufFile: mutated and truncated copies of real (llama.cpp-made) and
// built GGUF files, and random bytes, must parse or fail with a Status, never crash or read out
// of bounds (run under ASan: scripts/build.sh --sanitize). Whatever parses is then read through
// every accessor and each tensor's first row is dequantized, so the validation is shown to be
// enough for the readers that trust it. Deterministic seeds; every buffer is exactly sized so
// that ASan sees any read past its end.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "model/gguf.h"
#include "model/gguf_test_util.h"
#include "util/testing.h"

namespace ember {
namespace {

struct FuzzStats {
  int num_parsed = 0;
  int num_refused = 0;
};

// Reads everything a parsed file offers; results are ignored (errors are fine, crashes not).
void Exercise(const GgufFile& file) {
  for (const std::string& key : file.keys()) {
    const GgufValue* value = file.FindKey(key);
    ASSERT_NE(value, nullptr) << key;
    (void)value->Describe();
    (void)file.GetInt(key);
    (void)file.GetUint32(key);
    (void)file.GetFloat(key);
    (void)file.GetBool(key);
    (void)file.GetString(key);
    (void)file.GetStringArray(key);
    (void)file.GetIntArray(key);
    (void)file.GetFloatArray(key);
  }
  std::vector<float> row;
  for (const GgufTensorInfo& tensor : file.tensors()) {
    ASSERT_EQ(file.FindTensor(tensor.name), &tensor);
    if (tensor.num_rows() == 0) continue;
    row.resize(static_cast<size_t>(tensor.row_length()));
    DequantizeRow(tensor.type, tensor.data, tensor.row_length(), row.data());
    const uint8_t* last_row = tensor.data + (tensor.num_rows() - 1) * tensor.row_bytes();
    DequantizeRow(tensor.type, last_row, tensor.row_length(), row.data());
  }
}

void ParseAndExercise(const std::vector<uint8_t>& bytes, FuzzStats* stats) {
  Result<GgufFile> file = GgufFile::Parse(bytes, "fuzz.gguf");
  if (!file.ok()) {
    EXPECT_EQ(file.message().rfind("fuzz.gguf: ", 0), 0u) << file.message();
    // Names from the file are shown escaped: no control bytes reach a log line.
    for (char c : file.message()) ASSERT_GE(static_cast<unsigned char>(c), 0x20) << file.message();
    ++stats->num_refused;
    return;
  }
  ++stats->num_parsed;
  Exercise(*file);
}

uint64_t InterestingU64(std::mt19937_64& rng, uint64_t file_size) {
  const uint64_t values[] = {0,
                             1,
                             2,
                             3,
                             4,
                             31,
                             32,
                             255,
                             256,
                             0x7FFFFFFFull,
                             0x80000000ull,
                             0xFFFFFFFFull,
                             0x100000000ull,
                             0x7FFFFFFFFFFFFFFFull,
                             0x8000000000000000ull,
                             ~0ull,
                             file_size,
                             file_size - 1,
                             file_size + 1,
                             rng() % 64};
  return values[rng() % std::size(values)];
}

// Positions biased to where the structure is: the header and first keys, the tensor infos
// just before the data section, and anywhere in between.
size_t PickPosition(std::mt19937_64& rng, size_t header_end) {
  switch (rng() % 3) {
    case 0: return rng() % std::min<size_t>(header_end, 512);
    case 1: return header_end - 1 - rng() % std::min<size_t>(header_end, 4096);
    default: return rng() % header_end;
  }
}

void Mutate(std::mt19937_64& rng, std::vector<uint8_t>& bytes, size_t header_end) {
  const int num_edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < num_edits; ++e) {
    const size_t pos = PickPosition(rng, header_end);
    switch (rng() % 4) {
      case 0: bytes[pos] = static_cast<uint8_t>(rng()); break;
      case 1: bytes[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
      case 2: {
        const uint64_t v = InterestingU64(rng, bytes.size());
        std::memcpy(&bytes[pos], &v, std::min<size_t>(8, bytes.size() - pos));
        break;
      }
      default: {
        const uint32_t v = rng() % 2 ? static_cast<uint32_t>(rng() % 48) : 0xFFFFFFFFu;
        std::memcpy(&bytes[pos], &v, std::min<size_t>(4, bytes.size() - pos));
        break;
      }
    }
  }
}

// Mutates `original` in place `iterations` times (restoring its header after each), then
// parses exact-size truncations and header-only copies with inserted or deleted bytes.
FuzzStats FuzzFile(std::vector<uint8_t> original, uint64_t seed, int iterations) {
  FuzzStats stats;
  std::mt19937_64 rng(seed);
  Result<GgufFile> clean = GgufFile::Parse(original, "fuzz.gguf");
  EXPECT_TRUE(clean.ok()) << clean.message();
  if (!clean.ok()) return stats;
  const size_t header_end = std::min<size_t>(clean->data_offset(), original.size());
  std::vector<uint8_t> bytes = original;
  for (int i = 0; i < iterations; ++i) {
    Mutate(rng, bytes, header_end);
    ParseAndExercise(bytes, &stats);
    std::memcpy(bytes.data(), original.data(), header_end);
  }
  for (int i = 0; i < iterations / 4; ++i) {
    const size_t size = rng() % 8 == 0
                            ? original.size() - 1 - rng() % std::min<size_t>(original.size(), 4096)
                            : rng() % (header_end + 64);
    std::vector<uint8_t> cut(original.begin(), original.begin() + std::min(size, original.size()));
    ParseAndExercise(cut, &stats);
  }
  for (int i = 0; i < iterations / 4; ++i) {
    std::vector<uint8_t> edited(original.begin(), original.begin() + header_end);
    const size_t pos = PickPosition(rng, header_end);
    const size_t count = 1 + rng() % 16;
    if (rng() % 2) {
      edited.insert(edited.begin() + pos, count, static_cast<uint8_t>(rng()));
    } else {
      edited.erase(edited.begin() + pos, edited.begin() + std::min(pos + count, edited.size()));
    }
    ParseAndExercise(edited, &stats);
  }
  return stats;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TEST(GgufFuzz, MutatedFixtureFilesNeverCrash) {
  const std::string dir = testing::FixturesDir() + "/gguf";
  EMBER_REQUIRE_DIR(dir);
  uint64_t seed = 1;
  int num_files = 0;
  for (const std::string name : {"ts-q4_0.gguf", "ts-q5_1.gguf", "small-k-q4_k_m.gguf",
                                 "small-k-iq4_xs.gguf", "small-k-q6_k.gguf"}) {
    std::vector<uint8_t> bytes = ReadAll(dir + "/" + name);
    ASSERT_FALSE(bytes.empty()) << name;
    FuzzStats stats = FuzzFile(std::move(bytes), seed++, 600);
    // Both outcomes happen: the mutations reach past the first checks.
    EXPECT_GT(stats.num_parsed, 0) << name;
    EXPECT_GT(stats.num_refused, 0) << name;
    ++num_files;
  }
  EXPECT_EQ(num_files, 5);
}

// A built file with every value type and several tensor types, so that the fuzzing runs (and
// reaches arrays, alignment and overlap checks) without the fixtures too.
std::vector<uint8_t> BuiltFile() {
  testing::GgufBuilder b;
  b.String("general.architecture", "llama")
      .Scalar<uint32_t>("general.alignment", GgufValueType::kUint32, 32)
      .Scalar<uint8_t>("u8", GgufValueType::kUint8, 7)
      .Scalar<int64_t>("i64", GgufValueType::kInt64, -5)
      .Scalar<double>("f64", GgufValueType::kFloat64, 2.5)
      .Scalar<uint8_t>("flag", GgufValueType::kBool, 1)
      .StringArray("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", "ab"})
      .Array<float>("tokenizer.ggml.scores", GgufValueType::kFloat32, {0, 0, -1, -2, -3})
      .Array<int32_t>("tokenizer.ggml.token_type", GgufValueType::kInt32, {3, 3, 1, 1, 1})
      .AddTensor("token_embd.weight", {256, 2}, GgmlType::kQ4_K)
      .AddTensor("norm", {64}, GgmlType::kF32)
      .AddTensor("q8", {32, 3}, GgmlType::kQ8_0)
      .AddTensor("mx", {64}, GgmlType::kMXFP4)
      .AddTensor("q6", {256}, GgmlType::kQ6_K);
  return b.Build();
}

TEST(GgufFuzz, MutatedBuiltFileNeverCrashes) {
  FuzzStats stats = FuzzFile(BuiltFile(), 99, 4000);
  EXPECT_GT(stats.num_parsed, 0);
  EXPECT_GT(stats.num_refused, 0);
}

TEST(GgufFuzz, RandomBytesNeverCrash) {
  std::mt19937_64 rng(7);
  FuzzStats stats;
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> bytes(rng() % 300);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    if (bytes.size() >= 8 && rng() % 2) {  // a valid magic and version: reach the counts
      const uint32_t head[2] = {0x46554747u, static_cast<uint32_t>(2 + rng() % 2)};
      std::memcpy(bytes.data(), head, 8);
      if (bytes.size() >= 24 && rng() % 2) {  // small counts: reach keys and tensor infos
        const uint64_t counts[2] = {rng() % 3, rng() % 4};
        std::memcpy(bytes.data() + 8, counts, 16);
      }
    }
    ParseAndExercise(bytes, &stats);
  }
  EXPECT_GT(stats.num_refused, 2500);
}

}  // namespace
}  // namespace ember
