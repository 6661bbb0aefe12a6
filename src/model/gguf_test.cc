// GgufFile: reading llama.cpp-made fixtures, every metadata type through the typed accessors,
// and one test per validation error (each must name the file and the key or tensor).
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>

#include "model/gguf_test_util.h"
#include "util/testing.h"

namespace ember {
namespace {

using testing::GgufBuilder;

std::string GgufDir() { return testing::FixturesDir() + "/gguf"; }

Result<GgufFile> ParseBuilt(const std::vector<uint8_t>& bytes) {
  return GgufFile::Parse(bytes, "built.gguf");
}

// The error message of parsing `bytes`, which must fail.
std::string ParseError(const std::vector<uint8_t>& bytes) {
  Result<GgufFile> file = ParseBuilt(bytes);
  EXPECT_FALSE(file.ok());
  return file.ok() ? "" : file.message();
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(GgufFixture, TinyStoriesF32MetadataAndTensors) {
  EMBER_REQUIRE_DIR(GgufDir());
  Result<GgufFile> file = GgufFile::Open(GgufDir() + "/ts-f32.gguf");
  ASSERT_TRUE(file.ok()) << file.message();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->alignment(), 32u);
  EXPECT_EQ(*file->GetString("general.architecture"), "llama");
  EXPECT_EQ(*file->GetUint32("llama.embedding_length"), 128u);
  EXPECT_EQ(*file->GetUint32("llama.feed_forward_length"), 384u);
  EXPECT_GT(*file->GetFloat("llama.rope.freq_base"), 0.0);
  EXPECT_EQ(*file->GetString("tokenizer.ggml.model"), "llama");
  Result<std::span<const std::string_view>> tokens = file->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.message();
  EXPECT_EQ(tokens->size(), 2048u);
  EXPECT_EQ(file->GetFloatArray("tokenizer.ggml.scores")->size(), 2048u);
  EXPECT_EQ(file->GetIntArray("tokenizer.ggml.token_type")->size(), 2048u);
  EXPECT_TRUE(file->GetBool("tokenizer.ggml.add_bos_token").ok());
  EXPECT_EQ(file->keys().front(), "general.architecture");

  ASSERT_EQ(file->tensors().size(), 20u);
  // Positions as gguf-py's GGUFReader reports them for this file.
  const GgufTensorInfo* norm = file->FindTensor("blk.0.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dims, std::vector<int64_t>({128}));
  EXPECT_EQ(file->data_offset() + norm->offset, 50144u);
  const GgufTensorInfo* down = file->FindTensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->dims, std::vector<int64_t>({384, 128}));
  EXPECT_EQ(down->row_major_shape(), std::vector<int64_t>({128, 384}));
  EXPECT_EQ(down->type, GgmlType::kF32);
  EXPECT_EQ(down->nbytes, 384u * 128u * 4u);
  EXPECT_EQ(down->num_rows(), 128);
  EXPECT_EQ(down->row_bytes(), 384u * 4u);
  EXPECT_EQ(file->data_offset() + down->offset, 50656u);
}

TEST(GgufFixture, KQuantTypesAndSizes) {
  EMBER_REQUIRE_DIR(GgufDir());
  Result<GgufFile> file = GgufFile::Open(GgufDir() + "/small-k-q4_k_m.gguf");
  ASSERT_TRUE(file.ok()) << file.message();
  const GgufTensorInfo* embd = file->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ6_K);
  EXPECT_EQ(embd->dims, std::vector<int64_t>({256, 2048}));
  EXPECT_EQ(embd->nbytes, 2048u * 210u);
  EXPECT_EQ(file->data_offset() + embd->offset, 51200u);
  Result<const GgufTensorInfo*> k = file->GetTensor("blk.0.attn_k.weight");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ((*k)->type, GgmlType::kQ4_K);
  EXPECT_EQ(file->data_offset() + (*k)->offset, 481280u);
  Result<const GgufTensorInfo*> missing = file->GetTensor("blk.9.attn_k.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_HAS(missing.message(), "small-k-q4_k_m.gguf");
  EXPECT_HAS(missing.message(), "blk.9.attn_k.weight");
}

TEST(GgufFixture, EveryFixtureOpensWithTensorsInsideTheFile) {
  EMBER_REQUIRE_DIR(GgufDir());
  int num_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(GgufDir())) {
    if (entry.path().extension() != ".gguf") continue;
    ++num_files;
    Result<GgufFile> file = GgufFile::Open(entry.path().string());
    ASSERT_TRUE(file.ok()) << file.message();
    EXPECT_EQ(file->tensors().size(), 20u) << entry.path();
    for (const GgufTensorInfo& t : file->tensors()) {
      EXPECT_NE(t.data, nullptr) << t.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % file->alignment(), 0u) << t.name;
      EXPECT_LE(file->data_offset() + t.offset + t.nbytes, file->file_size()) << t.name;
    }
  }
  EXPECT_EQ(num_files, 10);
}

