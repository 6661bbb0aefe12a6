// Value: the dynamic value of the template interpreter, modelled on the Python objects jinja2
// sees (None, bool, int, float, str, list/tuple, dict, namespace, callables, Undefined). Lists,
// dicts and namespaces are shared by reference like Python objects; everything else is a plain
// value. Values are created and used by one render on one thread; they are not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ember::tmpl {

// A template error: raised inside the interpreter (never crosses the module boundary; ChatTemplate
// turns it into a Status). line/column are 1-based; 0 means "not yet known" and the enclosing
// expression fills them in.
struct TemplateError : std::runtime_error {
  TemplateError(const std::string& message, int line = 0, int column = 0)
      : std::runtime_error(message), line(line), column(column) {}
  int line;
  int column;
};

class Value;
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The named argument or the positional one at `index`, else nullptr.
  const Value* Get(size_t index, const std::string& name) const;
};
using NativeFn = std::function<Value(CallArgs&)>;

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };

using List = std::vector<Value>;
// An insertion-ordered dict (Python 3.7+ semantics); lookups are linear, fine for chat payloads.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  Value* Find(const Value& key);
  const Value* Find(const std::string& key) const;
  void Set(const Value& key, Value value);
};

class Value {
 public:
  Value() = default;  // Undefined
  static Value Undefined(std::string hint = "") {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double f) {
    Value v(Kind::kFloat);
    v.float_ = f;
    return v;
  }
  static Value Str(std::string s) {
    Value v(Kind::kString);
    v.str_ = std::move(s);
    return v;
  }
  static Value MakeList(List items = {}, bool is_tuple = false);
  static Value MakeDict(Dict dict = {});
  static Value MakeNamespace(Dict dict = {});
  static Value Function(std::string name, NativeFn fn);
  template <typename Json>
  static Value FromJson(const Json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return kind_ == Kind::kFloat ? static_cast<int64_t>(float_) : int_; }
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return str_; }  // string value, or Undefined's hint
  List& list() const { return *list_; }
  Dict& dict() const { return *dict_; }  // dicts and namespaces
  const std::string& fn_name() const { return str_; }
  Value Call(CallArgs& args) const { return (*fn_)(args); }

  // Python truthiness.
  bool Truthy() const;
  // Python type name as jinja2 prints it in errors ("str", "list", "dict", "NoneType"...).
  std::string TypeName() const;
  // Throws the UndefinedError this Undefined stands for.
  [[noreturn]] void ThrowUndefined() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}
  Kind kind_ = Kind::kUndefined;
  bool is_tuple_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<NativeFn> fn_;
};

// Python str(value) (Undefined prints as "").
std::string ToStr(const Value& v);
// Python repr(value).
std::string Repr(const Value& v);
// Python repr of a float ("1.0", "1e+16", "0.1").
std::string FloatRepr(double d);
// Python == between values (1 == 1.0 == True; lists and dicts element-wise).
bool Equal(const Value& a, const Value& b);
// Python <: numbers, strings (code-point order), lists; throws TypeError otherwise.
bool Less(const Value& a, const Value& b);
// json.dumps(v, ensure_ascii=False, indent=indent, separators=...) as transformers' tojson does.
// indent < 0 means None. Throws for values JSON cannot hold (Undefined, functions).
std::string ToJson(const Value& v, int indent, const std::string& item_sep,
                   const std::string& key_sep, bool ensure_ascii = false, bool sort_keys = false);
// A JSON string literal; ensure_ascii escapes non-ASCII as \uXXXX (surrogate pairs above U+FFFF).
std::string JsonQuote(const std::string& s, bool ensure_ascii = false);

template <typename Json>
Value Value::FromJson(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return None();
    case nlohmann::json::value_t::boolean: return Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Int(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Float(j.template get<double>());
    case nlohmann::json::value_t::string: return Str(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(Str(it.key()), FromJson(it.value()));
      return MakeDict(std::move(d));
    }
    default: return None();
  }
}

}  // namespace ember::tmpl
