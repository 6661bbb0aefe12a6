// The interpreter's built-in behaviour, as jinja2 inside transformers'
// ImmutableSandboxedEnvironment defines it: attribute and item lookup (including the Python
// methods of str, dict and list that templates call), operators, iteration, filters, tests and
// global functions. Errors are thrown as TemplateError without a position (the caller adds it).
// Stateless free functions; safe to call from any thread on values owned by that thread.
#pragma once

#include <string>
#include <vector>

#include "template/value.h"

namespace ember::tmpl {

// obj.name: dict key or method, str/list method, namespace attribute; Undefined when missing.
Value GetAttr(const Value& obj, const std::string& name);
// obj[key]: dict key, list/str index (negative ok); Undefined when missing.
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] for lists and strings; Undefined bounds mean "omitted".
Value SliceOf(const Value& obj, const Value& start, const Value& stop, const Value& step);
// + - * / // % ** ~ == != < <= > >= in, "not in".
Value BinaryOp(const std::string& op, const Value& a, const Value& b);
bool Contains(const Value& container, const Value& item);
// Python iteration: list items, dict keys, str code points; Undefined iterates as empty.
std::vector<Value> Iterate(const Value& v);

// Whether a filter / test exists: jinja2 rejects unknown ones when it compiles the template.
bool IsFilter(const std::string& name);
bool IsTest(const std::string& name);
Value ApplyFilter(const std::string& name, const Value& target, CallArgs& args);
bool ApplyTest(const std::string& name, const Value& v, CallArgs& args);
// Globals every render sees: range, dict, namespace, raise_exception, strftime_now, ...
std::vector<std::pair<std::string, Value>> MakeGlobals();

// Argument helpers shared by the built-ins.
Value Arg(const CallArgs& args, size_t index, const std::string& name, const Value& fallback);
std::string StrArg(const CallArgs& args, size_t index, const std::string& name, const std::string& fallback);

}  // namespace ember::tmpl
