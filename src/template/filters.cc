// jinja2's built-in filters and tests, transformers' tojson, and the global functions a chat
// template sees (range, dict, namespace, raise_exception, strftime_now, joiner, cycler).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "template/builtins.h"
#include "template/pystr.h"

namespace ember::tmpl {
namespace {

// jinja2's make_attrgetter: "a.b.0" walks item lookups; an empty attribute is the item itself.
Value AttrPath(const Value& item, const std::string& path) {
  if (path.empty()) return item;
  Value cur = item;
  for (const std::string& part : pystr::Split(path, std::string("."), -1)) {
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = GetItem(cur, numeric ? Value::Int(std::stoll(part)) : Value::Str(part));
  }
  return cur;
}

Value Lowered(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value::Str(pystr::Lower(v.str())) : v;
}

CallArgs Rest(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

// select/reject/selectattr/rejectattr share one implementation.
Value SelectFilter(const Value& seq, const CallArgs& args, bool attr, bool keep) {
  std::string attribute = attr ? StrArg(args, 0, "attribute", "") : "";
  size_t test_index = attr ? 1 : 0;
  const Value* test = args.Get(test_index, "__test__");
  CallArgs test_args = Rest(args, test_index + 1);
  List out;
  for (const Value& item : Iterate(seq)) {
    Value v = attr ? AttrPath(item, attribute) : item;
    bool ok = test != nullptr ? ApplyTest(ToStr(*test), v, test_args) : v.Truthy();
    if (ok == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

Value SortFilter(const Value& seq, const CallArgs& args) {
  bool reverse = Arg(args, 0, "reverse", Value::Bool(false)).Truthy();
  bool case_sensitive = Arg(args, 1, "case_sensitive", Value::Bool(false)).Truthy();
  std::string attribute = StrArg(args, 2, "attribute", "");
  List items = Iterate(seq);
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    Value x = Lowered(AttrPath(a, attribute), case_sensitive);
    Value y = Lowered(AttrPath(b, attribute), case_sensitive);
    return reverse ? Less(y, x) : Less(x, y);
  });
  return Value::MakeList(std::move(items));
}

Value DictSort(const Value& d, const CallArgs& args) {
  if (!d.is_dict()) throw TemplateError("TypeError: dictsort expects a mapping");
  bool case_sensitive = Arg(args, 0, "case_sensitive", Value::Bool(false)).Truthy();
  bool by_value = StrArg(args, 1, "by", "key") == "value";
  bool reverse = Arg(args, 2, "reverse", Value::Bool(false)).Truthy();
  List items;
  for (const auto& [k, v] : d.dict().items) items.push_back(Value::MakeList({k, v}, true));
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    Value x = Lowered(a.list()[by_value ? 1 : 0], case_sensitive);
    Value y = Lowered(b.list()[by_value ? 1 : 0], case_sensitive);
    return reverse ? Less(y, x) : Less(x, y);
  });
  return Value::MakeList(std::move(items));
}

std::string Indent(const std::string& s_in, const CallArgs& args) {
  Value width = Arg(args, 0, "width", Value::Int(4));
  bool first = Arg(args, 1, "first", Value::Bool(false)).Truthy();
  bool blank = Arg(args, 2, "blank", Value::Bool(false)).Truthy();
  std::string indention = width.is_string() ? width.str() : std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 1 << 16)), ' ');
  std::string s = s_in + "\n";
  std::vector<std::string> lines = pystr::SplitLines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
  }
  return first ? indention + rv : rv;
}

Value ToJsonFilter(const Value& v, const CallArgs& args) {
  Value indent_v = Arg(args, 1, "indent", Value::None());
  int indent = indent_v.is_number() ? static_cast<int>(indent_v.as_int()) : -1;
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  Value seps = Arg(args, 2, "separators", Value::None());
  if (seps.is_list() && seps.list().size() == 2) {
    item_sep = ToStr(seps.list()[0]);
    key_sep = ToStr(seps.list()[1]);
  }
  bool ensure_ascii = Arg(args, 0, "ensure_ascii", Value::Bool(false)).Truthy();
  bool sort_keys = Arg(args, 3, "sort_keys", Value::Bool(false)).Truthy();
  return Value::Str(ToJson(v, indent, item_sep, key_sep, ensure_ascii, sort_keys));
}

Value Round(const Value& v, const CallArgs& args) {
  int64_t precision = Arg(args, 0, "precision", Value::Int(0)).as_int();
  std::string method = StrArg(args, 1, "method", "common");
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_float() * scale;
  double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::Float(r / scale);
}

