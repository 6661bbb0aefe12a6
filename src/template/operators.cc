// Attribute/item lookup with Python methods, slicing, operators and iteration: the Python object
// model as jinja2's ImmutableSandboxedEnvironment exposes it to templates.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>

#include "template/builtins.h"
#include "template/pystr.h"

namespace ember::tmpl {
namespace {

std::string ObjectRepr(const Value& obj) {
  return obj.is_none() ? "'None'" : "'" + obj.TypeName() + " object'";
}

Value NoAttribute(const Value& obj, const std::string& name) {
  return Value::Undefined(ObjectRepr(obj) + " has no attribute '" + name + "'");
}

Value Unsafe(const Value& obj, const std::string& name) {
  std::string message = "SecurityError: access to attribute '" + name + "' of '" + obj.TypeName() +
                        "' object is unsafe.";
  return Value::Function(name, [message](CallArgs&) -> Value { throw TemplateError(message); });
}

std::optional<std::string> OptStr(const CallArgs& args, size_t index, const std::string& name) {
  const Value* v = args.Get(index, name);
  if (v == nullptr || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw TemplateError("TypeError: expected a string argument, got " + v->TypeName());
  return v->str();
}

int64_t IntArg(const CallArgs& args, size_t index, const std::string& name, int64_t fallback) {
  const Value* v = args.Get(index, name);
  return v != nullptr && v->is_number() ? v->as_int() : fallback;
}

Value StrList(const std::vector<std::string>& parts) {
  List out;
  for (const std::string& p : parts) out.push_back(Value::Str(p));
  return Value::MakeList(std::move(out));
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) throw TemplateError("TypeError: startswith/endswith argument must be str or a tuple of str");
    const std::string& x = a.str();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) return std::any_of(affix.list().begin(), affix.list().end(), one);
  return one(affix);
}

template <typename Pred>
bool AllCodePoints(const std::string& s, Pred pred) {
  std::vector<uint32_t> cps = pystr::Decode(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

Value StringMethod(const Value& self, const std::string& name) {
  const std::string s = self.str();
  auto method = [&](auto fn) { return Value::Function(name, [s, fn](CallArgs& a) -> Value { return fn(s, a); }); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return method([left, right](const std::string& str, CallArgs& a) {
      return Value::Str(pystr::Strip(str, OptStr(a, 0, "chars"), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool from_right = name == "rsplit";
    return method([from_right](const std::string& str, CallArgs& a) {
      std::optional<std::string> sep = OptStr(a, 0, "sep");
      if (sep && sep->empty()) throw TemplateError("ValueError: empty separator");
      return StrList(pystr::Split(str, sep, IntArg(a, 1, "maxsplit", -1), from_right));
    });
  }
  if (name == "splitlines")
    return method([](const std::string& str, CallArgs& a) {
      return StrList(pystr::SplitLines(str, Arg(a, 0, "keepends", Value::Bool(false)).Truthy()));
    });
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method([prefix](const std::string& str, CallArgs& a) {
      return Value::Bool(AffixMatch(str, Arg(a, 0, prefix ? "prefix" : "suffix", Value::None()), prefix));
    });
  }
  if (name == "upper") return method([](const std::string& str, CallArgs&) { return Value::Str(pystr::Upper(str)); });
  if (name == "lower") return method([](const std::string& str, CallArgs&) { return Value::Str(pystr::Lower(str)); });
  if (name == "title") return method([](const std::string& str, CallArgs&) { return Value::Str(pystr::Title(str)); });
  if (name == "capitalize")
    return method([](const std::string& str, CallArgs&) { return Value::Str(pystr::Capitalize(str)); });
  if (name == "replace")
    return method([](const std::string& str, CallArgs& a) {
      return Value::Str(pystr::Replace(str, StrArg(a, 0, "old", ""), StrArg(a, 1, "new", ""), IntArg(a, 2, "count", -1)));
    });
  if (name == "count")
    return method([](const std::string& str, CallArgs& a) {
      return Value::Int(static_cast<int64_t>(pystr::Count(str, StrArg(a, 0, "sub", ""))));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    bool right = name[0] == 'r';
    bool raise = name.find("index") != std::string::npos;
    return method([right, raise](const std::string& str, CallArgs& a) {
      std::string sub = StrArg(a, 0, "sub", "");
      size_t hit = right ? str.rfind(sub) : str.find(sub);
      if (hit == std::string::npos) {
        if (raise) throw TemplateError("ValueError: substring not found");
        return Value::Int(-1);
      }
      return Value::Int(static_cast<int64_t>(pystr::Length(str.substr(0, hit))));
    });
  }
  if (name == "join")
    return method([](const std::string& str, CallArgs& a) {
      std::string out;
      bool first = true;
      for (const Value& v : Iterate(Arg(a, 0, "iterable", Value::MakeList()))) {
        if (!v.is_string()) throw TemplateError("TypeError: sequence item: expected str instance, " + v.TypeName() + " found");
        if (!first) out += str;
        first = false;
        out += v.str();
      }
      return Value::Str(out);
    });
  if (name == "format")
    return method([](const std::string& str, CallArgs& a) {
      // "{}", "{0}", "{name}" fields without format specs; "{{" / "}}" escape braces.
      std::string out;
      size_t auto_index = 0;
      for (size_t i = 0; i < str.size(); ++i) {
        char c = str[i];
        if ((c == '{' || c == '}') && i + 1 < str.size() && str[i + 1] == c) {
          out += c;
          ++i;
        } else if (c == '{') {
          size_t close = str.find('}', i);
          if (close == std::string::npos) throw TemplateError("ValueError: Single '{' encountered in format string");
          std::string field = str.substr(i + 1, close - i - 1);
          const Value* v = nullptr;
          if (field.empty()) {
            v = auto_index < a.positional.size() ? &a.positional[auto_index++] : nullptr;
          } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
            size_t k = std::stoul(field);
            v = k < a.positional.size() ? &a.positional[k] : nullptr;
          } else {
            for (const auto& [k, val] : a.keyword)
              if (k == field) v = &val;
          }
          if (v == nullptr) throw TemplateError("IndexError: Replacement index " + field + " out of range");
          out += ToStr(*v);
          i = close;
        } else {
          out += c;
        }
      }
      return Value::Str(out);
    });
  if (name == "removeprefix" || name == "removesuffix") {
    bool prefix = name == "removeprefix";
    return method([prefix](const std::string& str, CallArgs& a) {
      std::string x = StrArg(a, 0, prefix ? "prefix" : "suffix", "");
      if (!AffixMatch(str, Value::Str(x), prefix)) return Value::Str(str);
      return Value::Str(prefix ? str.substr(x.size()) : str.substr(0, str.size() - x.size()));
    });
  }
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return method([](const std::string& str, CallArgs&) {
      return Value::Bool(AllCodePoints(str, [](uint32_t c) { return c >= '0' && c <= '9'; }));
    });
  if (name == "isspace")
    return method([](const std::string& str, CallArgs&) { return Value::Bool(AllCodePoints(str, pystr::IsSpace)); });
  if (name == "isalpha" || name == "isalnum") {
    bool alnum = name == "isalnum";
    return method([alnum](const std::string& str, CallArgs&) {
      return Value::Bool(AllCodePoints(str, [alnum](uint32_t c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80 || (alnum && c >= '0' && c <= '9');
      }));
    });
  }
  if (name == "islower" || name == "isupper") {
    bool lower = name == "islower";
    return method([lower](const std::string& str, CallArgs&) {
      std::string conv = lower ? pystr::Upper(str) : pystr::Lower(str);
      std::string same = lower ? pystr::Lower(str) : pystr::Upper(str);
      return Value::Bool(same == str && conv != str);
    });
  }
  return NoAttribute(self, name);
}

Value DictMethod(const Value& self, const std::string& name) {
  if (name == "items")
    return Value::Function(name, [self](CallArgs&) {
      List out;
      for (const auto& [k, v] : self.dict().items) out.push_back(Value::MakeList({k, v}, true));
      return Value::MakeList(std::move(out));
    });
  if (name == "keys" || name == "values") {
    bool keys = name == "keys";
    return Value::Function(name, [self, keys](CallArgs&) {
      List out;
      for (const auto& [k, v] : self.dict().items) out.push_back(keys ? k : v);
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "get")
    return Value::Function(name, [self](CallArgs& a) {
      Value* v = self.dict().Find(Arg(a, 0, "key", Value::None()));
      return v != nullptr ? *v : Arg(a, 1, "default", Value::None());
    });
  if (name == "copy") return Value::Function(name, [self](CallArgs&) { return Value::MakeDict(self.dict()); });
  static const std::set<std::string> kUnsafe = {"clear", "pop", "popitem", "setdefault", "update"};
  if (kUnsafe.count(name)) return Unsafe(self, name);
  return Value::Undefined();  // caller falls back to the key
}

Value ListMethod(const Value& self, const std::string& name) {
  if (name == "index" || name == "count") {
    bool index = name == "index";
    return Value::Function(name, [self, index](CallArgs& a) {
      Value needle = Arg(a, 0, "value", Value::None());
      int64_t n = 0;
      for (size_t i = 0; i < self.list().size(); ++i) {
        if (!Equal(self.list()[i], needle)) continue;
        if (index) return Value::Int(static_cast<int64_t>(i));
        ++n;
      }
      if (index) throw TemplateError("ValueError: " + Repr(needle) + " is not in list");
      return Value::Int(n);
    });
  }
  static const std::set<std::string> kUnsafe = {"append", "clear",  "extend", "insert",
                                                "pop",    "remove", "reverse", "sort"};
  if (!self.is_tuple() && kUnsafe.count(name)) return Unsafe(self, name);
  return NoAttribute(self, name);
}

}  // namespace

Value Arg(const CallArgs& args, size_t index, const std::string& name, const Value& fallback) {
  const Value* v = args.Get(index, name);
  return v != nullptr ? *v : fallback;
}

std::string StrArg(const CallArgs& args, size_t index, const std::string& name, const std::string& fallback) {
  const Value* v = args.Get(index, name);
  if (v == nullptr) return fallback;
  if (!v->is_string()) throw TemplateError("TypeError: argument '" + name + "' must be str, not " + v->TypeName());
  return v->str();
}

Value GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) obj.ThrowUndefined();
  if (!name.empty() && name[0] == '_') return NoAttribute(obj, name);
  switch (obj.kind()) {
    case Kind::kDict: {
      Value method = DictMethod(obj, name);
      if (!method.is_undefined()) return method;
      if (const Value* v = static_cast<const Dict&>(obj.dict()).Find(name)) return *v;
      return NoAttribute(obj, name);
    }
    case Kind::kNamespace: {
      if (const Value* v = static_cast<const Dict&>(obj.dict()).Find(name)) return *v;
      return NoAttribute(obj, name);
    }
    case Kind::kString: return StringMethod(obj, name);
    case Kind::kList: return ListMethod(obj, name);
    default: return NoAttribute(obj, name);
  }
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.ThrowUndefined();
  if (obj.is_dict() || obj.is_namespace()) {
    if (Value* v = obj.dict().Find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_number() && !key.is_float()) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list()[static_cast<size_t>(i)];
    } else {
      std::vector<uint32_t> cps = pystr::Decode(obj.str());
      int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::Str(pystr::Encode({cps[static_cast<size_t>(i)]}));
    }
    return Value::Undefined(ObjectRepr(obj) + " has no element " + ToStr(key));
  }
  if (key.is_string()) {
    Value attr = GetAttr(obj, key.str());
    return attr;
  }
  return Value::Undefined(ObjectRepr(obj) + " has no element " + Repr(key));
}

Value SliceOf(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) obj.ThrowUndefined();
  if (!obj.is_list() && !obj.is_string())
    throw TemplateError("TypeError: '" + obj.TypeName() + "' object is not subscriptable");
  std::vector<uint32_t> cps;
  if (obj.is_string()) cps = pystr::Decode(obj.str());
  int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list().size()) : static_cast<int64_t>(cps.size());
  int64_t st = step.is_number() ? step.as_int() : 1;
  if (st == 0) throw TemplateError("ValueError: slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t def) {
    if (!v.is_number()) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  int64_t e = clamp(stop, st > 0 ? n : -1);
  std::vector<size_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(static_cast<size_t>(i));
  if (obj.is_list()) {
    List out;
    for (size_t i : idx) out.push_back(obj.list()[i]);
    return Value::MakeList(std::move(out), obj.is_tuple());
  }
  std::vector<uint32_t> out;
  for (size_t i : idx) out.push_back(cps[i]);
  return Value::Str(pystr::Encode(out));
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (!item.is_string())
        throw TemplateError("TypeError: 'in <string>' requires string as left operand, not " + item.TypeName());
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      return std::any_of(container.list().begin(), container.list().end(),
                         [&](const Value& v) { return Equal(v, item); });
    case Kind::kDict: return container.dict().Find(item) != nullptr;
    default:
      throw TemplateError("TypeError: argument of type '" + container.TypeName() + "' is not iterable");
  }
}

std::vector<Value> Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kList: return v.list();
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, val] : v.dict().items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> out;
      for (uint32_t cp : pystr::Decode(v.str())) out.push_back(Value::Str(pystr::Encode({cp})));
      return out;
    }
    default: throw TemplateError("TypeError: '" + v.TypeName() + "' object is not iterable");
  }
}

