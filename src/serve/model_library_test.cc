#include "serve/model_library.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "util/testing.h"

namespace ember::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class FakeResident final : public ResidentModel {
 public:
  FakeResident(std::string name, int64_t bytes, std::atomic<int>* alive)
      : bytes_(bytes), alive_(alive) {
    served_.name = std::move(name);
    ++*alive_;
  }
  ~FakeResident() override { --*alive_; }
  const ServedModel& served() const override { return served_; }
  int64_t memory_bytes() const override { return bytes_; }

 private:
  ServedModel served_;
  int64_t bytes_;
  std::atomic<int>* alive_;
};

void WriteFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A folder the scan takes for a model: config.json, weights, tokenizer.json.
void MakeModel(const fs::path& dir, int64_t weight_bytes = 100) {
  WriteFile(dir / "config.json",
            R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "max_position_embeddings": 4096, "torch_dtype": "bfloat16"})");
  WriteFile(dir / "model.safetensors", std::string(static_cast<size_t>(weight_bytes), 'x'));
  WriteFile(dir / "tokenizer.json", "{}");
}

class ModelLibraryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("ember_library_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Each model holds its size on disk; loading fails for ids in fail_.
  LibraryHooks Hooks() {
    LibraryHooks hooks;
    hooks.load = [this](const LibraryModelInfo& info) -> Result<std::unique_ptr<ResidentModel>> {
      ++loads_;
      if (info.id == fail_) return Status::Error("broken weights");
      return std::unique_ptr<ResidentModel>(
          std::make_unique<FakeResident>(info.id, info.disk_bytes, &alive_));
    };
    hooks.estimate_bytes = [](const LibraryModelInfo& info) { return info.disk_bytes; };
    return hooks;
  }

  static ModelLibrary::Lease Leased(std::variant<ModelLibrary::Lease, LibraryError> got) {
    if (auto* e = std::get_if<LibraryError>(&got)) {
      ADD_FAILURE() << e->message;
      return nullptr;
    }
    return std::get<ModelLibrary::Lease>(std::move(got));
  }

  fs::path root_;
  std::atomic<int> alive_{0};
  std::atomic<int> loads_{0};
  std::string fail_;
};

TEST_F(ModelLibraryTest, ScanFindsNestedFoldersAndDescribesThem) {
  MakeModel(root_ / "org" / "alpha");
  MakeModel(root_ / "beta");
  MakeModel(root_ / ".hidden" / "gamma");             // hidden folders are skipped
  WriteFile(root_ / "notes" / "config.json", "{}");   // no weights: not a model
  MakeModel(root_ / "no-tok");
  fs::remove(root_ / "no-tok" / "tokenizer.json");
  fs::create_directory_symlink(root_, root_ / "org" / "loop");  // a link cycle ends
  auto found = ScanModelFolders(root_.string());
  ASSERT_TRUE(found.ok()) << found.message();
  std::vector<std::string> ids;
  for (const auto& m : *found) ids.push_back(m.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"beta", "no-tok", "org/alpha"}));
  const LibraryModelInfo& beta = (*found)[0];
  EXPECT_EQ(beta.details["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(beta.details["context_length"], 4096);
  EXPECT_EQ(beta.details["dtype"], "bfloat16");
  EXPECT_TRUE(beta.details["quantization"].is_null());
  EXPECT_EQ(beta.details["chat_template"], false);
  EXPECT_GE(beta.disk_bytes, 100);
  EXPECT_TRUE(beta.problem.empty());
  EXPECT_NE((*found)[1].problem.find("tokenizer.json"), std::string::npos);
  EXPECT_FALSE(ScanModelFolders((root_ / "missing").string()).ok());
}

TEST_F(ModelLibraryTest, LinkedFolderReportsTemplateFormats) {
  // A fixture model's files behind links (as the Hugging Face cache lays them out), with a chat
  // template that writes hermes tool calls and <think> blocks.
  const fs::path model = fs::absolute(testing::FixturesDir() + "/models/tinystories-656k");
  if (!fs::exists(model)) GTEST_SKIP() << "fixture absent: " << model;
  const fs::path dir = root_ / "meta" / "tiny";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    fs::create_symlink(model / f, dir / f);
  const std::string chat_template =
      "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<tool_call>{% endif %}"
      "{% if add_generation_prompt %}<think>\\n\\n</think>{% endif %}";
  WriteFile(dir / "tokenizer_config.json", json{{"chat_template", chat_template}}.dump());
  fs::create_directory_symlink(dir, root_ / "alias");  // a second name for the same folder
  auto found = ScanModelFolders(root_.string());
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->size(), 1u);  // the folder is listed once, under the first name found
  const json& d = (*found)[0].details;
  EXPECT_EQ((*found)[0].id, "alias");
  EXPECT_EQ(d["chat_template"], true);
  EXPECT_EQ(d["tools"], true) << d.dump();
  EXPECT_EQ(d["tool_call_format"], "hermes") << d.dump();
  EXPECT_EQ(d["reasoning_format"], "think") << d.dump();
  EXPECT_EQ(d["dtype"], "float32");
  EXPECT_GT((*found)[0].disk_bytes, 1000000);  // sizes through the links
}

