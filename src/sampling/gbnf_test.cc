// GBNF grammars: the parser reads every construct and refuses bad grammars naming the rule and
// the position; the recogniser accepts exactly the grammar's sentences (tables of cases), never
// dead-ends (every reachable state can still reach a complete sentence), and bounds hostile
// grammars with a clear error; a grammar constraint's masks on real vocabularies equal a
// brute-force check of every token (does the text so far plus the token stay a prefix of a
// sentence?), and its walks end only where the grammar accepts.
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <random>
#include <set>
#include <string>

#include "sampling/constraint_walk.h"
#include "sampling/gbnf_automaton.h"
#include "sampling/gbnf_constraint.h"
#include "sampling/gbnf_grammar.h"
#include "tokenizer/tokenizer.h"
#include "util/testing.h"

namespace ember {
namespace {

std::shared_ptr<const GbnfGrammar> Grammar(const std::string& text) {
  auto g = ParseGbnf(text, "grammar");
  EXPECT_TRUE(g.ok()) << text << "\n" << g.message();
  return g.ok() ? *g : nullptr;
}

// The error of a bad grammar ("" if it parsed).
std::string ErrorOf(const std::string& text) {
  auto g = ParseGbnf(text, "grammar");
  return g.ok() ? std::string() : g.message();
}

bool Matches(GbnfAutomaton& a, const std::string& text) {
  const int32_t s = a.Walk(a.start(), text);
  return s != GbnfAutomaton::kDead && a.Accepting(s);
}

struct Case {
  const char* grammar;
  std::vector<std::string> accept, reject;
};

TEST(GbnfTest, EachConstructMatchesItsLanguage) {
  const Case cases[] = {
      {R"(root ::= "abc")", {"abc"}, {"", "ab", "abcd", "abd"}},
      {R"(root ::= "a" | "bc" | "")", {"a", "bc", ""}, {"b", "abc"}},
      {R"(root ::= ("a" | "b") "c")", {"ac", "bc"}, {"c", "abc"}},
      {R"(root ::= "a"*)", {"", "a", "aaaa"}, {"b", "ab"}},
      {R"(root ::= "a"+ "b")", {"ab", "aaab"}, {"b", "aa"}},
      {R"(root ::= "a"? "b")", {"b", "ab"}, {"aab", "a"}},
      {R"(root ::= "a"{3})", {"aaa"}, {"aa", "aaaa"}},
      {R"(root ::= "a"{2,4})", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"}},
      {R"(root ::= "a"{2,})", {"aa", "aaaaaaa"}, {"a", ""}},
      {R"(root ::= "a"{,2})", {"", "a", "aa"}, {"aaa"}},
      {R"(root ::= ("ab"){0,1} "c")", {"c", "abc"}, {"ababc"}},
      {R"(root ::= [a-c0-9_]+)", {"a", "c9_", "0"}, {"d", "A", ""}},
      {R"(root ::= [^a-c"]+)", {"d", "xyz", "é", "北京", "👍"}, {"a", "\"", "xa"}},
      {R"(root ::= .)", {"a", "\n", "é", "👍", "\x7f"}, {"", "ab", "\xff", "\xc3", "\xed\xa0\x80"}},
      {R"(root ::= "\n\t\"\\\x41\u00e9\U0001F44D\[\]")", {"\n\t\"\\Aé👍[]"}, {"n"}},
      {R"(root ::= [\u00e0-\u00ff])", {"à", "ÿ", "é"}, {"a", "Ā"}},
      {R"(root ::= [\]\-\\])", {"]", "-", "\\"}, {"a"}},
      {R"(root ::= "北" [京])", {"北京"}, {"北"}},
      {"# a comment\nroot ::= a b # trailing\na ::= \"x\"\n# between\nb ::= \"y\"", {"xy"}, {"x"}},
      // Alternatives continue on the next lines until the next rule.
      {"root ::= \"a\"\n   | \"b\"\nother ::= \"c\"", {"a", "b"}, {"c"}},
      // Right recursion, nesting, nullable loops.
      {R"g(root ::= "(" root ")" | "")g", {"", "()", "((()))"}, {"(", "())", ")("}},
      {R"(root ::= item ("," item)*
          item ::= [0-9]+ | "[" root? "]")",
       {"1", "1,22", "[]", "[1,[2,3]],4"}, {",", "1,", "[1"}},
      {R"(root ::= a*
          a ::= "x"?)", {"", "x", "xxx"}, {"y"}},
      {R"(root ::= ws "x" ws
          ws ::= [ \t\n]*)", {"x", "  x\n"}, {" ", "x x"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.grammar);
    auto g = Grammar(c.grammar);
    ASSERT_NE(g, nullptr);
    GbnfAutomaton a(g);
    for (const std::string& text : c.accept) EXPECT_TRUE(Matches(a, text)) << "'" << text << "'";
    for (const std::string& text : c.reject) EXPECT_FALSE(Matches(a, text)) << "'" << text << "'";
  }
}