TEST(GgufMetadata, EveryScalarTypeThroughTheAccessors) {
  GgufBuilder b;
  b.Scalar<uint8_t>("u8", GgufValueType::kUint8, 200)
      .Scalar<int8_t>("i8", GgufValueType::kInt8, -100)
      .Scalar<uint16_t>("u16", GgufValueType::kUint16, 60000)
      .Scalar<int16_t>("i16", GgufValueType::kInt16, -30000)
      .Scalar<uint32_t>("u32", GgufValueType::kUint32, 4000000000u)
      .Scalar<int32_t>("i32", GgufValueType::kInt32, -2000000000)
      .Scalar<uint64_t>("u64", GgufValueType::kUint64, 1ull << 40)
      .Scalar<uint64_t>("u64_huge", GgufValueType::kUint64, ~0ull)
      .Scalar<int64_t>("i64", GgufValueType::kInt64, -(1ll << 40))
      .Scalar<float>("f32", GgufValueType::kFloat32, 0.5f)
      .Scalar<double>("f64", GgufValueType::kFloat64, -1e300)
      .Scalar<uint8_t>("yes", GgufValueType::kBool, 1)
      .Scalar<uint8_t>("no", GgufValueType::kBool, 0)
      .String("s", "hello");
  std::vector<uint8_t> bytes = b.Build();
  Result<GgufFile> file = ParseBuilt(bytes);
  ASSERT_TRUE(file.ok()) << file.message();
  EXPECT_EQ(*file->GetInt("u8"), 200);
  EXPECT_EQ(*file->GetInt("i8"), -100);
  EXPECT_EQ(*file->GetInt("u16"), 60000);
  EXPECT_EQ(*file->GetInt("i16"), -30000);
  EXPECT_EQ(*file->GetUint32("u32"), 4000000000u);
  EXPECT_EQ(*file->GetInt("i32"), -2000000000);
  EXPECT_EQ(*file->GetInt("u64"), 1ll << 40);
  EXPECT_EQ(*file->GetInt("i64"), -(1ll << 40));
  EXPECT_EQ(*file->GetFloat("f32"), 0.5);
  EXPECT_EQ(*file->GetFloat("f64"), -1e300);
  EXPECT_TRUE(*file->GetBool("yes"));
  EXPECT_FALSE(*file->GetBool("no"));
  EXPECT_EQ(*file->GetString("s"), "hello");
  EXPECT_EQ(file->keys().size(), 14u);
  EXPECT_EQ(file->FindKey("u32")->Describe(), "uint32 4000000000");
  EXPECT_EQ(file->FindKey("s")->Describe(), "string \"hello\"");

  // Errors name the file, the key, and what was expected.
  EXPECT_HAS(file->GetInt("nope").message(), "built.gguf: metadata key 'nope' is missing");
  EXPECT_HAS(file->GetInt("f32").message(), "metadata key 'f32' is float32, expected an integer");
  EXPECT_HAS(file->GetFloat("u8").message(), "'u8' is uint8, expected float32 or float64");
  EXPECT_HAS(file->GetString("yes").message(), "'yes' is bool, expected string");
  EXPECT_HAS(file->GetBool("s").message(), "'s' is string, expected bool");
  EXPECT_HAS(file->GetUint32("i8").message(), "'i8' is -100, expected a value in [0, 2^32)");
  EXPECT_HAS(file->GetUint32("u64").message(), "'u64' is 1099511627776");
  EXPECT_HAS(file->GetInt("u64_huge").message(), "too large for int64");
  EXPECT_HAS(file->GetStringArray("s").message(), "'s' is string, expected array<string>");
}

