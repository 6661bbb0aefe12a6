// Interpreter tests against jinja2 itself: testdata/jinja_cases.json holds small templates and
// what jinja2 (configured as transformers configures it) rendered for them, or the error it
// raised. Regenerate with testdata/gen_jinja_cases.py.
#include <gtest/gtest.h>

#include "template/ast.h"
#include "template/builtins.h"
#include "template/interpreter.h"
#include "util/mapped_file.h"

namespace ember::tmpl {
namespace {

using ojson = nlohmann::ordered_json;

ojson LoadCases() {
  auto text = ReadFileToString(std::string(EMBER_TEMPLATE_TESTDATA) + "/jinja_cases.json");
  CHECK(text.ok()) << text.message();
  return ojson::parse(*text)["cases"];
}

// Renders one case; returns the output, or "ERROR: message" when parsing or rendering failed.
std::string RenderCase(const ojson& c) {
  try {
    std::unique_ptr<Program> program = Parse(c["template"].get<std::string>());
    std::vector<std::pair<std::string, Value>> vars;
    for (auto it = c["context"].begin(); it != c["context"].end(); ++it)
      vars.emplace_back(it.key(), Value::FromJson(it.value()));
    return RenderProgram(*program, vars);
  } catch (const TemplateError& e) {
    return "ERROR: " + std::string(e.what()) + " at " + std::to_string(e.line) + ":" + std::to_string(e.column);
  }
}

TEST(Jinja, MatchesJinja2OnEveryCase) {
  ojson cases = LoadCases();
  ASSERT_GT(cases.size(), 50u);
  for (const ojson& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
    std::string got = RenderCase(c);
    if (c.contains("error")) {
      EXPECT_EQ(got.rfind("ERROR: ", 0), 0u) << "jinja2 raised " << c["error"] << " but we rendered: " << got;
    } else {
      EXPECT_EQ(got, c["expected"].get<std::string>());
    }
  }
}

TEST(Jinja, ErrorsCarryTheRaisingExpressionsPosition) {
  ojson c = {{"template", "line one\n{% for m in ms %}\n   {{ m.content + 1 }}\n{% endfor %}"},
             {"context", {{"ms", ojson::array({{{"content", "x"}}})}}}};
  std::string got = RenderCase(c);
  EXPECT_NE(got.find("at 3:"), std::string::npos) << got;
  EXPECT_NE(got.find("TypeError"), std::string::npos) << got;
}

// Where Python would recurse until RecursionError or allocate without bound, we fail cleanly.
TEST(Jinja, HostileTemplatesFailInsteadOfCrashing) {
  for (const char* source : {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                             "{{ 'x' * 1000000000000 }}", "{{ 9223372036854775807 + 1 }}",
                             "{{ 3 ** 100 }}", "{{ range(1000000) | length }}", "{% raw %}{{ x }}"}) {
    SCOPED_TRACE(source);
    ojson c = {{"template", source}, {"context", ojson::object()}};
    EXPECT_EQ(RenderCase(c).rfind("ERROR: ", 0), 0u);
  }
}

// The compile-time name check and the dispatch agree: every known name is implemented.
TEST(Jinja, EveryKnownFilterAndTestIsImplemented) {
  for (const char* name : {"abs", "attr", "batch", "capitalize", "center", "count", "d", "default",
                           "dictsort", "e", "escape", "first", "float", "forceescape", "format",
                           "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
                           "max", "min", "pprint", "reject", "rejectattr", "replace", "reverse",
                           "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
                           "tojson", "trim", "truncate", "slice", "unique", "upper", "wordcount"}) {
    ASSERT_TRUE(IsFilter(name)) << name;
    CallArgs args;
    try {
      ApplyFilter(name, Value::MakeList(), args);
    } catch (const TemplateError& e) {
      EXPECT_EQ(std::string(e.what()).find("No filter named"), std::string::npos) << name;
    }
  }
  EXPECT_FALSE(IsFilter("nosuchfilter"));
  for (const char* name : {"defined", "undefined", "none", "string", "mapping", "iterable", "sequence",
                           "number", "integer", "float", "boolean", "true", "false", "callable", "odd",
                           "even", "divisibleby", "eq", "ne", "lt", "le", "gt", "ge", "in", "sameas",
                           "lower", "upper", "escaped", "equalto", "greaterthan", "lessthan"}) {
    ASSERT_TRUE(IsTest(name)) << name;
    CallArgs args;
    args.positional.push_back(Value::MakeList());
    try {
      ApplyTest(name, Value::Int(2), args);
    } catch (const TemplateError& e) {
      EXPECT_EQ(std::string(e.what()).find("No test named"), std::string::npos) << name;
    }
  }
}

TEST(Jinja, ProgramIsReusableAcrossRenders) {
  std::unique_ptr<Program> program = Parse("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}");
  for (int total : {3, 6}) {
    List xs;
    for (int i = 1; i <= (total == 3 ? 2 : 3); ++i) xs.push_back(Value::Int(i));
    EXPECT_EQ(RenderProgram(*program, {{"xs", Value::MakeList(xs)}}), std::to_string(total));
  }
}

}  // namespace
}  // namespace ember::tmpl