namespace {

[[noreturn]] void Unsupported(const std::string& op, const Value& a, const Value& b) {
  throw TemplateError("TypeError: unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                      "' and '" + b.TypeName() + "'");
}

Value Arith(const std::string& op, const Value& a, const Value& b) {
  bool as_float = a.is_float() || b.is_float();
  if (op == "/") {
    if (b.as_float() == 0) throw TemplateError("ZeroDivisionError: division by zero");
    return Value::Float(a.as_float() / b.as_float());
  }
  if (as_float) {
    double x = a.as_float(), y = b.as_float();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "**") return Value::Float(std::pow(x, y));
    if (y == 0) throw TemplateError("ZeroDivisionError: float modulo");
    if (op == "//") return Value::Float(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::Float(m);
  }
  int64_t x = a.as_int(), y = b.as_int();
  int64_t r = 0;
  // Python ints are unbounded; ours are 64-bit, so overflow is an error rather than UB.
  auto checked = [](bool overflow, int64_t v) {
    if (overflow) throw TemplateError("OverflowError: integer result does not fit in 64 bits");
    return Value::Int(v);
  };
  if (op == "+" || op == "-" || op == "*") {
    bool overflow = op == "+" ? __builtin_add_overflow(x, y, &r)
                    : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                : __builtin_mul_overflow(x, y, &r);
    return checked(overflow, r);
  }
  if (op == "**") {
    if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
    r = 1;
    int64_t base = x;
    for (int64_t e = y; e > 0; e >>= 1) {
      if ((e & 1) && __builtin_mul_overflow(r, base, &r)) checked(true, 0);
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) checked(true, 0);
    }
    return Value::Int(r);
  }
  if (y == -1 && x == INT64_MIN) checked(true, 0);
  if (y == 0) throw TemplateError("ZeroDivisionError: integer division or modulo by zero");
  int64_t q = x / y, m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    --q;
    m += y;
  }
  return Value::Int(op == "//" ? q : m);
}

