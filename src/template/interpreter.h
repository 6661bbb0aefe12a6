// Interpreter: renders a parsed Program with a set of variables, following jinja2's semantics
// (scoping: for-loop bodies and macros get their own frame, `if` does not; `set` writes the
// innermost frame; namespaces are the way out). One Interpreter per render; the Program is only
// read, so many renders of one Program may run on different threads at once.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "template/ast.h"
#include "template/value.h"

namespace ember::tmpl {

// Renders `program`; throws TemplateError with line/column on any error.
std::string RenderProgram(const Program& program,
                          const std::vector<std::pair<std::string, Value>>& variables);

}  // namespace ember::tmpl
