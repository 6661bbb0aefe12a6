// GgufWriter: what it writes GgufFile reads back (every metadata kind, tensor shapes, types and
// bytes, 32-byte aligned data), and its failures: a duplicate tensor, a row that is not whole
// blocks, a producer of the wrong size or one that fails (no file left, an existing file kept),
// a destination folder that does not exist.
#include "model/gguf_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace ember {
namespace {

namespace fs = std::filesystem;

class GgufWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ember-gguf-writer-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t Entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  std::string dir_;
};

GgufWriter::Producer Bytes(std::vector<uint8_t> bytes) {
  return [bytes]() -> Result<std::vector<uint8_t>> { return bytes; };
}

TEST_F(GgufWriterTest, WhatItWritesReadsBack) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.block_count", 2);
  w.AddInt32("some.int", -7);
  w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.AddBool("tokenizer.ggml.add_bos_token", true);
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "", "\xE2\x96\x81the"});
  w.AddFloat32Array("tokenizer.ggml.scores", {0.0f, -1.5f, -2.0f});
  w.AddInt32Array("tokenizer.ggml.token_type", {1, 3, 6});
  std::vector<uint8_t> vec(3 * 4), q8(2 * 34);  // 3 floats (12 bytes: the next tensor is padded)
  for (size_t i = 0; i < vec.size(); ++i) vec[i] = static_cast<uint8_t>(i + 1);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(200 - i);
  ASSERT_TRUE(w.AddTensor("v.weight", GgmlType::kF32, {3}, Bytes(vec)).ok());
  ASSERT_TRUE(w.AddTensor("m.weight", GgmlType::kQ8_0, {2, 32}, Bytes(q8)).ok());
  const std::string path = dir_ + "/out.gguf";
  Status st = w.Write(path);
  ASSERT_TRUE(st.ok()) << st.message();

  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.message();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->alignment(), 32u);
  EXPECT_EQ(*file->GetString("general.architecture"), "llama");
  EXPECT_EQ(*file->GetUint32("llama.block_count"), 2u);
  EXPECT_EQ(*file->GetInt("some.int"), -7);
  EXPECT_FLOAT_EQ(static_cast<float>(*file->GetFloat("llama.attention.layer_norm_rms_epsilon")),
                  1e-5f);
  EXPECT_TRUE(*file->GetBool("tokenizer.ggml.add_bos_token"));
  auto tokens = file->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[2], "\xE2\x96\x81the");
  EXPECT_EQ(*file->GetFloatArray("tokenizer.ggml.scores"), (std::vector<float>{0.0f, -1.5f, -2.0f}));
  EXPECT_EQ(*file->GetIntArray("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 3, 6}));
  const GgufTensorInfo* v = file->FindTensor("v.weight");
  const GgufTensorInfo* m = file->FindTensor("m.weight");
  ASSERT_TRUE(v != nullptr && m != nullptr);
  EXPECT_EQ(v->dims, (std::vector<int64_t>{3}));
  EXPECT_EQ(m->dims, (std::vector<int64_t>{32, 2}));  // GGUF order: the row length first
  EXPECT_EQ(m->type, GgmlType::kQ8_0);
  EXPECT_EQ(m->offset % 32, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data) % 32, 0u);
  EXPECT_EQ(std::vector<uint8_t>(v->data, v->data + v->nbytes), vec);
  EXPECT_EQ(std::vector<uint8_t>(m->data, m->data + m->nbytes), q8);
  EXPECT_EQ(Entries(), 1u);
}

TEST_F(GgufWriterTest, FailuresNameTheTensorOrPathAndLeaveNoFile) {
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("a.weight", GgmlType::kF32, {4}, Bytes(std::vector<uint8_t>(16))).ok());
  Status dup = w.AddTensor("a.weight", GgmlType::kF32, {4}, Bytes(std::vector<uint8_t>(16)));
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.message().find("'a.weight' added twice"), std::string::npos) << dup.message();
  Status partial = w.AddTensor("q.weight", GgmlType::kQ4_K, {2, 128}, Bytes({}));
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.message().find("GGUF tensor 'q.weight'"), std::string::npos)
      << partial.message();

  const std::string path = dir_ + "/keep.gguf";
  std::ofstream(path) << "earlier contents";
  GgufWriter short_bytes;
  ASSERT_TRUE(
      short_bytes.AddTensor("s.weight", GgmlType::kF32, {4}, Bytes(std::vector<uint8_t>(12))).ok());
  Status st = short_bytes.Write(path);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tensor 's.weight' produced 12 bytes, expected 16"),
            std::string::npos)
      << st.message();
  GgufWriter failing;
  ASSERT_TRUE(failing
                  .AddTensor("f.weight", GgmlType::kF32, {4},
                             []() -> Result<std::vector<uint8_t>> {
                               return Status::Error("quantizer said no");
                             })
                  .ok());
  st = failing.Write(path);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("quantizer said no"), std::string::npos) << st.message();
  std::ifstream in(path);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, "earlier contents");
  EXPECT_EQ(Entries(), 1u);  // no temporary file left

  st = w.Write(dir_ + "/missing/out.gguf");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing/out.gguf: cannot create a file beside it"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace ember