TEST(GbnfTest, BadGrammarsAreErrorsNamingRuleAndPosition) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "the grammar is empty"},
      {"  # only a comment\n", "the grammar is empty"},
      {R"(start ::= "a")", "no rule named 'root'"},
      {R"(root ::= value)", "line 1, column 10 (rule 'root'): undefined rule 'value'"},
      {"root ::= \"a\"\nx ::= y", "line 2, column 7 (rule 'x'): undefined rule 'y'"},
      {R"(root ::= ("a" "b")", "(rule 'root'): unbalanced parentheses: '(' without ')'"},
      {R"(root ::= "a" ) "b")", "unexpected ')'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
      {R"(root ::= "abc)", "unterminated string literal"},
      {R"(root ::= [abc)", "unterminated character class"},
      {R"(root ::= "\q")", "unknown escape '\\q'"},
      {R"(root ::= "\u12")", "'\\u' needs 4 hex digits"},
      {R"(root ::= "\uD800")", "surrogate"},
      {R"(root ::= [z-a])", "end comes before its start"},
      {R"(root ::= [^\u0000-\U0010FFFF])", "matches nothing"},
      {R"(root ::= "a"{3,2})", "n < m"},
      {R"(root ::= "a"{x})", "bad repetition"},
      {R"(root ::= "a"{,})", "bad repetition"},
      {"root ::= \"\xff\"", "invalid UTF-8"},
      {"root ::= [\xc3]", "invalid UTF-8"},
      {"root ::= \"\xed\xa0\x80\"", "invalid UTF-8"},
      {R"(root ::= "a"{1001})", "repetition count above 1000"},
      {R"(root ::= "a"**)", "repetition of a repetition"},
      {R"(root ::= * "a")", "repeats nothing"},
      {R"(root ::= "a" = "b")", "unexpected '='"},
      {"root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]",
       "line 2, column 1: rule 'expr' is left-recursive"},
      {"root ::= a\na ::= b \"x\"\nb ::= \"\"? a | \"y\"", "rule 'a' is left-recursive"},
      {"root ::= \"x\" loop\nloop ::= \"y\" loop", "rule 'loop' derives no finite text"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string error = ErrorOf(text);
    EXPECT_NE(error.find(expected), std::string::npos) << text << "\ngot: " << error;
    EXPECT_EQ(error.rfind("grammar: ", 0), 0u) << error;
  }
  std::string big = "root ::= ";
  for (int i = 0; i < 11; ++i) big += "\"abcdefghij\"{1000} ";
  EXPECT_NE(ErrorOf(big).find("too large once repetitions"), std::string::npos) << ErrorOf(big);
  // Nesting multiplies only references: this is small (and matches 10^12 a's).
  EXPECT_EQ(ErrorOf("root ::= ((((\"a\"){1000}){1000}){1000}){1000}"), "");
  std::string deep = "root ::= ";
  for (int i = 0; i < 100; ++i) deep += "(";
  EXPECT_NE(ErrorOf(deep + "\"a\"").find("nested deeper than 64"), std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"" + std::string(70000, 'a') + "\"").find("longer than"),
            std::string::npos);
}

