// ModelDraftSource on the TinyStories fixture drafting for itself: its proposals are the model's
// greedy continuation (the golden ids) from a cold start, after accepted drafts, after a rejected
// one (its KV truncated to the kept prefix) and for several sequences in one call; sequences
// that stop running give their draft blocks back; a full pool skips a job rather than fail.
// The mtp source (a deepseek_v3 checkpoint's MTP module, mtp_testing.h) against the module run
// by hand on the target's hidden states: the same drafts, also after a partial acceptance.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/model_draft_source.h"
#include "engine/engine_testing.h"
#include "model/mtp_testing.h"
#include "util/testing.h"

namespace ember {
namespace {

struct Golden {
  std::vector<int32_t> prompt, greedy;
};

std::vector<Golden> Goldens(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  std::vector<Golden> out;
  for (const auto& p : golden["prompts"])
    out.push_back({p["ids"].get<std::vector<int32_t>>(), p["greedy_ids"].get<std::vector<int32_t>>()});
  return out;
}

std::unique_ptr<ModelDraftSource> SelfDraft(const std::string& dir, int64_t kv_bytes = 0) {
  auto model = Model::Load(dir, ModelLoadOptions{});
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return nullptr;
  ModelDraftSource::Options options;
  options.kv_cache_bytes = kv_bytes;
  options.max_step_tokens = 5;
  auto source = ModelDraftSource::Create(std::move(*model), 2048, options);
  EXPECT_TRUE(source.ok()) << source.message();
  return source.ok() ? std::move(*source) : nullptr;
}

std::vector<int32_t> Concat(const std::vector<int32_t>& a, std::span<const int32_t> b) {
  std::vector<int32_t> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST(ModelDraftSourceTest, ProposesTheGreedyContinuationAndRollsBack) {
  const std::string dir = testing::ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  const std::vector<Golden> goldens = Goldens(dir);
  ASSERT_GE(goldens.size(), 2u);
  ASSERT_GE(goldens[0].greedy.size(), 12u);
  auto source = SelfDraft(dir);
  ASSERT_NE(source, nullptr);
  const Golden& g = goldens[0];
  const std::span<const int32_t> greedy = g.greedy;
  std::vector<int32_t> out;
  source->Propose(7, g.prompt, 4, &out);  // cold: the whole prompt caught up
  EXPECT_EQ(out, std::vector<int32_t>(greedy.begin(), greedy.begin() + 4));
  // All four accepted: the draft's KV already holds three of them, so the step feeds only the
  // last token and the three new drafts.
  const int64_t fed_before = source->fed_tokens();
  std::vector<int32_t> tokens = Concat(g.prompt, greedy.subspan(0, 4));
  source->Propose(7, tokens, 4, &out);
  EXPECT_EQ(out, std::vector<int32_t>(greedy.begin() + 4, greedy.begin() + 8));
  EXPECT_EQ(source->fed_tokens() - fed_before, 4) << "re-fed more than the new tokens";
  // A rejection: the target's token differs from the draft at position 5 (a wrong token).
  tokens = Concat(g.prompt, greedy.subspan(0, 5));
  tokens.push_back((greedy[5] + 1) % 2048);
  std::vector<int32_t> rejected;
  source->Propose(7, tokens, 3, &rejected);
  EXPECT_EQ(rejected.size(), 3u);
  // Back on the golden path: the truncated KV matches a cold start's.
  tokens = Concat(g.prompt, greedy.subspan(0, 8));
  source->Propose(7, tokens, 4, &out);
  EXPECT_EQ(out, std::vector<int32_t>(greedy.begin() + 8, greedy.begin() + 12));

  // Two sequences in one call, then only one of them still running.
  const Golden& h = goldens[1];
  std::vector<int32_t> out_a, out_b;
  const std::vector<DraftJob> jobs = {{1, g.prompt, 3, &out_a}, {2, h.prompt, 2, &out_b}};
  const std::vector<kv::SeqId> running = {1, 2};
  source->ProposeAll(jobs, running);
  EXPECT_EQ(out_a, std::vector<int32_t>(g.greedy.begin(), g.greedy.begin() + 3));
  EXPECT_EQ(out_b, std::vector<int32_t>(h.greedy.begin(), h.greedy.begin() + 2));
  EXPECT_EQ(source->num_tracked(), 2);  // seq 7 was not running: dropped
  const std::vector<kv::SeqId> only_two = {2};
  source->ProposeAll({}, only_two);
  EXPECT_EQ(source->num_tracked(), 1);
  source->ProposeAll({}, {});
  EXPECT_EQ(source->num_tracked(), 0);
  EXPECT_EQ(source->used_blocks(), 0);
}

TEST(ModelDraftSourceTest, AFullPoolSkipsTheJob) {
  const std::string dir = testing::ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  // Two blocks of 16 tokens (1 KiB a token): one short sequence fits, a second one does not.
  auto source = SelfDraft(dir, int64_t{2} * 16 * 1024);
  ASSERT_NE(source, nullptr);
  ASSERT_EQ(source->num_blocks(), 2);
  const std::vector<int32_t> a(20, 5), b(20, 6);
  std::vector<int32_t> out_a, out_b;
  const std::vector<DraftJob> jobs = {{1, a, 4, &out_a}, {2, b, 4, &out_b}};
  const std::vector<kv::SeqId> running = {1, 2};
  source->ProposeAll(jobs, running);
  EXPECT_EQ(out_a.size(), 4u);
  EXPECT_TRUE(out_b.empty());
  EXPECT_EQ(source->num_tracked(), 1);
  // The next step the first one idles: the second takes its blocks.
  source->ProposeAll(std::span<const DraftJob>(jobs).subspan(1), running);
  EXPECT_EQ(out_b.size(), 4u);
  EXPECT_EQ(source->num_tracked(), 1);
}

// One forward of `tokens` at positions first_pos on (blocks 0..3); returns the argmax after the
// last row and appends every row's final hidden state (before the final norm) to *hidden.
int32_t StepArgmax(Model& model, const std::vector<int32_t>& tokens, int32_t first_pos,
                   std::span<const float> mtp_hidden, std::vector<float>* hidden) {
  const auto d = static_cast<size_t>(model.config().hidden_size);
  BatchPlan plan;
  plan.AddSequence(tokens, first_pos, {0, 1, 2, 3}, true);
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  std::vector<float> last(tokens.size() * d);
  StepOutputs out{logits, {}, {}, {}};
  out.final_hidden = last;
  out.mtp_hidden = mtp_hidden;
  const Status st = model.Forward(plan, out);
  EXPECT_TRUE(st.ok()) << st.message();
  hidden->insert(hidden->end(), last.begin(), last.end());
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The module by hand: a fresh pool, the tokens after the first (token i + 1 at position i) with
// the target's hidden rows h_0.. as input, then `k - 1` chained rounds on its own last hidden.
std::vector<int32_t> MtpByHand(const std::string& dir, const std::vector<int32_t>& tokens,
                               const std::vector<float>& target_hidden, int32_t k) {
  ModelLoadOptions opts;
  opts.mtp_module = true;
  auto mtp = Model::Load(dir, opts);
  EXPECT_TRUE(mtp.ok()) << mtp.message();
  if (!mtp.ok()) return {};
  EXPECT_TRUE((*mtp)->AllocateKvCache(4, 16).ok());
  const auto d = static_cast<size_t>((*mtp)->config().hidden_size);
  const std::vector<int32_t> shifted(tokens.begin() + 1, tokens.end());
  std::vector<float> hidden, own;
  std::vector<int32_t> drafts = {StepArgmax(
      **mtp, shifted, 0, std::span<const float>(target_hidden).first(shifted.size() * d), &own)};
  for (int32_t round = 1; round < k; ++round) {
    const std::vector<float> last(own.end() - static_cast<ptrdiff_t>(d), own.end());
    own.clear();
    drafts.push_back(StepArgmax(**mtp, {drafts.back()},
                                static_cast<int32_t>(shifted.size()) + round - 1, last, &own));
  }
  return drafts;
}

TEST(ModelDraftSourceTest, MtpDraftsAreTheModuleOverTheTargetsHiddenStates) {
  const std::string fixture = testing::ModelDir("deepseek_v3");
  EMBER_REQUIRE_DIR(fixture);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("ember_mtp_source_" + std::to_string(::getpid())))
                              .string();
  testing::WriteMtpCheckpoint(fixture, dir, {});
  auto target = testing::LoadModel(dir);
  ASSERT_NE(target, nullptr);
  ASSERT_TRUE(target->AllocateKvCache(4, 16).ok());
  ModelLoadOptions opts;
  opts.mtp_module = true;
  auto module = Model::Load(dir, opts);
  ASSERT_TRUE(module.ok()) << module.message();
  auto source = ModelDraftSource::Create(std::move(*module), 512, {});
  ASSERT_TRUE(source.ok()) << source.message();
  EXPECT_EQ((*source)->name(), "mtp");
  ASSERT_TRUE((*source)->wants_hidden_states());
  const auto d = static_cast<size_t>(target->config().hidden_size);
  // The target computed the prompt but its last (sampled) token: hidden rows h_0..h_10.
  std::vector<int32_t> tokens = {5, 17, 300, 42, 7, 99, 256, 3, 11, 480, 64, 200};
  std::vector<float> hidden;
  StepArgmax(*target, std::vector<int32_t>(tokens.begin(), tokens.end() - 1), 0, {}, &hidden);
  (*source)->ObserveHidden(1, 0, hidden);
  std::vector<int32_t> out;
  (*source)->Propose(1, tokens, 3, &out);
  EXPECT_EQ(out, MtpByHand(dir, tokens, hidden, 3));
  EXPECT_EQ((*source)->fed_tokens(), 11 + 2);  // the shifted prompt, then two chained rows
  // The first draft kept, the second replaced: the target computed the last token and the draft
  // (positions 11 and 12), whose hidden rows come next; the module's chained rows are not kept.
  ASSERT_EQ(out.size(), 3u);
  const int32_t bonus = (out[1] + 1) % 512;
  StepArgmax(*target, {tokens.back(), out[0]}, 11, {}, &hidden);
  (*source)->ObserveHidden(1, 11, std::span<const float>(hidden).subspan(11 * d));
  tokens.push_back(out[0]);
  tokens.push_back(bonus);
  (*source)->Propose(1, tokens, 2, &out);
  EXPECT_EQ(out, MtpByHand(dir, tokens, hidden, 2));
  // Positions 11 (its chained row replaced by the target's) and 12, then one chained row.
  EXPECT_EQ((*source)->fed_tokens(), 13 + 3);
  EXPECT_EQ((*source)->missing_hidden(), 0);

  // At most 4 held rows: of a new sequence's 11 observed rows the oldest 7 are dropped, and its
  // first draft feeds zeros for them.
  ModelLoadOptions small_opts;
  small_opts.mtp_module = true;
  auto small_module = Model::Load(dir, small_opts);
  ASSERT_TRUE(small_module.ok()) << small_module.message();
  ModelDraftSource::Options small;
  small.max_held_hidden_rows = 4;
  auto capped = ModelDraftSource::Create(std::move(*small_module), 512, small);
  ASSERT_TRUE(capped.ok()) << capped.message();
  (*capped)->ObserveHidden(2, 0, std::span<const float>(hidden).first(11 * d));
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + 12);
  (*capped)->Propose(2, first, 1, &out);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ((*capped)->missing_hidden(), 7);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ember
