// Tool calls -> grammar (compile_tool_calls): each function's parameters schema
// compiled by compile_json_schema, its rules copied into one builder beside the
// literal call syntax.
#include <set>

#include <nlohmann/json.hpp>

#include "grammar/grammar_ir.h"

namespace cellm {

namespace {

using grammar::GrammarIr;
using grammar::IrBuilder;
using grammar::Sequence;
using grammar::Symbol;

// Copies every rule of `ir` into `b` (names prefixed) and returns its root as a
// symbol of `b`.
Symbol import_grammar(IrBuilder& b, const GrammarIr& ir, const std::string& prefix) {
  std::vector<uint32_t> index(ir.rules.size());
  for (size_t r = 0; r < ir.rules.size(); ++r) {
    index[r] = b.add_rule(prefix + ir.rules[r].name);
  }
  for (size_t r = 0; r < ir.rules.size(); ++r) {
    for (const Sequence& alt : ir.rules[r].alternatives) {
      Sequence copy;
      copy.reserve(alt.size());
      for (const Symbol& s : alt) {
        copy.push_back(s.is_rule ? Symbol{true, index[s.index]} : b.bytes(ir.sets[s.index]));
      }
      b.add_alternative(index[r], std::move(copy));
    }
  }
  return Symbol{true, index[ir.root]};
}

void append(Sequence& seq, const Sequence& more) {
  seq.insert(seq.end(), more.begin(), more.end());
}

}  // namespace

Result<Grammar> compile_tool_calls(const ToolCallSyntax& syntax,
                                   std::span<const ToolCallSchema> functions, bool allow_many,
                                   const GrammarLimits& limits) {
  if (functions.empty()) return InvalidArgument("tool calls: no function to call");
  IrBuilder b(limits);
  std::set<std::string> names;
  std::vector<Sequence> calls;
  const std::string key_text = nlohmann::json(syntax.arguments_key).dump();
  for (const ToolCallSchema& f : functions) {
    if (f.name.empty()) return InvalidArgument("tool calls: a function has an empty name");
    if (!names.insert(f.name).second) {
      return InvalidArgument("tool calls: two functions are named '" + f.name + "'");
    }
    Result<Grammar> arguments = compile_json_schema(f.parameters_schema, limits);
    if (!arguments.ok()) {
      return Status(arguments.status().code(),
                    "the parameters of function '" + f.name + "': " + arguments.status().message());
    }
    const Symbol args = import_grammar(b, arguments->impl().ir, "args-");
    // The name as a JSON string (escapes as JSON writes them).
    const std::string name_text = nlohmann::json(f.name).dump();
    Sequence call = b.literal(syntax.call_open);
    append(call, b.literal("{\"name\": " + name_text + ", " + key_text + ": "));
    call.push_back(args);
    append(call, b.literal("}"));
    append(call, b.literal(syntax.call_close));
    calls.push_back(std::move(call));
  }
  const Symbol call = b.rule_of("call", std::move(calls));
  Sequence root_seq = b.literal(syntax.prefix);
  root_seq.push_back(call);
  if (allow_many) {
    Sequence more = b.literal(syntax.separator);
    more.push_back(call);
    root_seq.push_back(b.repeat(more, 0, -1, "more-calls"));
  }
  append(root_seq, b.literal(syntax.suffix));
  const uint32_t root = b.add_rule("root");
  b.add_alternative(root, std::move(root_seq));
  CELLM_ASSIGN_OR_RETURN(GrammarIr ir, b.finish(root));
  return grammar::make_grammar(std::move(ir));
}

}  // namespace cellm