// Right recursion and tail loops through nullable rules are not left recursion.
TEST(GbnfTest, TailRecursionIsAccepted) {
  for (const char* text : {"root ::= \"a\" root | \"\"", "root ::= x? root | \"b\"\nx ::= \"a\"",
                           "root ::= a\na ::= b\nb ::= a | \"z\""}) {
    EXPECT_EQ(ErrorOf(text), "") << text;
  }
}

const char* kJsonGrammar = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

const char* kArithmeticGrammar = R"g(
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
)g";

const char* kListGrammar = R"(
root ::= "- " item ("\n- " item)* "\n"?
item ::= [A-Za-z ]{1,20} | "北京" | [\u3040-\u30ff]+
)";

// From every state a random byte walk reaches, a complete sentence is reachable (a bounded
// search over bytes), and some byte follows unless the state is terminal.
TEST(GbnfTest, NeverDeadEnds) {
  for (const char* text : {kJsonGrammar, kArithmeticGrammar, kListGrammar,
                           "root ::= (\"a\" | \"ab\")* \"c\"", "root ::= \"(\" root \")\" root | \"\""}) {
    SCOPED_TRACE(text);
    auto g = Grammar(text);
    ASSERT_NE(g, nullptr);
    GbnfAutomaton a(g);
    std::mt19937 rng(7);
    for (int walk = 0; walk < 30; ++walk) {
      int32_t s = a.start();
      for (int step = 0; step < 60; ++step) {
        std::vector<int> next;
        for (int b = 0; b < 256; ++b)
          if (a.Next(s, static_cast<uint8_t>(b)) != GbnfAutomaton::kDead) next.push_back(b);
        if (next.empty()) {
          ASSERT_TRUE(a.Terminal(s)) << "a dead end that is not a complete sentence";
          break;
        }
        // A complete sentence is reachable from here (breadth-first over bytes).
        std::set<int32_t> seen{s};
        std::deque<int32_t> queue{s};
        bool found = false;
        while (!queue.empty() && !found && seen.size() < 5000) {
          const int32_t q = queue.front();
          queue.pop_front();
          found = a.Accepting(q);
          for (int b = 0; b < 256 && !found; ++b) {
            const int32_t n = a.Next(q, static_cast<uint8_t>(b));
            if (n != GbnfAutomaton::kDead && seen.insert(n).second) queue.push_back(n);
          }
        }
        ASSERT_TRUE(found) << "no complete sentence reachable after step " << step;
        s = a.Next(s, static_cast<uint8_t>(next[rng() % next.size()]));
      }
    }
    EXPECT_EQ(a.error(), "");
  }
}

// A grammar whose live parses double with every byte: refused with a clear error within the
// bounds, quickly, instead of hanging the engine thread.
TEST(GbnfTest, HostileAmbiguityIsBounded) {
  auto g = Grammar("root ::= a\na ::= \"x\" a \"y\" | \"x\" a \"z\" | \"\"");
  ASSERT_NE(g, nullptr);
  GbnfAutomaton a(g);
  const auto start = std::chrono::steady_clock::now();
  const int32_t s = a.Walk(a.start(), std::string(64, 'x'));
  EXPECT_EQ(s, GbnfAutomaton::kDead);
  EXPECT_NE(a.error().find("too ambiguous"), std::string::npos) << a.error();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // And through a constraint: the mask is empty, the error says why.
  std::vector<std::optional<std::string>> pieces = {"x", "xx", "xxxxxxxx", "y", std::nullopt};
  for (int i = 0; i < 8; ++i) pieces.push_back(std::string(static_cast<size_t>(i) + 9, 'x'));
  auto c = MakeGbnfConstraint(TokenTexts::Build(pieces), g, {4});
  std::vector<uint8_t> allowed;
  int64_t count = c->Allowed(allowed);
  for (int i = 0; i < 40 && count > 0; ++i) {
    ASSERT_TRUE(c->Accept(2));  // eight more x
    count = c->Allowed(allowed);
  }
  EXPECT_EQ(count, 0);
  EXPECT_NE(GbnfConstraintError(*c).find("too ambiguous"), std::string::npos);
}

