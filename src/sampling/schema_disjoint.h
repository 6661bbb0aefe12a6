// The proof that `oneOf` is exact: no value the machine writes for one branch is also valid
// against another (then following the branches as `anyOf` accepts exactly the instances valid
// against one branch). Works over the compiled nodes (json_schema.h), with the facts a node does
// not keep (SchemaNodeFacts). Sound, not complete: "exclusive" only where it is proven —
// different JSON types, literal sets (enum/const) no value of which the other branch accepts,
// strings whose automata share no text, integers whose ranges/multiples share no value, array
// lengths, and objects where a property required by one is never written by the other, is
// forbidden by it (additionalProperties false), or has values excluding each other (the usual
// discriminator: `kind: {const: "a"}` / `kind: {const: "b"}`). Anything else is "may overlap".
// Bounded: nested subschemas are followed kMaxDepth deep (deeper: "may overlap"). Pure functions
// over an immutable graph, used only while compiling.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sampling/json_schema.h"
#include "sampling/regex_dfa.h"

namespace ember {

// What the machine's node drops of the schema's meaning (the machine only writes values of its
// kind, and of an object only its properties).
struct SchemaNodeFacts {
  // The schema names its type (`type`, or enum/const): values of other types fail it. Without,
  // an object or array node (inferred from its keywords) accepts every value of other types.
  bool typed = false;
  bool closed = false;  // an object schema with additionalProperties false
  // Compiled from a rewrite (not, if, minProperties) whose machine may leave out values the
  // schema allows (unlisted keys, other types), or a string with a `format` (its regex is
  // narrower): as the other branch, nothing is proven.
  bool narrowed = false;
};

struct SchemaGraph {
  const std::vector<JsonSchemaNode>& nodes;
  const std::vector<std::vector<int32_t>>& branches;  // a kUnion node's branches
  const std::vector<SchemaNodeFacts>& facts;
  const std::vector<std::shared_ptr<const RegexDfa>>& dfas;
};

// True when no value the machine writes for node `a` is valid against node `b`'s schema.
// `*intersections` bounds the automaton products tried (each up to RegexDfa::kMaxStates), shared
// by a compile's proofs: at 0, strings and integers are "may overlap".
bool MachineExcludes(const SchemaGraph& g, int32_t a, int32_t b, int* intersections);

}  // namespace ember