TEST(GgufMetadata, ArraysOfEveryKind) {
  GgufBuilder b;
  b.StringArray("tokens", {"a", "", "<s>", "\xe2\x96\x81the"})
      .Array<float>("scores", GgufValueType::kFloat32, {0.0f, -1.5f, 2.25f})
      .Array<double>("doubles", GgufValueType::kFloat64, {0.125})
      .Array<int32_t>("types", GgufValueType::kInt32, {1, -2, 3})
      .Array<uint8_t>("bytes", GgufValueType::kUint8, {255, 0})
      .Array<uint64_t>("big", GgufValueType::kUint64, {~0ull})
      .Array<int32_t>("empty", GgufValueType::kInt32, {});
  std::vector<uint8_t> bytes = b.Build();
  Result<GgufFile> file = ParseBuilt(bytes);
  ASSERT_TRUE(file.ok()) << file.message();
  std::span<const std::string_view> tokens = *file->GetStringArray("tokens");
  ASSERT_EQ(tokens.size(), 4u);
  EXPECT_EQ(tokens[1], "");
  EXPECT_EQ(tokens[3], "\xe2\x96\x81the");
  EXPECT_EQ(*file->GetFloatArray("scores"), std::vector<float>({0.0f, -1.5f, 2.25f}));
  EXPECT_EQ(*file->GetFloatArray("doubles"), std::vector<float>({0.125f}));
  EXPECT_EQ(*file->GetIntArray("types"), std::vector<int64_t>({1, -2, 3}));
  EXPECT_EQ(*file->GetIntArray("bytes"), std::vector<int64_t>({255, 0}));
  EXPECT_TRUE(file->GetIntArray("empty")->empty());
  EXPECT_EQ(file->FindKey("tokens")->Describe(), "array<string>[4]");
  EXPECT_HAS(file->GetIntArray("big").message(), "'big' element 0");
  EXPECT_HAS(file->GetIntArray("scores").message(),
             "'scores' is array<float32>, expected an array of integers");
  EXPECT_HAS(file->GetFloatArray("tokens").message(), "'tokens' is array<string>");
  EXPECT_HAS(file->GetStringArray("types").message(), "'types' is array<int32>");
  EXPECT_HAS(file->GetInt("types").message(), "'types' is array<int32>, expected an integer");
}

// ---- header and metadata validation ----

TEST(GgufValidation, BadMagicVersionAndEndianness) {
  GgufBuilder b;
  b.magic = 0x46554748;
  EXPECT_HAS(ParseError(b.Build()), "built.gguf: not a GGUF file (bad magic");
  b.magic = 0x46554747;
  b.version = 1;
  EXPECT_HAS(ParseError(b.Build()), "GGUF version 1 is not supported");
  b.version = 4;
  EXPECT_HAS(ParseError(b.Build()), "GGUF version 4 is not supported");
  b.version = 0x03000000;
  EXPECT_HAS(ParseError(b.Build()), "big-endian");
  b.version = 2;
  EXPECT_TRUE(ParseBuilt(b.Build()).ok());
}

TEST(GgufValidation, TruncatedHeaderAndCountsPastTheFile) {
  GgufBuilder b;
  std::vector<uint8_t> bytes = b.Build();
  for (size_t size = 0; size < 24; ++size) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + size);
    EXPECT_HAS(ParseError(cut), "past the end of the file");
  }
  b.num_tensors_override = 1ll << 40;
  EXPECT_HAS(ParseError(b.Build()), "the header claims 1099511627776 tensors");
}

TEST(GgufValidation, StringAndArrayLengthsPastTheFile) {
  GgufBuilder b;
  b.String("general.name", "abcdef");
  std::vector<uint8_t> bytes = b.Build();
  // The value's length field follows the header (24), the key (8 + 12) and its type (4).
  uint64_t huge = 1ull << 50;
  std::memcpy(bytes.data() + 24 + 8 + 12 + 4, &huge, 8);
  EXPECT_HAS(ParseError(bytes), "metadata key 'general.name': string length 1125899906842624");

  GgufBuilder a;
  a.Array<int32_t>("ids", GgufValueType::kInt32, {1, 2});
  bytes = a.Build();
  uint64_t count = 1ull << 61;  // after the header, the key (8 + 3), its type and element type
  std::memcpy(bytes.data() + 24 + 8 + 3 + 4 + 4, &count, 8);
  EXPECT_HAS(ParseError(bytes), "metadata key 'ids': array of 2305843009213693952 int32");

  GgufBuilder s;
  s.StringArray("tokens", {"x", "y"});
  bytes = s.Build();
  bytes.resize(bytes.size() - 1);
  EXPECT_HAS(ParseError(bytes), "metadata key 'tokens' element 1");
}

