#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ember::tmpl {

const Value* CallArgs::Get(size_t index, const std::string& name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return index < positional.size() ? &positional[index] : nullptr;
}

Value* Dict::Find(const Value& key) {
  for (auto& [k, v] : items)
    if (Equal(k, key)) return &v;
  return nullptr;
}

const Value* Dict::Find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void Dict::Set(const Value& key, Value value) {
  if (Value* existing = Find(key)) {
    *existing = std::move(value);
  } else {
    items.emplace_back(key, std::move(value));
  }
}

Value Value::MakeList(List items, bool is_tuple) {
  Value v(Kind::kList);
  v.list_ = std::make_shared<List>(std::move(items));
  v.is_tuple_ = is_tuple;
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v(Kind::kDict);
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}

Value Value::MakeNamespace(Dict dict) {
  Value v(Kind::kNamespace);
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}

Value Value::Function(std::string name, NativeFn fn) {
  Value v(Kind::kFunction);
  v.str_ = std::move(name);
  v.fn_ = std::make_shared<NativeFn>(std::move(fn));
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0.0;
    case Kind::kString: return !str_.empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->items.empty();
    default: return true;
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kFunction: return "function";
  }
  return "object";
}

void Value::ThrowUndefined() const {
  throw TemplateError("UndefinedError: " + (str_.empty() ? std::string("value is undefined") : str_));
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-d.ddde+XX", shortest round-trip digits
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exp = std::stoi(sci.substr(e_pos + 1));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (static_cast<int>(int_part.size()) < exp + 1) int_part += '0';
      std::string frac = digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += ebuf;
  }
  if (negative) out.insert(out.begin(), '-');
  return out;
}

namespace {

std::string StrRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

namespace {

// Printing, dumping and comparing recurse over lists and dicts: a value a template built deeper
// than this is an error, not a stack overflow (client values are bounded far below it).
constexpr int kMaxPrintDepth = 512;

void CheckPrintDepth(int depth) {
  if (depth > kMaxPrintDepth)
    throw TemplateError("ValueError: the value nests deeper than " + std::to_string(kMaxPrintDepth) +
                        " lists/dicts");
}

std::string ToStrAt(const Value& v, int depth);

std::string ReprAt(const Value& v, int depth) {
  switch (v.kind()) {
    case Kind::kString: return StrRepr(v.str());
    case Kind::kUndefined: return "Undefined";
    default: return ToStrAt(v, depth);
  }
}

std::string ToStrAt(const Value& v, int depth) {
  CheckPrintDepth(depth);
  switch (v.kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(v.as_int());
    case Kind::kFloat: return FloatRepr(v.as_float());
    case Kind::kString: return v.str();
    case Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += ", ";
        out += ReprAt(v.list()[i], depth + 1);
      }
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprAt(k, depth + 1) + ": " + ReprAt(val, depth + 1);
      }
      return out + "}";
    }
    case Kind::kNamespace: return "<Namespace>";
    case Kind::kFunction: return "<function " + v.fn_name() + ">";
  }
  return "";
}

}  // namespace

std::string Repr(const Value& v) { return ReprAt(v, 0); }

std::string ToStr(const Value& v) { return ToStrAt(v, 0); }

namespace {

bool EqualAt(const Value& a, const Value& b, int depth) {
  CheckPrintDepth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.str() == b.str();
    case Kind::kList: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i)
        if (!EqualAt(a.list()[i], b.list()[i], depth + 1)) return false;
      return true;
    }
    case Kind::kDict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        Value* other = b.dict().Find(k);
        if (other == nullptr || !EqualAt(v, *other, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return &a.dict() == &b.dict();
    default: return false;
  }
}

bool LessAt(const Value& a, const Value& b, int depth) {
  CheckPrintDepth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order == code points
  if (a.is_list() && b.is_list()) {
    const List& x = a.list();
    const List& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!EqualAt(x[i], y[i], depth + 1)) return LessAt(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined() || b.is_undefined()) (a.is_undefined() ? a : b).ThrowUndefined();
  throw TemplateError("TypeError: '<' not supported between instances of '" + a.TypeName() +
                      "' and '" + b.TypeName() + "'");
}

}  // namespace

bool Equal(const Value& a, const Value& b) { return EqualAt(a, b, 0); }

bool Less(const Value& a, const Value& b) { return LessAt(a, b, 0); }

std::string JsonQuote(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (ensure_ascii && c >= 0x80) {
      int n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      if (i + n > s.size()) n = 1;
      uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
      for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      i += n - 1;
      char buf[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

namespace {

std::string JsonKey(const Value& k) {
  switch (k.kind()) {
    case Kind::kString: return k.str();
    case Kind::kNone: return "null";
    case Kind::kBool: return k.as_bool() ? "true" : "false";
    case Kind::kInt: return std::to_string(k.as_int());
    case Kind::kFloat: return FloatRepr(k.as_float());
    default:
      throw TemplateError("TypeError: keys must be str, int, float, bool or None, not " +
                          k.TypeName());
  }
}

struct JsonOptions {
  int indent;
  std::string item_sep, key_sep;
  bool ensure_ascii, sort_keys;
};

void JsonDump(const Value& v, const JsonOptions& o, int depth, std::string& out) {
  CheckPrintDepth(depth);
  const int indent = o.indent;
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.as_int()); return;
    case Kind::kFloat: {
      double d = v.as_float();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += FloatRepr(d);
      return;
    }
    case Kind::kString: out += JsonQuote(v.str(), o.ensure_ascii); return;
    case Kind::kList: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += o.item_sep;
        newline(depth + 1);
        JsonDump(v.list()[i], o, depth + 1, out);
      }
      newline(depth);
      out += "]";
      return;
    }
    case Kind::kDict: {
      if (v.dict().items.empty()) {
        out += "{}";
        return;
      }
      out += "{";
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, val] : v.dict().items) items.emplace_back(JsonKey(k), &val);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      bool first = true;
      for (const auto& [key, val] : items) {
        if (!first) out += o.item_sep;
        first = false;
        newline(depth + 1);
        out += JsonQuote(key, o.ensure_ascii);
        out += o.key_sep;
        JsonDump(*val, o, depth + 1, out);
      }
      newline(depth);
      out += "}";
      return;
    }
    default:
      throw TemplateError("TypeError: Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

}  // namespace

std::string ToJson(const Value& v, int indent, const std::string& item_sep,
                   const std::string& key_sep, bool ensure_ascii, bool sort_keys) {
  std::string out;
  JsonDump(v, JsonOptions{indent, item_sep, key_sep, ensure_ascii, sort_keys}, 0, out);
  return out;
}

}  // namespace ember::tmpl