// A walk through the constraint whose every mask is checked against the brute force: a token is
// allowed iff the text so far plus its bytes is still a prefix of a sentence.
void CheckMasks(const std::shared_ptr<const TokenTexts>& texts, const char* grammar_text,
                int walks, int steps) {
  auto g = Grammar(grammar_text);
  ASSERT_NE(g, nullptr);
  GbnfAutomaton oracle(g);
  // A vocabulary that cannot start the grammar at all (TinyStories has no '{'): the mask must be
  // empty, and there is no walk.
  bool can_start = false;
  for (const auto& piece : texts->bytes)
    can_start |= piece && !piece->empty() && oracle.Walk(oracle.start(), *piece) != GbnfAutomaton::kDead;
  if (!can_start) {
    std::vector<uint8_t> allowed;
    EXPECT_EQ(MakeGbnfConstraint(texts, g, {})->Allowed(allowed), 0);
    return;
  }
  std::mt19937 rng(11);
  for (int w = 0; w < walks; ++w) {
    auto c = MakeGbnfConstraint(texts, g, {});
    const std::string text = testing::CheckedWalk(
        *c, texts->bytes,
        [&](const std::string& t) { return oracle.Walk(oracle.start(), t) != GbnfAutomaton::kDead; },
        [&](const std::vector<int32_t>& ids) { return ids[rng() % ids.size()]; }, steps);
    EXPECT_NE(oracle.Walk(oracle.start(), text), GbnfAutomaton::kDead) << text;
    EXPECT_EQ(GbnfConstraintError(*c), "");
  }
}

TEST(GbnfTest, MasksEqualBruteForceOnSmallVocabulary) {
  std::vector<std::optional<std::string>> pieces = {
      "{", "}", ":", "\"", "\":", "\"a", "a\"", "ab", "1", "12", "-", ".5", "e", " ", "\n", "\n  ",
      ",", ", \"", "[", "]", "true", "tr", "ue", "null", "\\", "\\n", "\\u00", "é", "\xc3",
      "\xa9", "北京", "(", ")", "+", "*", "- ", "x y", "\n- ", std::nullopt};
  auto texts = TokenTexts::Build(pieces);
  for (const char* g : {kJsonGrammar, kArithmeticGrammar, kListGrammar}) {
    SCOPED_TRACE(g);
    CheckMasks(texts, g, 20, 40);
  }
}

// Local walks visit each group of tokens whose bytes fall in the same byte classes once: with
// many tokens alike for a grammar (every one- and two-byte token, and names followed by what may
// or may not come after them), every mask still equals the brute force token by token.
TEST(GbnfTest, MasksEqualBruteForceWhenManyTokensShareByteClasses) {
  std::vector<std::optional<std::string>> pieces;
  const std::string second = "aqz_07 =()\n-\xE4\x80";
  for (int a = 0; a < 256; ++a) {
    pieces.push_back(std::string(1, static_cast<char>(a)));
    for (char b : second) pieces.push_back(std::string{static_cast<char>(a), b});
  }
  for (const char* p : {"total", "x1 = ", "rate", " = (", ") * ", " + ", "12 / ", "_a9", "a b"})
    pieces.push_back(p);
  pieces.push_back(std::nullopt);
  auto texts = TokenTexts::Build(pieces);
  const char* names = R"g(root ::= (line "\n")+
line ::= name " = " expr
expr ::= term ((" + " | " - ") term)*
term ::= factor ((" * " | " / ") factor)*
factor ::= [0-9]+ | name | "(" expr ")" | "-" factor
name ::= [a-z_] [a-z0-9_]*)g";
  for (const char* g : {names, kJsonGrammar, kArithmeticGrammar, kListGrammar}) {
    SCOPED_TRACE(g);
    CheckMasks(texts, g, 6, 30);
  }
}