TEST(GgufValidation, UnknownNestedAndDuplicateKeys) {
  GgufBuilder b;
  b.Scalar<uint32_t>("k", static_cast<GgufValueType>(13), 0);
  EXPECT_HAS(ParseError(b.Build()), "metadata key 'k' has unknown value type id 13");
  GgufBuilder n;
  n.Array<uint32_t>("nested", GgufValueType::kArray, {});
  EXPECT_HAS(ParseError(n.Build()), "metadata key 'nested' is an array of arrays");
  GgufBuilder d;
  d.String("general.name", "a").String("general.name", "b");
  EXPECT_HAS(ParseError(d.Build()), "metadata key 'general.name' appears twice");
}

TEST(GgufValidation, NamesFromTheFileAreEscapedInErrors) {
  GgufBuilder b;
  b.String("bad\nkey\xff", "a").String("bad\nkey\xff", "b");
  EXPECT_HAS(ParseError(b.Build()), "metadata key 'bad\\x0akey\\xff' appears twice");
  GgufBuilder t;
  t.AddTensor(std::string(300, 'w'), {8}, GgmlType::kF32);
  t.tensors[0].type_id = 1000;
  EXPECT_HAS(ParseError(t.Build()), "tensor '" + std::string(120, 'w') + "...' has unknown");
}

TEST(GgufValidation, Alignment) {
  GgufBuilder ok;
  ok.alignment = 64;
  ok.Scalar<uint32_t>("general.alignment", GgufValueType::kUint32, 64)
      .AddTensor("a", {32}, GgmlType::kF32)
      .AddTensor("b", {3}, GgmlType::kF32);
  std::vector<uint8_t> bytes = ok.Build();
  Result<GgufFile> file = ParseBuilt(bytes);
  ASSERT_TRUE(file.ok()) << file.message();
  EXPECT_EQ(file->alignment(), 64u);
  EXPECT_EQ(file->data_offset() % 64, 0u);
  EXPECT_EQ(file->FindTensor("b")->offset, 128u);

  GgufBuilder bad;
  bad.Scalar<uint32_t>("general.alignment", GgufValueType::kUint32, 48);
  EXPECT_HAS(ParseError(bad.Build()), "'general.alignment' is 48, expected a power of two");
  GgufBuilder zero;
  zero.Scalar<uint32_t>("general.alignment", GgufValueType::kUint32, 0);
  EXPECT_HAS(ParseError(zero.Build()), "'general.alignment' is 0");
  GgufBuilder type;
  type.Scalar<uint64_t>("general.alignment", GgufValueType::kUint64, 32);
  EXPECT_HAS(ParseError(type.Build()), "'general.alignment' is uint64, expected uint32");
}

// ---- tensor validation ----

TEST(GgufValidation, TensorTypes) {
  GgufBuilder b;
  b.AddTensor("w", {256, 2}, GgmlType::kQ4_K);
  ASSERT_TRUE(ParseBuilt(b.Build()).ok());
  b.tensors[0].type_id = static_cast<uint32_t>(GgmlType::kIQ2_XXS);
  std::string error = ParseError(b.Build());
  EXPECT_HAS(error, "built.gguf: tensor 'w' has ggml type IQ2_XXS, which Ember does not read");
  EXPECT_HAS(error, "Q4_K");
  b.tensors[0].type_id = 5;  // retired Q4_2
  EXPECT_HAS(ParseError(b.Build()), "tensor 'w' has unknown ggml type id 5");
  b.tensors[0].type_id = 1000;
  EXPECT_HAS(ParseError(b.Build()), "tensor 'w' has unknown ggml type id 1000");
}