// Python's `str % args`: %s %r %d %i %f %e %g %x %o %c with flags, width and precision.
Value PercentFormat(const std::string& fmt, const Value& args) {
  std::vector<Value> items = args.is_tuple() ? args.list() : std::vector<Value>{args};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%' || i + 1 >= fmt.size()) {
      out += fmt[i];
      continue;
    }
    size_t spec_start = i++;
    while (i < fmt.size() && std::string("-+ #0123456789.").find(fmt[i]) != std::string::npos) ++i;
    if (i >= fmt.size()) throw TemplateError("ValueError: incomplete format");
    char c = fmt[i];
    std::string spec = fmt.substr(spec_start, i - spec_start);  // "%-5.2"
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= items.size()) throw TemplateError("TypeError: not enough arguments for format string");
    const Value& v = items[next++];
    char buf[512];
    if (c == 's' || c == 'r') {
      std::string text = c == 's' ? ToStr(v) : Repr(v);
      std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), text.c_str());
      out += spec.size() == 1 ? text : std::string(buf);
    } else if (c == 'd' || c == 'i' || c == 'x' || c == 'X' || c == 'o' || c == 'c') {
      if (!v.is_number()) throw TemplateError("TypeError: %" + std::string(1, c) + " format: a real number is required, not " + v.TypeName());
      std::string conv = spec + "ll" + (c == 'i' ? 'd' : c);
      if (c == 'c') conv = spec + "c";
      std::snprintf(buf, sizeof(buf), conv.c_str(), c == 'c' ? static_cast<long long>(static_cast<char>(v.as_int())) : static_cast<long long>(v.as_int()));
      out += buf;
    } else if (std::string("feEgG").find(c) != std::string::npos) {
      if (!v.is_number()) throw TemplateError("TypeError: must be real number, not " + v.TypeName());
      std::snprintf(buf, sizeof(buf), (spec + c).c_str(), v.as_float());
      out += buf;
    } else {
      throw TemplateError(std::string("ValueError: unsupported format character '") + c + "'");
    }
  }
  if (next < items.size() && args.is_tuple())
    throw TemplateError("TypeError: not all arguments converted during string formatting");
  return Value::Str(out);
}

}  // namespace

