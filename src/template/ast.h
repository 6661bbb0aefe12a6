// The template syntax tree the parser builds and the interpreter walks. A Program is immutable
// after Parse, so one Program may be rendered by many threads at once. Every node carries the
// line/column of its first token for error messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "template/value.h"

namespace ember::tmpl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // children (is_tuple for tuples)
  kDict,      // children: key0, value0, key1, value1...
  kGetAttr,   // children[0].name
  kGetItem,   // children[0][children[1]]
  kSlice,     // children[0][a:b:c]; children[1..3] may be null
  kCall,      // children[0](args, kwargs)
  kFilter,    // name(children[0] (may be null in filter blocks), args, kwargs)
  kTest,      // children[0] is name(args); negated
  kUnary,     // op children[0]: "-", "+", "not"
  kBinary,    // children[0] op children[1]: + - * / // % ** ~ and or == != < <= > >= in "not in"
  kCond,      // children[1] if children[0] else children[2] (may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  std::string name;  // name, attribute, filter/test name, or operator
  Value literal;
  bool is_tuple = false;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  kText,      // text
  kPrint,     // {{ expr }}
  kIf,        // conds[i] -> bodies[i]; else_body
  kFor,       // for targets in expr [if cond] [recursive: attr]: body else else_body
  kSet,       // set targets = expr, or set target.attr = expr (attr non-empty)
  kSetBlock,  // set targets[0] [| filters] %}body{% endset
  kMacro,     // macro name(params = defaults) body
  kCallBlock, // call(params) expr %}body{% endcall
  kFilterBlock, // filter filters %}body{% endfilter
  kBreak,
  kContinue,
  kDo,        // do expr
  kScope,     // body in a new frame, after setting targets[i] = conds[i] (with, generation)
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  int column = 0;
  std::string text;
  std::string attr;
  ExprPtr expr;
  ExprPtr cond;
  ExprPtr filter;  // a kFilter chain whose innermost target is null
  std::vector<std::string> targets;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // parallel to params; null when none
};

struct Program {
  Body body;
};

// Parses a template; throws TemplateError (with line/column) on syntax errors.
std::unique_ptr<Program> Parse(const std::string& source);

}  // namespace ember::tmpl