TEST(GgufValidation, TensorDims) {
  GgufBuilder rows;
  rows.AddTensor("w", {256, 2}, GgmlType::kQ4_K);
  rows.tensors[0].dims = {100, 2};
  EXPECT_HAS(ParseError(rows.Build()),
             "tensor 'w' has rows of 100 elements, not a multiple of Q4_K's block of 256");
  GgufBuilder many;
  many.AddTensor("w", {1, 1, 1, 1, 1}, GgmlType::kF32);
  EXPECT_HAS(ParseError(many.Build()), "tensor 'w' has 5 dimensions (at most 4)");
  GgufBuilder overflow;
  overflow.AddTensor("w", {1, 1}, GgmlType::kF32);
  overflow.tensors[0].dims = {1ull << 32, 1ull << 32};
  EXPECT_HAS(ParseError(overflow.Build()),
             "tensor 'w': the element count of its dimensions overflows");
  overflow.tensors[0].dims = {1ull << 31, 1ull << 31};  // 2^62 elements * 4 bytes
  EXPECT_HAS(ParseError(overflow.Build()), "tensor 'w': its byte size overflows");
  overflow.tensors[0].dims = {~0ull};
  EXPECT_HAS(ParseError(overflow.Build()), "tensor 'w' dimension 0 is 18446744073709551615");
}

TEST(GgufValidation, TensorOffsets) {
  GgufBuilder b;
  b.AddTensor("a", {8}, GgmlType::kF32).AddTensor("b", {8}, GgmlType::kF32);
  ASSERT_TRUE(ParseBuilt(b.Build()).ok());

  GgufBuilder misaligned = b;
  misaligned.tensors[1].offset = 36;
  EXPECT_HAS(ParseError(misaligned.Build()),
             "tensor 'b' data offset 36 is not a multiple of the alignment 32");
  GgufBuilder overlap = b;
  overlap.tensors[0].dims = {16};  // 64 bytes: runs into b at 32
  EXPECT_HAS(ParseError(overlap.Build()), "overlaps tensor 'a'");
  GgufBuilder beyond = b;
  std::vector<uint8_t> bytes = beyond.Build();
  bytes.resize(bytes.size() - 1);
  EXPECT_HAS(ParseError(bytes), "tensor 'b' (32 bytes at data offset 32) runs past the end");
  GgufBuilder far = b;
  far.tensors[1].offset = 1ull << 62;
  far.data_size_override = 64;
  EXPECT_HAS(ParseError(far.Build()), "tensor 'b' (32 bytes at data offset 4611686018427387904)");
  GgufBuilder duplicate = b;
  duplicate.tensors[1].name = "a";
  EXPECT_HAS(ParseError(duplicate.Build()), "tensor 'a' appears twice");
}

TEST(GgufValidation, TruncatedTensorInfo) {
  GgufBuilder b;
  b.AddTensor("blk.0.attn_q.weight", {32, 4}, GgmlType::kQ8_0);
  std::vector<uint8_t> bytes = b.Build();
  Result<GgufFile> whole = ParseBuilt(bytes);
  ASSERT_TRUE(whole.ok()) << whole.message();
  // Every cut inside the tensor info is refused (names the tensor once its name is read).
  const uint64_t info_end = 24 + 8 + 19 + 4 + 16 + 4 + 8;
  for (uint64_t size = 24; size < info_end; ++size) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + size);
    std::string error = ParseError(cut);
    EXPECT_HAS(error, "built.gguf");
    if (size >= 24 + 8 + 19) {
      EXPECT_HAS(error, "blk.0.attn_q.weight");
    }
  }
}

TEST(GgufTypes, NamesSizesAndRowBytes) {
  EXPECT_EQ(GgmlTypeName(GgmlType::kQ4_K), "Q4_K");
  EXPECT_EQ(*ParseGgmlTypeName("q4_k"), GgmlType::kQ4_K);
  EXPECT_EQ(*ParseGgmlTypeName("IQ4_XS"), GgmlType::kIQ4_XS);
  EXPECT_EQ(*ParseGgmlTypeName("mxfp4"), GgmlType::kMXFP4);
  EXPECT_HAS(ParseGgmlTypeName("q4_k_m").message(), "unknown ggml type 'q4_k_m'");
  EXPECT_EQ(FindGgmlType(4), nullptr);
  EXPECT_EQ(FindGgmlType(39)->type_size, 17);
  EXPECT_EQ(GgmlTraits(GgmlType::kQ6_K).type_size, 210);
  EXPECT_EQ(GgmlTraits(GgmlType::kIQ4_XS).type_size, 136);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ8_0, 64), 68u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kBF16, 3), 6u);
  EXPECT_HAS(GgmlRowBytes(GgmlType::kQ5_K, 128).message(), "not a whole number of 256-element");
  EXPECT_EQ(DequantizableTypeNames(),
            "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
            "IQ4_XS, BF16, MXFP4");
}

}  // namespace
}  // namespace ember