std::shared_ptr<const TokenTexts> RealTexts(const std::string& dir) {
  auto tok = Tokenizer::Load(dir);
  EXPECT_TRUE(tok.ok()) << tok.message();
  if (!tok.ok()) return nullptr;
  return TokenTexts::Build((*tok)->TokenBytesTable((*tok)->vocab_size()));
}

// The fixture model's tokenizer (always there with the fixtures), then the fetched Llama 3 and
// Qwen3 ones.
TEST(GbnfTest, MasksEqualBruteForceOnRealVocabularies) {
  for (const std::string& dir : {testing::FixturesDir() + "/models/tinystories-656k",
                                testing::TokenizersDir() + "/llama3",
                                testing::TokenizersDir() + "/qwen3"}) {
    SCOPED_TRACE(dir);
    EMBER_REQUIRE_DIR(dir);
    auto texts = RealTexts(dir);
    ASSERT_NE(texts, nullptr);
    for (const char* g : {kJsonGrammar, kArithmeticGrammar, kListGrammar}) {
      SCOPED_TRACE(g);
      CheckMasks(texts, g, 2, 12);
    }
  }
}

// End ids come only where the grammar accepts, and complete the output.
TEST(GbnfTest, EndIdsOnlyWhereTheGrammarAccepts) {
  std::vector<std::optional<std::string>> pieces = {"a", "b", std::nullopt, "ab"};
  auto texts = TokenTexts::Build(pieces);
  auto g = Grammar("root ::= \"a\" \"b\"*");
  auto c = MakeGbnfConstraint(texts, g, {2});
  std::vector<uint8_t> allowed;
  EXPECT_EQ(c->Allowed(allowed), 2);  // a, ab
  EXPECT_EQ(allowed, (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_FALSE(c->Accept(2));
  auto c2 = c->Clone();
  ASSERT_TRUE(c->Accept(0));
  EXPECT_EQ(c->Allowed(allowed), 2);  // b, end
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_FALSE(c->Done());
  ASSERT_TRUE(c->Accept(2));
  EXPECT_TRUE(c->Done());
  // The clone kept its own state; a grammar with one sentence ends by itself.
  EXPECT_EQ(c2->Allowed(allowed), 2);
  auto fixed = MakeGbnfConstraint(texts, Grammar("root ::= \"ab\""), {2});
  ASSERT_TRUE(fixed->Accept(3));
  EXPECT_TRUE(fixed->Done());
  EXPECT_EQ(fixed->Allowed(allowed), 0);
}

// Requests with the same grammar text share one automaton and its masks; a bad grammar is an
// error naming the field each time.
TEST(GbnfTest, CacheSharesCompiledGrammars) {
  std::vector<std::optional<std::string>> pieces = {"a", "b", std::nullopt, "ab"};
  GbnfCache cache(TokenTexts::Build(pieces), {2});
  auto first = cache.Constraint("root ::= \"a\" \"b\"*", "grammar");
  ASSERT_TRUE(first.ok()) << first.message();
  auto second = cache.Constraint("root ::= \"a\" \"b\"*", "guided_grammar");
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*first)->Accept(3));
  std::vector<uint8_t> allowed;
  EXPECT_EQ((*second)->Allowed(allowed), 2);  // its own state: a, ab
  EXPECT_EQ(allowed, (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ((*first)->Allowed(allowed), 2);  // b, end
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 1, 1, 0}));
  auto bad = cache.Constraint("root ::= x", "structured_outputs.grammar");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message(), "structured_outputs.grammar: line 1, column 10 (rule 'root'): undefined rule 'x'");
}

}  // namespace
}  // namespace ember
