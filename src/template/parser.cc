// Recursive-descent parser for the jinja2 grammar real chat templates use; mirrors jinja2's
// parser.py precedence: condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary <
// postfix (. [] ()) < filters/tests.
#include <cstdlib>

#include "template/ast.h"
#include "template/builtins.h"
#include "template/lexer.h"

namespace ember::tmpl {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  std::unique_ptr<Program> Run() {
    auto program = std::make_unique<Program>();
    std::string found;
    program->body = ParseUntil({}, &found);
    return program;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < toks_.size() ? toks_[i] : toks_.back();
  }
  const Token& Next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kName && Peek(ahead).text == name;
  }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }
  [[noreturn]] void Fail(const std::string& message) const {
    throw TemplateError("TemplateSyntaxError: " + message, Peek().line, Peek().column);
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kBlockEnd: return "end of statement block";
      case Tok::kVarEnd: return "end of print statement";
      default: return "'" + t.text + "'";
    }
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', got " + Describe(Peek()));
  }
  void ExpectBlockEnd() {
    if (Peek().type != Tok::kBlockEnd) Fail("expected end of statement block, got " + Describe(Peek()));
    ++pos_;
  }
  std::string ExpectName() {
    if (Peek().type != Tok::kName) Fail("expected a name, got " + Describe(Peek()));
    return Next().text;
  }
  template <typename Node, typename KindT>
  std::unique_ptr<Node> Make(KindT kind, const Token& at) {
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->line = at.line;
    node->column = at.column;
    return node;
  }

  // ---- statements ----

  Body ParseUntil(const std::vector<std::string>& ends, std::string* found) {
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.type == Tok::kEof) {
        if (!ends.empty()) {
          std::string expected;
          for (size_t i = ends.size(); i-- > 0;) expected += (expected.empty() ? "'" : " or '") + ends[i] + "'";
          Fail("unexpected end of template, expected " + expected);
        }
        return body;
      }
      if (t.type == Tok::kText) {
        auto s = Make<Stmt>(StmtKind::kText, t);
        s->text = t.text;
        body.push_back(std::move(s));
        ++pos_;
      } else if (t.type == Tok::kVarBegin) {
        auto s = Make<Stmt>(StmtKind::kPrint, t);
        ++pos_;
        s->expr = ParseTuple(true);
        if (Peek().type != Tok::kVarEnd) Fail("expected end of print statement, got " + Describe(Peek()));
        ++pos_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        if (Peek(1).type == Tok::kName) {
          for (const std::string& end : ends) {
            if (Peek(1).text == end) {
              pos_ += 2;
              *found = end;
              return body;
            }
          }
        }
        ++pos_;
        body.push_back(ParseStatement());
      } else {
        Fail("unexpected " + Describe(t));
      }
    }
  }

  StmtPtr ParseStatement() {
    const Token& at = Peek();
    std::string tag = ExpectName();
    std::string found;
    if (tag == "if") {
      auto s = Make<Stmt>(StmtKind::kIf, at);
      s->conds.push_back(ParseTuple(false));
      ExpectBlockEnd();
      while (true) {
        s->bodies.push_back(ParseUntil({"elif", "else", "endif"}, &found));
        if (found == "elif") {
          s->conds.push_back(ParseTuple(false));
          ExpectBlockEnd();
          continue;
        }
        if (found == "else") {
          ExpectBlockEnd();
          s->else_body = ParseUntil({"endif"}, &found);
        }
        break;
      }
      ExpectBlockEnd();
      return s;
    }
    if (tag == "for") {
      auto s = Make<Stmt>(StmtKind::kFor, at);
      s->targets = ParseTargets();
      if (!SkipName("in")) Fail("expected 'in', got " + Describe(Peek()));
      s->expr = ParseTuple(false);
      if (SkipName("if")) s->cond = ParseExpression(true);
      if (SkipName("recursive")) s->attr = "recursive";
      ExpectBlockEnd();
      s->body = ParseUntil({"endfor", "else"}, &found);
      if (found == "else") {
        ExpectBlockEnd();
        s->else_body = ParseUntil({"endfor"}, &found);
      }
      ExpectBlockEnd();
      return s;
    }
    if (tag == "set") {
      auto s = Make<Stmt>(StmtKind::kSet, at);
      if (Peek(1).type == Tok::kOp && Peek(1).text == ".") {
        s->targets.push_back(ExpectName());
        ++pos_;
        s->attr = ExpectName();
      } else {
        s->targets = ParseTargets();
      }
      if (SkipOp("=")) {
        s->expr = ParseTuple(true);
        ExpectBlockEnd();
        return s;
      }
      s->kind = StmtKind::kSetBlock;
      if (IsOp("|")) s->filter = ParseFilterChain(nullptr);
      ExpectBlockEnd();
      s->body = ParseUntil({"endset"}, &found);
      ExpectBlockEnd();
      return s;
    }
    if (tag == "macro") {
      auto s = Make<Stmt>(StmtKind::kMacro, at);
      s->text = ExpectName();
      ParseParams(*s);
      ExpectBlockEnd();
      s->body = ParseUntil({"endmacro"}, &found);
      ExpectBlockEnd();
      return s;
    }
    if (tag == "call") {
      auto s = Make<Stmt>(StmtKind::kCallBlock, at);
      if (IsOp("(")) ParseParams(*s);
      s->expr = ParseExpression(true);
      if (s->expr->kind != ExprKind::kCall) Fail("expected a call expression in 'call' block");
      ExpectBlockEnd();
      s->body = ParseUntil({"endcall"}, &found);
      ExpectBlockEnd();
      return s;
    }
    if (tag == "filter") {
      auto s = Make<Stmt>(StmtKind::kFilterBlock, at);
      s->filter = ParseFilterChain(nullptr, /*leading_pipe=*/false);
      ExpectBlockEnd();
      s->body = ParseUntil({"endfilter"}, &found);
      ExpectBlockEnd();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      auto s = Make<Stmt>(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, at);
      ExpectBlockEnd();
      return s;
    }
    if (tag == "do") {
      auto s = Make<Stmt>(StmtKind::kDo, at);
      s->expr = ParseTuple(true);
      ExpectBlockEnd();
      return s;
    }
    if (tag == "with") {
      auto s = Make<Stmt>(StmtKind::kScope, at);
      while (Peek().type != Tok::kBlockEnd) {
        if (!s->targets.empty()) ExpectOp(",");
        s->targets.push_back(ExpectName());
        ExpectOp("=");
        s->conds.push_back(ParseExpression(true));
      }
      ExpectBlockEnd();
      s->body = ParseUntil({"endwith"}, &found);
      ExpectBlockEnd();
      return s;
    }
    if (tag == "generation") {
      auto s = Make<Stmt>(StmtKind::kScope, at);
      ExpectBlockEnd();
      s->body = ParseUntil({"endgeneration"}, &found);
      ExpectBlockEnd();
      return s;
    }
    pos_--;
    Fail("Encountered unknown tag '" + tag + "'");
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    bool paren = SkipOp("(");
    names.push_back(ExpectName());
    while (SkipOp(",")) {
      if (Peek().type != Tok::kName || IsName("in")) break;
      names.push_back(ExpectName());
    }
    if (paren) ExpectOp(")");
    return names;
  }

  void ParseParams(Stmt& s) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s.params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      s.params.push_back(ExpectName());
      s.defaults.push_back(SkipOp("=") ? ParseExpression(true) : nullptr);
    }
    ExpectOp(")");
  }

  // ---- expressions ----

  ExprPtr ParseTuple(bool with_condexpr) {
    const Token& at = Peek();
    ExprPtr first = ParseExpression(with_condexpr);
    if (!IsOp(",")) return first;
    auto tuple = Make<Expr>(ExprKind::kList, at);
    tuple->is_tuple = true;
    tuple->children.push_back(std::move(first));
    while (SkipOp(",")) {
      Tok t = Peek().type;
      if (t == Tok::kBlockEnd || t == Tok::kVarEnd || IsOp(")") || IsName("in")) break;
      tuple->children.push_back(ParseExpression(with_condexpr));
    }
    return tuple;
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    if (!with_condexpr) return ParseOr();
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      auto cond = Make<Expr>(ExprKind::kCond, Next());
      cond->children.push_back(ParseOr());
      cond->children.push_back(std::move(expr));
      cond->children.push_back(SkipName("else") ? ParseExpression(true) : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr Binary(const Token& at, std::string op, ExprPtr lhs, ExprPtr rhs) {
    auto node = Make<Expr>(ExprKind::kBinary, at);
    node->name = std::move(op);
    node->children.push_back(std::move(lhs));
    node->children.push_back(std::move(rhs));
    return node;
  }

  ExprPtr ParseOr() {
    ExprPtr lhs = ParseAnd();
    while (IsName("or")) {
      const Token& at = Next();
      lhs = Binary(at, "or", std::move(lhs), ParseAnd());
    }
    return lhs;
  }
  ExprPtr ParseAnd() {
    ExprPtr lhs = ParseNot();
    while (IsName("and")) {
      const Token& at = Next();
      lhs = Binary(at, "and", std::move(lhs), ParseNot());
    }
    return lhs;
  }
  ExprPtr ParseNot() {
    if (IsName("not")) {
      auto node = Make<Expr>(ExprKind::kUnary, Next());
      node->name = "not";
      node->children.push_back(ParseNot());
      return node;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr lhs = ParseMath1();
    while (true) {
      const Token& at = Peek();
      std::string op;
      if (at.type == Tok::kOp && (at.text == "==" || at.text == "!=" || at.text == "<" ||
                                  at.text == "<=" || at.text == ">" || at.text == ">=")) {
        op = at.text;
        ++pos_;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else {
        return lhs;
      }
      lhs = Binary(at, op, std::move(lhs), ParseMath1());
    }
  }
  ExprPtr ParseMath1() {
    ExprPtr lhs = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& at = Next();
      lhs = Binary(at, at.text, std::move(lhs), ParseConcat());
    }
    return lhs;
  }
  ExprPtr ParseConcat() {
    ExprPtr lhs = ParseMath2();
    while (IsOp("~")) {
      const Token& at = Next();
      lhs = Binary(at, "~", std::move(lhs), ParseMath2());
    }
    return lhs;
  }
  ExprPtr ParseMath2() {
    ExprPtr lhs = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& at = Next();
      lhs = Binary(at, at.text, std::move(lhs), ParsePow());
    }
    return lhs;
  }
  ExprPtr ParsePow() {
    ExprPtr lhs = ParseUnary(true);
    while (IsOp("**")) {
      const Token& at = Next();
      lhs = Binary(at, "**", std::move(lhs), ParseUnary(true));
    }
    return lhs;
  }
  ExprPtr ParseUnary(bool with_filter) {
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = Make<Expr>(ExprKind::kUnary, Peek());
      node->name = Next().text;
      node->children.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    return with_filter ? ParseFilterExpr(std::move(node)) : std::move(node);
  }

  ExprPtr Literal(const Token& at, Value v) {
    auto node = Make<Expr>(ExprKind::kLiteral, at);
    node->literal = std::move(v);
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& at = Peek();
    switch (at.type) {
      case Tok::kName: {
        ++pos_;
        const std::string& n = at.text;
        if (n == "true" || n == "True") return Literal(at, Value::Bool(true));
        if (n == "false" || n == "False") return Literal(at, Value::Bool(false));
        if (n == "none" || n == "None") return Literal(at, Value::None());
        auto node = Make<Expr>(ExprKind::kName, at);
        node->name = n;
        return node;
      }
      case Tok::kString: {
        std::string s;
        while (Peek().type == Tok::kString) s += Next().text;
        return Literal(at, Value::Str(std::move(s)));
      }
      case Tok::kInt: ++pos_; return Literal(at, Value::Int(std::strtoll(at.text.c_str(), nullptr, 10)));
      case Tok::kFloat: ++pos_; return Literal(at, Value::Float(std::strtod(at.text.c_str(), nullptr)));
      default: break;
    }
    if (SkipOp("(")) {
      if (SkipOp(")")) {
        auto tuple = Make<Expr>(ExprKind::kList, at);
        tuple->is_tuple = true;
        return tuple;
      }
      ExprPtr inner = ParseTuple(true);
      ExpectOp(")");
      return inner;
    }
    if (SkipOp("[")) {
      auto list = Make<Expr>(ExprKind::kList, at);
      while (!IsOp("]")) {
        if (!list->children.empty()) ExpectOp(",");
        if (IsOp("]")) break;
        list->children.push_back(ParseExpression(true));
      }
      ExpectOp("]");
      return list;
    }
    if (SkipOp("{")) {
      auto dict = Make<Expr>(ExprKind::kDict, at);
      while (!IsOp("}")) {
        if (!dict->children.empty()) ExpectOp(",");
        if (IsOp("}")) break;
        dict->children.push_back(ParseExpression(true));
        ExpectOp(":");
        dict->children.push_back(ParseExpression(true));
      }
      ExpectOp("}");
      return dict;
    }
    Fail("unexpected " + Describe(at));
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      const Token& at = Peek();
      if (SkipOp(".")) {
        if (Peek().type == Tok::kInt) {
          auto item = Make<Expr>(ExprKind::kGetItem, at);
          item->children.push_back(std::move(node));
          item->children.push_back(Literal(Peek(), Value::Int(std::strtoll(Next().text.c_str(), nullptr, 10))));
          node = std::move(item);
        } else {
          auto attr = Make<Expr>(ExprKind::kGetAttr, at);
          attr->name = ExpectName();
          attr->children.push_back(std::move(node));
          node = std::move(attr);
        }
      } else if (SkipOp("[")) {
        node = ParseSubscript(at, std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(const Token& at, ExprPtr target) {
    ExprPtr start;
    if (!IsOp(":")) start = ParseExpression(true);
    if (!IsOp(":")) {
      ExpectOp("]");
      auto item = Make<Expr>(ExprKind::kGetItem, at);
      item->children.push_back(std::move(target));
      item->children.push_back(std::move(start));
      return item;
    }
    ++pos_;
    auto slice = Make<Expr>(ExprKind::kSlice, at);
    slice->children.push_back(std::move(target));
    slice->children.push_back(std::move(start));
    slice->children.push_back(IsOp("]") || IsOp(":") ? nullptr : ParseExpression(true));
    ExprPtr step;
    if (SkipOp(":") && !IsOp("]")) step = ParseExpression(true);
    slice->children.push_back(std::move(step));
    ExpectOp("]");
    return slice;
  }

  void ParseArgs(Expr& node) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        ++pos_;
        node.kwargs.emplace_back(key, ParseExpression(true));
      } else {
        if (!node.kwargs.empty()) Fail("positional argument follows keyword argument");
        node.args.push_back(ParseExpression(true));
      }
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto call = Make<Expr>(ExprKind::kCall, Peek());
    call->line = callee->line;
    call->column = callee->column;
    call->children.push_back(std::move(callee));
    ParseArgs(*call);
    return call;
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        node = ParseFilterChain(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterChain(ExprPtr node, bool leading_pipe = true) {
    while (!leading_pipe || IsOp("|")) {
      if (leading_pipe) ++pos_;
      leading_pipe = true;
      auto filter = Make<Expr>(ExprKind::kFilter, Peek());
      filter->name = ExpectName();
      while (IsOp(".") && Peek(1).type == Tok::kName) {
        pos_++;
        filter->name += "." + Next().text;
      }
      filter->children.push_back(std::move(node));
      if (IsOp("(")) ParseArgs(*filter);
      node = std::move(filter);
    }
    return node;
  }

  ExprPtr ParseTest(ExprPtr node) {
    auto test = Make<Expr>(ExprKind::kTest, Next());
    test->negated = SkipName("not");
    test->name = ExpectName();
    while (IsOp(".") && Peek(1).type == Tok::kName) {
      pos_++;
      test->name += "." + Next().text;
    }
    test->children.push_back(std::move(node));
    const Token& t = Peek();
    if (IsOp("(")) {
      ParseArgs(*test);
    } else if ((t.type == Tok::kName || t.type == Tok::kString || t.type == Tok::kInt ||
                t.type == Tok::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) Fail("You cannot chain multiple tests with is");
      test->args.push_back(ParsePostfix(ParsePrimary()));
    }
    return test;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
};

// jinja2 rejects unknown filters and tests when it compiles a template, except inside an `if`
// statement or inline if-expression ("soft" frames), where the error waits until the filter is
// actually applied. Loop, macro, call, filter, with and set-block bodies are new frames and are
// never soft. `soft` says whether the code being visited sits in a soft frame.
void ValidateNames(const Expr* e, bool soft) {
  if (e == nullptr) return;
  if (e->kind == ExprKind::kCond) soft = true;
  if (!soft && e->kind == ExprKind::kFilter && !IsFilter(e->name))
    throw TemplateError("TemplateAssertionError: No filter named '" + e->name + "'.", e->line, e->column);
  if (!soft && e->kind == ExprKind::kTest && !IsTest(e->name))
    throw TemplateError("TemplateAssertionError: No test named '" + e->name + "'.", e->line, e->column);
  for (const ExprPtr& c : e->children) ValidateNames(c.get(), soft);
  for (const ExprPtr& c : e->args) ValidateNames(c.get(), soft);
  for (const auto& [k, c] : e->kwargs) ValidateNames(c.get(), soft);
}

void ValidateNames(const Body& body, bool soft) {
  for (const StmtPtr& s : body) {
    switch (s->kind) {
      case StmtKind::kIf:
        for (const ExprPtr& c : s->conds) ValidateNames(c.get(), true);
        for (const Body& b : s->bodies) ValidateNames(b, true);
        ValidateNames(s->else_body, true);
        break;
      case StmtKind::kFor:
        ValidateNames(s->expr.get(), soft);
        ValidateNames(s->cond.get(), false);
        ValidateNames(s->body, false);
        ValidateNames(s->else_body, false);
        break;
      case StmtKind::kMacro:
        for (const ExprPtr& d : s->defaults) ValidateNames(d.get(), false);
        ValidateNames(s->body, false);
        break;
      case StmtKind::kSetBlock:
      case StmtKind::kFilterBlock:
        ValidateNames(s->filter.get(), false);
        ValidateNames(s->body, false);
        break;
      case StmtKind::kCallBlock:
        ValidateNames(s->expr.get(), soft);
        for (const ExprPtr& d : s->defaults) ValidateNames(d.get(), false);
        ValidateNames(s->body, false);
        break;
      case StmtKind::kScope:
        for (const ExprPtr& c : s->conds) ValidateNames(c.get(), soft);
        ValidateNames(s->body, false);
        break;
      default:
        ValidateNames(s->expr.get(), soft);
    }
  }
}

}  // namespace

std::unique_ptr<Program> Parse(const std::string& source) {
  std::unique_ptr<Program> program = Parser(Lex(source)).Run();
  ValidateNames(program->body, false);
  return program;
}

}  // namespace ember::tmpl