TEST_F(ModelLibraryTest, GgufFilesAreListedFromTheirMetadata) {
  const fs::path gguf = fs::absolute(testing::FixturesDir() + "/gguf");
  if (!fs::exists(gguf / "ts-q4_0.gguf")) GTEST_SKIP() << "fixture absent: " << gguf;
  fs::create_directories(root_ / "files");
  fs::create_symlink(gguf / "ts-f32.gguf", root_ / "files" / "ts-f32.gguf");
  fs::create_symlink(gguf / "ts-q4_0.gguf", root_ / "ts-q4_0.gguf");
  WriteFile(root_ / "broken.gguf", "GGUF but not really");
  auto found = ScanModelFolders(root_.string());
  ASSERT_TRUE(found.ok()) << found.message();
  std::vector<std::string> ids;
  for (const auto& m : *found) ids.push_back(m.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"broken", "files/ts-f32", "ts-q4_0"}));
  EXPECT_FALSE((*found)[0].problem.empty());  // a corrupt file is listed as unavailable
  const json& f32 = (*found)[1].details;
  EXPECT_EQ(f32["format"], "gguf");
  EXPECT_EQ(f32["architecture"], "llama");
  EXPECT_EQ(f32["dtype"], "F32");
  EXPECT_TRUE(f32["quantization"].is_null());
  EXPECT_EQ(f32["context_length"], 512) << f32.dump();
  EXPECT_TRUE((*found)[1].problem.empty()) << (*found)[1].problem;
  const json& q4 = (*found)[2].details;
  EXPECT_EQ(q4["quantization"], "Q4_0") << q4.dump();
  EXPECT_GT((*found)[2].disk_bytes, 100000);
}

TEST_F(ModelLibraryTest, LoadsOnDemandAndEvictsLeastRecentlyUsedIdle) {
  MakeModel(root_ / "a", 400);
  MakeModel(root_ / "b", 400);
  MakeModel(root_ / "c", 400);
  ModelLibrary library(root_.string(), /*budget=*/1300, Hooks());
  ASSERT_TRUE(library.Rescan().ok());
  EXPECT_EQ(library.List().size(), 3u);
  EXPECT_EQ(library.List()[0]["state"], "available");
  { auto a = Leased(library.Acquire("a")); ASSERT_NE(a, nullptr); EXPECT_EQ(a->name, "a"); }
  { auto b = Leased(library.Acquire("b")); ASSERT_NE(b, nullptr); }
  { auto a = Leased(library.Acquire("a")); }  // resident: no load; a is now the most recent
  EXPECT_EQ(loads_.load(), 2);
  EXPECT_EQ(library.List()[0]["state"], "loaded");
  { auto c = Leased(library.Acquire("c")); ASSERT_NE(c, nullptr); }  // evicts b, not a
  EXPECT_EQ(alive_.load(), 2);
  EXPECT_EQ(library.List()[0]["state"], "loaded");
  EXPECT_EQ(library.List()[1]["state"], "available");
  EXPECT_EQ(library.Stats()["evictions"], 1);
  EXPECT_EQ(library.Stats()["resident_bytes"], library.List()[0]["memory_bytes"].get<int64_t>() * 2);
}

TEST_F(ModelLibraryTest, PinnedModelsAreNeverEvicted) {
  MakeModel(root_ / "a", 600);
  MakeModel(root_ / "b", 600);
  ModelLibrary library(root_.string(), 1000, Hooks());
  ASSERT_TRUE(library.Rescan().ok());
  auto a = Leased(library.Acquire("a"));
  auto refused = library.Acquire("b");
  ASSERT_TRUE(std::holds_alternative<LibraryError>(refused));
  EXPECT_EQ(std::get<LibraryError>(refused).http_status, 503);
  EXPECT_EQ(a->name, "a");  // still valid
  a.reset();
  EXPECT_NE(Leased(library.Acquire("b")), nullptr);
  EXPECT_EQ(alive_.load(), 1);
}

TEST_F(ModelLibraryTest, UnknownFailedAndProblemModels) {
  MakeModel(root_ / "bad");
  MakeModel(root_ / "no-tok");
  fs::remove(root_ / "no-tok" / "tokenizer.json");
  fail_ = "bad";
  ModelLibrary library(root_.string(), 1000, Hooks());
  ASSERT_TRUE(library.Rescan().ok());
  auto unknown = library.Acquire("nope");
  EXPECT_EQ(std::get<LibraryError>(unknown).http_status, 404);
  auto problem = library.Acquire("no-tok");
  EXPECT_EQ(std::get<LibraryError>(problem).http_status, 400);
  auto failed = library.Acquire("bad");
  ASSERT_TRUE(std::holds_alternative<LibraryError>(failed));
  EXPECT_NE(std::get<LibraryError>(failed).message.find("broken weights"), std::string::npos);
  EXPECT_EQ(library.List()[0]["state"], "failed");
  EXPECT_EQ(library.List()[1]["state"], "unavailable");
  EXPECT_EQ(library.Stats()["load_failures"], 1);
  fail_.clear();  // fixed on disk: the next request loads it
  EXPECT_NE(Leased(library.Acquire("bad")), nullptr);
}

TEST_F(ModelLibraryTest, ConcurrentRequestsShareOneLoad) {
  MakeModel(root_ / "a", 100);
  ModelLibrary library(root_.string(), 1000, Hooks());
  ASSERT_TRUE(library.Rescan().ok());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      auto got = library.Acquire("a");
      if (std::holds_alternative<ModelLibrary::Lease>(got)) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(loads_.load(), 1);
}

TEST_F(ModelLibraryTest, RescanSeesNewAndRemovedFolders) {
  MakeModel(root_ / "a");
  ModelLibrary library(root_.string(), 1000, Hooks());
  ASSERT_TRUE(library.Rescan().ok());
  auto lease = Leased(library.Acquire("a"));
  fs::remove_all(root_ / "a");
  MakeModel(root_ / "b");
  ASSERT_TRUE(library.Rescan().ok());
  ASSERT_EQ(library.List().size(), 1u);
  EXPECT_EQ(library.List()[0]["id"], "b");
  EXPECT_EQ(lease->name, "a");  // a lease outlives its folder's removal
}

}  // namespace
}  // namespace ember::serve
