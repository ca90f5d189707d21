#include "bench/engine/list.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "attention_impls/capability_checks.hpp"
#include "attention_impls/registry.hpp"
#include "bench/points/point.hpp"
#include "bench/engine/task_cli.hpp"
#include "bench/text/terminal.hpp"
#include "bench/text/text_table.hpp"

namespace ab {

namespace {
// The encodings a mechanism admits beyond the embedding's (sinusoidal, learned, none: every
// mechanism): "all" (RoPE's rotation of q, k and the additive ones inside its kernels), "rope",
// or "emb" (none beyond the embedding's). Short words: the fitted table keeps them whole.
std::string admitted_positions(const Capabilities& c) {
  if (c.rope && c.additive_bias) return "all";
  if (c.rope) return "rope";
  return c.additive_bias ? "additive" : "emb";
}
}  // namespace

namespace {
const char* type_name(PointFieldType t) {
  switch (t) {
    case PointFieldType::Text: return "text";
    case PointFieldType::Int: return "int";
    case PointFieldType::Flag: return "flag";
    case PointFieldType::Mechanism: return "mechanism";
    case PointFieldType::Params: return "params";
  }
  return "";
}
const char* scope_name(PointField::Scope s) {
  switch (s) {
    case PointField::all: return "all";
    case PointField::model: return "model";
    case PointField::real_data: return "real_data";
    case PointField::training: return "training";
    case PointField::low_precision: return "low_precision";
  }
  return "";
}

// The point schema (bench/points/point.hpp) in its name's order: what scripts read names through.
int list_fields(int width, bool json) {
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& f : point_fields())
      out.push_back({{"key", f.key}, {"segment", f.segment}, {"option", f.option}, {"type", type_name(f.type)},
                     {"scope", scope_name(f.scope)}, {"named_when_set", f.named_when_set}, {"help", f.help ? f.help : ""}});
    std::cout << nlohmann::json{{"fields", out},
                                {"name", "segment:value joined by '/', in this order; a field out of its scope or unset "
                                         "(named_when_set) is left out; params: one NAME:value segment per mechanism "
                                         "parameter after the mechanism's; a text value may hold '/' (a data directory)"}}
                     .dump(1)
              << "\n";
    return 0;
  }
  TextTable t;
  t.header = {"segment", "JSON key", "option", "type", "scope", "meaning"};
  t.keep = {0, 1, 2, 3, 4};
  for (const auto& f : point_fields())
    t.rows.push_back({f.segment, f.key, f.option, type_name(f.type), std::string(scope_name(f.scope)) + (f.named_when_set ? ", when set" : ""),
                      f.help ? f.help : ""});
  std::cout << render_markdown(t, width);
  return 0;
}
}  // namespace

int cmd_list(const std::string& what, const std::string& name, int width, bool json) {
  if (json && what != "fields") throw InvalidInput("--format json applies to `list fields`");
  if (what == "fields") return list_fields(width, json);
  if (what == "mechanisms") {
    // In full (--wide) one table; fitted, the capabilities in the table and each mechanism's
    // complexity and summary below it, wrapped.
    TextTable t;
    t.header = {"mechanism", "family", "exact", "causal", "backward", "decode", "attn dropout", "bf16", "positions", "complexity", "summary"};
    if (width > 0) t.header.resize(9);
    t.keep = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    std::string details = width > 0 ? "\nWhat each computes and costs (attnbench list --wide: one table):\n" : "";
    std::string notes;
    for (const auto& m : mechanisms()) {
      // The causal and decode claims, checked now on seeded inputs (CAB's checks: a claim is
      // shown as "checked" only when it holds).
      const CapabilityCheck prefix = check_causal_prefix(m.name), decode = check_decode(m.name);
      auto claim = [](bool claims, const CapabilityCheck& c) {
        return !claims ? std::string("no") : c.passed ? std::string("checked") : std::string("FAILS");
      };
      for (const auto& [what, c] : {std::pair{"causal prefix", &prefix}, std::pair{"decode", &decode}})
        if (c->applies && !c->passed) notes += wrap_words(fmt::format("- {}: {} check fails: {}", m.name, what, c->detail), width, "  ");
      std::vector<std::string> row = {m.name, m.family, m.caps.exact ? "exact" : "approximate", claim(m.caps.causal, prefix),
                                       m.caps.backward ? "yes" : "no", claim(m.caps.decode, decode),
                                       m.caps.attn_dropout ? "yes" : "no", m.bf16.available ? "yes" : "no",
                                       admitted_positions(m.caps), m.complexity, m.summary};
      if (width > 0) {
        row.resize(9);
        details += wrap_words(fmt::format("- {}: {}; {}", m.name, m.summary, m.complexity), width, "  ");
      }
      t.rows.push_back(row);
      if (!m.caps.attn_dropout)
        notes += wrap_words(fmt::format("- {}: no attention dropout: {}", m.name, m.caps.no_attn_dropout), width, "  ");
      if (!m.caps.rope) notes += wrap_words(fmt::format("- {}: no --positions rope: {}", m.name, m.caps.no_rope), width, "  ");
      if (m.caps.rope_feature_maps)
        notes += wrap_words(fmt::format("- {}: --positions rope rotates its feature maps phi(q), phi(k) in the numerator "
                                        "only (RoFormer section 3.3), not q and k", m.name), width, "  ");
      if (!m.caps.additive_bias)
        notes += wrap_words(fmt::format("- {}: no --positions alibi, bias or shaw: {}", m.name, m.caps.no_additive_bias), width, "  ");
      if (m.bf16.available && !m.bf16.constraints.empty())
        notes += wrap_words(fmt::format("- {}: bf16 (--dtype bf16): {}", m.name, m.bf16.constraints), width, "  ");
    }
    notes += wrap_words("positions: the --positions a model with this mechanism takes. emb: the embedding's only "
                        "(sinusoidal, learned, none); rope: those and rope (q and k rotated before the mechanism, or its feature maps inside it); all: "
                        "those and alibi, bias (T5) and shaw, added to its logits inside its kernels",
                        width, "  ");
    notes += wrap_words("causal, decode: \"checked\" is a claim verified now on seeded inputs (CAB's checks): every "
                        "position's output unchanged when the later positions change, and token-by-token decoding equal to "
                        "the causal forward, to 1e-5 relative; \"FAILS\" a claim that does not hold",
                        width, "  ");
    std::cout << render_markdown(t, width) << details << (notes.empty() ? "" : "\n" + notes);
    return 0;
  }
  if (what == "params") {
    if (name.empty()) throw InvalidInput(fmt::format("list params needs a mechanism name; known: {}", fmt::join(mechanism_names(), ", ")));
    const auto& m = find_mechanism(name);
    if (m.params.empty()) {
      std::cout << m.name << " has no parameters\n";
      return 0;
    }
    TextTable t;
    t.header = {"parameter", "default", "allowed", "meaning"};
    t.keep = {0, 1, 2, 3};
    for (const auto& p : m.params) t.rows.push_back({p.name, format_param_value(p.def), p.describe_range(), p.help});
    std::cout << render_markdown(t, width);
    return 0;
  }
  if (what == "tasks") {
    TaskOptions o;
    o.data_dir = name;
    return cmd_list_tasks(o, width);
  }
  throw unknown_name("list", what, {"mechanisms", "params", "tasks", "fields"}, "lists");
}

}  // namespace ab