Value BinaryOp(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value::Bool(Equal(a, b));
  if (op == "!=") return Value::Bool(!Equal(a, b));
  if (op == "<") return Value::Bool(Less(a, b));
  if (op == ">") return Value::Bool(Less(b, a));
  if (op == "<=") return Value::Bool(!Less(b, a));
  if (op == ">=") return Value::Bool(!Less(a, b));
  if (op == "in") return Value::Bool(Contains(b, a));
  if (op == "not in") return Value::Bool(!Contains(b, a));
  if (op == "~") return Value::Str(ToStr(a) + ToStr(b));
  if (a.is_undefined()) a.ThrowUndefined();
  if (b.is_undefined()) b.ThrowUndefined();
  if (a.is_number() && b.is_number()) return Arith(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::Str(a.str() + b.str());
    if (a.is_list() && b.is_list()) {
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(out), a.is_tuple());
    }
    if (a.is_string() || a.is_list())
      throw TemplateError("TypeError: can only concatenate " + a.TypeName() + " (not \"" + b.TypeName() +
                          "\") to " + a.TypeName());
  }
  if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
    const Value& seq = (a.is_string() || a.is_list()) ? a : b;
    const Value& count = (&seq == &a) ? b : a;
    if (count.is_number() && !count.is_float()) {
      size_t unit = seq.is_string() ? seq.str().size() : seq.list().size();
      if (count.as_int() > 0 && unit > 0 && static_cast<uint64_t>(count.as_int()) > (uint64_t{1} << 28) / unit)
        throw TemplateError("MemoryError: repeated sequence too large");
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < count.as_int(); ++i) out += seq.str();
        return Value::Str(out);
      }
      List out;
      for (int64_t i = 0; i < count.as_int(); ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
      return Value::MakeList(std::move(out));
    }
  }
  if (op == "%" && a.is_string()) return PercentFormat(a.str(), b);
  Unsupported(op, a, b);
}

}  // namespace ember::tmpl