Value IntFilter(const Value& v, const CallArgs& args) {
  Value fallback = Arg(args, 0, "default", Value::Int(0));
  if (v.is_number()) return Value::Int(v.as_int());
  if (v.is_string()) {
    std::string s = pystr::Strip(v.str(), std::nullopt, true, true);
    try {
      size_t used = 0;
      int64_t i = std::stoll(s, &used, static_cast<int>(Arg(args, 1, "base", Value::Int(10)).as_int()));
      if (used == s.size()) return Value::Int(i);
      size_t fused = 0;
      double d = std::stod(s, &fused);
      if (fused == s.size()) return Value::Int(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value FloatFilter(const Value& v, const CallArgs& args) {
  if (v.is_number()) return Value::Float(v.as_float());
  if (v.is_string()) {
    try {
      size_t used = 0;
      double d = std::stod(v.str(), &used);
      if (used == v.str().size()) return Value::Float(d);
    } catch (const std::exception&) {
    }
  }
  return Arg(args, 0, "default", Value::Float(0.0));
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value MinMax(const Value& seq, const CallArgs& args, bool max) {
  bool case_sensitive = Arg(args, 0, "case_sensitive", Value::Bool(false)).Truthy();
  std::string attribute = StrArg(args, 1, "attribute", "");
  List items = Iterate(seq);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    Value a = Lowered(AttrPath(items[i], attribute), case_sensitive);
    Value b = Lowered(AttrPath(items[best], attribute), case_sensitive);
    if (max ? Less(b, a) : Less(a, b)) best = i;
  }
  return items[best];
}

}  // namespace

bool IsFilter(const std::string& name) {
  static const std::set<std::string> kFilters = {
      "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
      "escape", "first", "float", "forceescape", "format", "indent", "int", "items", "join", "last",
      "length", "list", "lower", "map", "max", "min", "pprint", "reject", "rejectattr", "replace",
      "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson",
      "trim", "truncate", "slice", "unique", "upper", "wordcount"};
  return kFilters.count(name) > 0;
}

bool IsTest(const std::string& name) {
  static const std::set<std::string> kTests = {
      "!=", "<", "<=", "==", ">", ">=", "boolean", "callable", "defined", "divisibleby", "eq",
      "equalto", "escaped", "even", "false", "ge", "greaterthan", "gt", "in", "integer", "iterable",
      "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
      "sequence", "string", "true", "undefined", "upper", "float"};
  return kTests.count(name) > 0;
}

Value ApplyFilter(const std::string& name, const Value& v, CallArgs& args) {
  if (name == "default" || name == "d") {
    bool boolean = Arg(args, 1, "boolean", Value::Bool(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) return Arg(args, 0, "default_value", Value::Str(""));
    return v;
  }
  if (name == "tojson") return ToJsonFilter(v, args);
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::Int(static_cast<int64_t>(pystr::Length(v.str())));
    if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
    if (v.is_dict() || v.is_namespace()) return Value::Int(static_cast<int64_t>(v.dict().items.size()));
    if (v.is_undefined()) return Value::Int(0);
    throw TemplateError("TypeError: object of type '" + v.TypeName() + "' has no len()");
  }
  if (name == "safe" || name == "list" || name == "string") {
    if (name == "list") return Value::MakeList(Iterate(v));
    if (name == "string") return Value::Str(ToStr(v));
    return v;
  }
  if (name == "trim") {
    const Value* chars = args.Get(0, "chars");
    std::optional<std::string> c;
    if (chars != nullptr && chars->is_string()) c = chars->str();
    return Value::Str(pystr::Strip(ToStr(v), c, true, true));
  }
  if (name == "upper") return Value::Str(pystr::Upper(ToStr(v)));
  if (name == "lower") return Value::Str(pystr::Lower(ToStr(v)));
  if (name == "title") return Value::Str(pystr::Title(ToStr(v)));
  if (name == "capitalize") return Value::Str(pystr::Capitalize(ToStr(v)));
  if (name == "replace") {
    Value count = Arg(args, 2, "count", Value::None());
    return Value::Str(pystr::Replace(ToStr(v), ToStr(Arg(args, 0, "old", Value::Str(""))),
                                     ToStr(Arg(args, 1, "new", Value::Str(""))),
                                     count.is_number() ? count.as_int() : -1));
  }
  if (name == "join") {
    std::string sep = ToStr(Arg(args, 0, "d", Value::Str("")));
    std::string attribute = StrArg(args, 1, "attribute", "");
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += ToStr(AttrPath(item, attribute));
    }
    return Value::Str(out);
  }
  if (name == "first" || name == "last") {
    List items = Iterate(v);
    if (items.empty()) return Value::Undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeList();
    if (!v.is_dict()) throw TemplateError("TypeError: Can only get item pairs from a mapping.");
    List out;
    for (const auto& [k, val] : v.dict().items) out.push_back(Value::MakeList({k, val}, true));
    return Value::MakeList(std::move(out));
  }
  if (name == "map") {
    List out;
    const Value* attribute = args.Get(99, "attribute");
    if (attribute != nullptr) {
      Value fallback = Arg(args, 99, "default", Value::Undefined());
      for (const Value& item : Iterate(v)) {
        Value x = AttrPath(item, ToStr(*attribute));
        out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
      }
    } else {
      std::string filter = StrArg(args, 0, "filter", "");
      CallArgs rest = Rest(args, 1);
      for (const Value& item : Iterate(v)) out.push_back(ApplyFilter(filter, item, rest));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "select" || name == "reject") return SelectFilter(v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return SelectFilter(v, args, true, name == "selectattr");
  if (name == "sort") return SortFilter(v, args);
  if (name == "dictsort") return DictSort(v, args);
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<uint32_t> cps = pystr::Decode(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::Str(pystr::Encode(cps));
    }
    List items = Iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "unique") {
    List out;
    bool case_sensitive = Arg(args, 0, "case_sensitive", Value::Bool(false)).Truthy();
    std::string attribute = StrArg(args, 1, "attribute", "");
    List seen;
    for (const Value& item : Iterate(v)) {
      Value key = Lowered(AttrPath(item, attribute), case_sensitive);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "indent") return Value::Str(Indent(ToStr(v), args));
  if (name == "int") return IntFilter(v, args);
  if (name == "float") return FloatFilter(v, args);
  if (name == "abs") {
    if (v.is_float()) return Value::Float(std::fabs(v.as_float()));
    if (v.is_number()) return Value::Int(std::llabs(v.as_int()));
    throw TemplateError("TypeError: bad operand type for abs(): '" + v.TypeName() + "'");
  }
  if (name == "round") return Round(v, args);
  if (name == "sum") {
    std::string attribute = StrArg(args, 0, "attribute", "");
    Value total = Arg(args, 1, "start", Value::Int(0));
    for (const Value& item : Iterate(v)) total = BinaryOp("+", total, AttrPath(item, attribute));
    return total;
  }
  if (name == "min" || name == "max") return MinMax(v, args, name == "max");
  if (name == "escape" || name == "e" || name == "forceescape") return Value::Str(Escape(ToStr(v)));
  if (name == "pprint") return Value::Str(Repr(v));
  if (name == "wordcount") return Value::Int(static_cast<int64_t>(pystr::Split(ToStr(v), std::nullopt, -1).size()));
  if (name == "center") {
    int64_t width = std::min<int64_t>(Arg(args, 0, "width", Value::Int(80)).as_int(), 1 << 16);
    std::string s = ToStr(v);
    int64_t len = static_cast<int64_t>(pystr::Length(s));
    if (len >= width) return Value::Str(s);
    int64_t total = width - len, left = total / 2 + (total & width & 1);
    return Value::Str(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(total - left), ' '));
  }
  if (name == "attr") return GetAttr(v, StrArg(args, 0, "name", ""));
  if (name == "batch") {
    int64_t n = std::max<int64_t>(1, Arg(args, 0, "linecount", Value::Int(1)).as_int());
    const Value* fill = args.Get(1, "fill_with");
    List out, cur;
    for (const Value& item : Iterate(v)) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::MakeList(std::move(cur))), cur.clear();
    }
    if (!cur.empty()) {
      while (fill != nullptr && static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
      out.push_back(Value::MakeList(std::move(cur)));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "truncate") {
    std::vector<uint32_t> cps = pystr::Decode(ToStr(v));
    int64_t length = Arg(args, 0, "length", Value::Int(255)).as_int();
    bool killwords = Arg(args, 1, "killwords", Value::Bool(false)).Truthy();
    std::string end = StrArg(args, 2, "end", "...");
    int64_t leeway = Arg(args, 3, "leeway", Value::Int(5)).as_int();
    int64_t end_len = static_cast<int64_t>(pystr::Length(end));
    if (length < end_len || leeway < 0) throw TemplateError("AssertionError: bad truncate length/leeway");
    if (static_cast<int64_t>(cps.size()) <= length + leeway) return Value::Str(pystr::Encode(cps));
    std::string head = pystr::Encode(std::vector<uint32_t>(cps.begin(), cps.begin() + (length - end_len)));
    if (killwords) return Value::Str(head + end);
    return Value::Str(pystr::Split(head, std::string(" "), 1, /*from_right=*/true)[0] + end);
  }
  if (name == "slice") {
    List seq = Iterate(v);
    int64_t slices = Arg(args, 0, "slices", Value::Int(1)).as_int();
    if (slices <= 0) throw TemplateError("ValueError: slices must be positive");
    const Value* fill = args.Get(1, "fill_with");
    int64_t n = static_cast<int64_t>(seq.size()), per = n / slices, extra = n % slices, offset = 0;
    List out;
    for (int64_t k = 0; k < slices; ++k) {
      int64_t start = offset + k * per;
      if (k < extra) ++offset;
      int64_t stop = offset + (k + 1) * per;
      List part(seq.begin() + start, seq.begin() + stop);
      if (fill != nullptr && !fill->is_none() && k >= extra) part.push_back(*fill);
      out.push_back(Value::MakeList(std::move(part)));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "format") {
    CallArgs rest = args;
    Value tuple = Value::MakeList(rest.positional, true);
    return BinaryOp("%", Value::Str(ToStr(v)), tuple);
  }
  throw TemplateError("TemplateAssertionError: No filter named '" + name + "'.");
}

bool ApplyTest(const std::string& name, const Value& v, CallArgs& args) {
  Value other = Arg(args, 0, "other", Value::Undefined());
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.is_function() || v.is_undefined();
  if (name == "sameas") {
    if (v.kind() != other.kind()) return false;
    if (v.is_list()) return &v.list() == &other.list();
    if (v.is_dict() || v.is_namespace()) return &v.dict() == &other.dict();
    return Equal(v, other);
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, other);
  if (name == "ne" || name == "!=") return !Equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return Less(v, other);
  if (name == "le" || name == "<=") return !Less(other, v);
  if (name == "gt" || name == "greaterthan" || name == ">") return Less(other, v);
  if (name == "ge" || name == ">=") return !Less(v, other);
  if (name == "in") return Contains(Arg(args, 0, "seq", Value::Undefined()), v);
  if (name == "divisibleby") {
    int64_t n = Arg(args, 0, "num", Value::Int(1)).as_int();
    if (n == 0) throw TemplateError("ZeroDivisionError: integer division or modulo by zero");
    return v.as_int() % n == 0;
  }
  if (name == "even") return v.as_int() % 2 == 0;
  if (name == "odd") return v.as_int() % 2 != 0;
  if (name == "lower") return v.is_string() && pystr::Lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && pystr::Upper(v.str()) == v.str();
  if (name == "escaped") return false;
  throw TemplateError("TemplateAssertionError: No test named '" + name + "'.");
}

std::vector<std::pair<std::string, Value>> MakeGlobals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::Function("range", [](CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    size_t n = a.positional.size();
    if (n == 1) stop = a.positional[0].as_int();
    if (n >= 2) start = a.positional[0].as_int(), stop = a.positional[1].as_int();
    if (n >= 3) step = a.positional[2].as_int();
    if (step == 0) throw TemplateError("ValueError: range() arg 3 must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      out.push_back(Value::Int(i));
      if (out.size() > 100000) throw TemplateError("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    return Value::MakeList(std::move(out));
  }));
  auto kwargs_dict = [](CallArgs& a, bool ns) {
    Dict d;
    if (!a.positional.empty() && a.positional[0].is_dict()) d = a.positional[0].dict();
    for (auto& [k, v] : a.keyword) d.Set(Value::Str(k), v);
    return ns ? Value::MakeNamespace(std::move(d)) : Value::MakeDict(std::move(d));
  };
  g.emplace_back("dict", Value::Function("dict", [kwargs_dict](CallArgs& a) { return kwargs_dict(a, false); }));
  g.emplace_back("namespace", Value::Function("namespace", [kwargs_dict](CallArgs& a) { return kwargs_dict(a, true); }));
  g.emplace_back("raise_exception", Value::Function("raise_exception", [](CallArgs& a) -> Value {
    throw TemplateError("TemplateError: " + ToStr(Arg(a, 0, "message", Value::Str(""))));
  }));
  g.emplace_back("strftime_now", Value::Function("strftime_now", [](CallArgs& a) {
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    size_t n = std::strftime(buf, sizeof(buf), StrArg(a, 0, "format", "").c_str(), &local);
    return Value::Str(std::string(buf, n));
  }));
  g.emplace_back("joiner", Value::Function("joiner", [](CallArgs& a) {
    std::string sep = StrArg(a, 0, "sep", ", ");
    auto used = std::make_shared<bool>(false);
    return Value::Function("joiner", [sep, used](CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::Str("");
      }
      return Value::Str(sep);
    });
  }));
  return g;
}

}  // namespace ember::tmpl
