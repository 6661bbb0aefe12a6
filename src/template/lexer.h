// Lexer: turns a Jinja template source into a flat token stream (text runs, tag delimiters and
// expression tokens), applying whitespace control the way jinja2 does with transformers'
// settings: trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, `-`/`+` modifiers,
// comments dropped, {% raw %} kept verbatim. Pure function; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace ember::tmpl {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // text run, name, decoded string literal, number spelling, or operator
  int line = 1;
  int column = 1;
};

// Throws TemplateError (with line/column) on unterminated tags, strings or bad characters.
std::vector<Token> Lex(const std::string& source);

}  // namespace ember::tmpl
