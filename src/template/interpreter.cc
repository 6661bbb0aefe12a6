#include "template/interpreter.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "template/builtins.h"

namespace ember::tmpl {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;

  Value* Find(const std::string& name) {
    for (Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  explicit Interpreter(Scope* root) : root_(root) {}

  Flow Exec(const Body& body, Scope& scope, std::string& out) {
    for (const StmtPtr& stmt : body) {
      Flow flow = ExecOne(*stmt, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  Flow ExecOne(const Stmt& s, Scope& scope, std::string& out) {
    try {
      return ExecStmt(s, scope, out);
    } catch (TemplateError& e) {
      if (e.line == 0) {
        e.line = s.line;
        e.column = s.column;
      }
      throw;
    }
  }

  Flow ExecStmt(const Stmt& s, Scope& scope, std::string& out) {
    switch (s.kind) {
      case StmtKind::kText: out += s.text; return Flow::kNormal;
      case StmtKind::kPrint: {
        Value v = Eval(*s.expr, scope);
        if (v.is_string()) out += v.str();  // the common case; skips a copy of long contents
        else out += ToStr(v);
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (Eval(*s.conds[i], scope).Truthy()) return Exec(s.bodies[i], scope, out);
        return Exec(s.else_body, scope, out);
      case StmtKind::kFor: ExecFor(s, scope, out); return Flow::kNormal;
      case StmtKind::kSet: {
        Value v = Eval(*s.expr, scope);
        if (!s.attr.empty()) {
          Value* ns = scope.Find(s.targets[0]);
          if (ns == nullptr || !ns->is_namespace())
            throw TemplateError("TemplateRuntimeError: cannot assign attribute on non-namespace object");
          ns->dict().Set(Value::Str(s.attr), std::move(v));
        } else {
          Assign(s.targets, std::move(v), scope);
        }
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        std::string body;
        Scope inner{{}, &scope};
        Exec(s.body, inner, body);
        Value v = Value::Str(body);
        if (s.filter) v = ApplyFilterChain(*s.filter, v, scope);
        scope.vars[s.targets[0]] = std::move(v);
        return Flow::kNormal;
      }
      case StmtKind::kMacro: scope.vars[s.text] = MakeMacro(s, nullptr); return Flow::kNormal;
      case StmtKind::kCallBlock: {
        Value caller = MakeMacro(s, &scope);
        const Expr& call = *s.expr;
        Value callee = Eval(*call.children[0], scope);
        CallArgs args = EvalArgs(call, scope);
        args.keyword.emplace_back("caller", caller);
        out += ToStr(CallValue(callee, args));
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        std::string body;
        Exec(s.body, scope, body);
        out += ToStr(ApplyFilterChain(*s.filter, Value::Str(body), scope));
        return Flow::kNormal;
      }
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kDo: Eval(*s.expr, scope); return Flow::kNormal;
      case StmtKind::kScope: {
        Scope inner{{}, &scope};
        for (size_t i = 0; i < s.targets.size(); ++i) inner.vars[s.targets[i]] = Eval(*s.conds[i], scope);
        return Exec(s.body, inner, out);
      }
    }
    return Flow::kNormal;
  }

  void Assign(const std::vector<std::string>& targets, Value v, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = std::move(v);
      return;
    }
    std::vector<Value> items = Iterate(v);
    if (items.size() != targets.size())
      throw TemplateError("ValueError: cannot unpack " + std::to_string(items.size()) + " values into " +
                          std::to_string(targets.size()) + " targets");
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  void ExecFor(const Stmt& s, Scope& scope, std::string& out) {
    RunLoop(s, scope, Eval(*s.expr, scope), 0, out);
  }

  // One (possibly recursive) pass of a for loop over `iterable` at nesting `depth0`.
  void RunLoop(const Stmt& s, Scope& scope, const Value& iterable, int64_t depth0, std::string& out) {
    if (iterable.is_none()) throw TemplateError("TypeError: 'NoneType' object is not iterable");
    std::vector<Value> items = Iterate(iterable);
    if (s.cond) {
      std::vector<Value> kept;
      for (Value& item : items) {
        Scope probe{{}, &scope};
        Assign(s.targets, item, probe);
        if (Eval(*s.cond, probe).Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Scope inner{{}, &scope};
      Exec(s.else_body, inner, out);
      return;
    }
    int64_t n = static_cast<int64_t>(items.size());
    auto last_changed = std::make_shared<std::optional<List>>();
    for (int64_t i = 0; i < n; ++i) {
      Scope inner{{}, &scope};
      Assign(s.targets, items[static_cast<size_t>(i)], inner);
      Dict loop;
      auto set = [&](const char* k, Value v) { loop.items.emplace_back(Value::Str(k), std::move(v)); };
      set("index", Value::Int(i + 1));
      set("index0", Value::Int(i));
      set("revindex", Value::Int(n - i));
      set("revindex0", Value::Int(n - i - 1));
      set("first", Value::Bool(i == 0));
      set("last", Value::Bool(i == n - 1));
      set("length", Value::Int(n));
      set("depth", Value::Int(depth0 + 1));
      set("depth0", Value::Int(depth0));
      set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("there is no previous item"));
      set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::Undefined("there is no next item"));
      set("cycle", Value::Function("cycle", [i](CallArgs& a) -> Value {
        if (a.positional.empty()) throw TemplateError("TypeError: no items for cycling given");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      }));
      set("changed", Value::Function("changed", [last_changed](CallArgs& a) -> Value {
        Value now = Value::MakeList(a.positional);
        if (*last_changed && Equal(Value::MakeList(**last_changed), now)) return Value::Bool(false);
        *last_changed = a.positional;
        return Value::Bool(true);
      }));
      if (!s.attr.empty()) {  // recursive: loop(children) renders this loop's body over children
        const Stmt* stmt = &s;
        Scope* outer = &scope;
        set("__call__", Value::Function("loop", [this, stmt, outer, depth0](CallArgs& a) -> Value {
          if (depth0 + 1 >= kMaxCallDepth) throw TemplateError("RecursionError: recursive loop nested too deep");
          std::string nested;
          RunLoop(*stmt, *outer, Arg(a, 0, "iterable", Value::Undefined()), depth0 + 1, nested);
          return Value::Str(nested);
        }));
      }
      inner.vars["loop"] = Value::MakeNamespace(std::move(loop));
      if (Exec(s.body, inner, out) == Flow::kBreak) break;
    }
  }

  // A macro (defined at `s`, closing over the root frame) or, with `call_scope`, the `caller` of
  // a call block (closing over the frame of the call site).
  Value MakeMacro(const Stmt& s, Scope* call_scope) {
    Scope* parent = call_scope != nullptr ? call_scope : root_;
    const Body* body = &s.body;
    const Stmt* stmt = &s;
    return Value::Function(call_scope ? "caller" : s.text, [this, parent, body, stmt](CallArgs& a) {
      // jinja2 would hit Python's recursion limit; we stop well before the C++ stack does.
      if (call_depth_ >= kMaxCallDepth)
        throw TemplateError("RecursionError: macro calls nested deeper than " + std::to_string(kMaxCallDepth));
      struct DepthGuard {
        int& depth;
        explicit DepthGuard(int& d) : depth(d) { ++depth; }
        ~DepthGuard() { --depth; }
      } guard(call_depth_);
      Scope frame{{}, parent};
      size_t n = stmt->params.size();
      for (size_t i = 0; i < n; ++i) {
        const std::string& p = stmt->params[i];
        if (const Value* v = a.Get(i, p)) {
          frame.vars[p] = *v;
        } else if (stmt->defaults[i]) {
          frame.vars[p] = Eval(*stmt->defaults[i], frame);
        } else {
          frame.vars[p] = Value::Undefined("'" + p + "' is undefined");
        }
      }
      List varargs;
      for (size_t i = n; i < a.positional.size(); ++i) varargs.push_back(a.positional[i]);
      frame.vars["varargs"] = Value::MakeList(std::move(varargs), /*is_tuple=*/true);
      Dict kwargs;
      for (auto& [k, v] : a.keyword) {
        bool is_param = std::find(stmt->params.begin(), stmt->params.end(), k) != stmt->params.end();
        if (k == "caller") frame.vars["caller"] = v;
        else if (!is_param) kwargs.Set(Value::Str(k), v);
      }
      frame.vars["kwargs"] = Value::MakeDict(std::move(kwargs));
      std::string out;
      Exec(*body, frame, out);
      return Value::Str(out);
    });
  }

  Value CallValue(const Value& callee, CallArgs& args) {
    if (callee.is_undefined()) callee.ThrowUndefined();
    if (callee.is_namespace()) {  // a recursive loop's `loop(...)`
      const Value* call = static_cast<const Dict&>(callee.dict()).Find("__call__");
      if (call != nullptr) return call->Call(args);
    }
    if (!callee.is_function()) throw TemplateError("TypeError: '" + callee.TypeName() + "' object is not callable");
    return callee.Call(args);
  }

  CallArgs EvalArgs(const Expr& e, Scope& scope) {
    CallArgs args;
    for (const ExprPtr& a : e.args) args.positional.push_back(Eval(*a, scope));
    for (const auto& [k, a] : e.kwargs) args.keyword.emplace_back(k, Eval(*a, scope));
    return args;
  }

  // Applies a filter chain whose innermost target is null to `v`.
  Value ApplyFilterChain(const Expr& f, Value v, Scope& scope) {
    if (!f.children.empty() && f.children[0]) v = ApplyFilterChain(*f.children[0], std::move(v), scope);
    CallArgs args = EvalArgs(f, scope);
    return ApplyFilter(f.name, v, args);
  }

  Value Eval(const Expr& e, Scope& scope) {
    try {
      return EvalExpr(e, scope);
    } catch (TemplateError& err) {
      if (err.line == 0) {
        err.line = e.line;
        err.column = e.column;
      }
      throw;
    }
  }

  Value EvalExpr(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: {
        if (Value* v = scope.Find(e.name)) return *v;
        return Value::Undefined("'" + e.name + "' is undefined");
      }
      case ExprKind::kList: {
        List items;
        for (const ExprPtr& c : e.children) items.push_back(Eval(*c, scope));
        return Value::MakeList(std::move(items), e.is_tuple);
      }
      case ExprKind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2)
          d.Set(Eval(*e.children[i], scope), Eval(*e.children[i + 1], scope));
        return Value::MakeDict(std::move(d));
      }
      case ExprKind::kGetAttr: return GetAttr(Eval(*e.children[0], scope), e.name);
      case ExprKind::kGetItem: return GetItem(Eval(*e.children[0], scope), Eval(*e.children[1], scope));
      case ExprKind::kSlice: {
        auto opt = [&](size_t i) { return e.children[i] ? Eval(*e.children[i], scope) : Value::None(); };
        return SliceOf(Eval(*e.children[0], scope), opt(1), opt(2), opt(3));
      }
      case ExprKind::kCall: {
        Value callee = Eval(*e.children[0], scope);
        CallArgs args = EvalArgs(e, scope);
        return CallValue(callee, args);
      }
      case ExprKind::kFilter: {
        Value target = Eval(*e.children[0], scope);
        CallArgs args = EvalArgs(e, scope);
        return ApplyFilter(e.name, target, args);
      }
      case ExprKind::kTest: {
        Value target = Eval(*e.children[0], scope);
        CallArgs args = EvalArgs(e, scope);
        return Value::Bool(ApplyTest(e.name, target, args) != e.negated);
      }
      case ExprKind::kUnary: {
        Value v = Eval(*e.children[0], scope);
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.is_undefined()) v.ThrowUndefined();
        if (!v.is_number()) throw TemplateError("TypeError: bad operand type for unary " + e.name + ": '" + v.TypeName() + "'");
        if (e.name == "+") return v.is_float() ? v : Value::Int(v.as_int());
        return v.is_float() ? Value::Float(-v.as_float()) : Value::Int(-v.as_int());
      }
      case ExprKind::kBinary: {
        Value a = Eval(*e.children[0], scope);
        if (e.name == "and") return a.Truthy() ? Eval(*e.children[1], scope) : a;
        if (e.name == "or") return a.Truthy() ? a : Eval(*e.children[1], scope);
        return BinaryOp(e.name, a, Eval(*e.children[1], scope));
      }
      case ExprKind::kCond: {
        if (Eval(*e.children[0], scope).Truthy()) return Eval(*e.children[1], scope);
        return e.children[2] ? Eval(*e.children[2], scope) : Value::Undefined("the inline if-expression on line " + std::to_string(e.line) + " evaluated to false and no else section was defined.");
      }
    }
    return Value::Undefined();
  }

  static constexpr int kMaxCallDepth = 200;
  Scope* root_;
  int call_depth_ = 0;
};

}  // namespace

std::string RenderProgram(const Program& program,
                          const std::vector<std::pair<std::string, Value>>& variables) {
  Scope globals;
  for (auto& [k, v] : MakeGlobals()) globals.vars[k] = std::move(v);
  Scope root{{}, &globals};
  for (const auto& [k, v] : variables) root.vars[k] = v;
  Interpreter interp(&root);
  std::string out;
  interp.Exec(program.body, root, out);
  return out;
}

}  // namespace ember::tmpl
