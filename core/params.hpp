// The vocabulary every layer shares: the bad-input error, and typed, declared parameters with
// their parsing (a mechanism's `--param`s; any layer can declare its own the same way).
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ab {

// Bad input: an unknown name, an impossible shape, a value out of range. The CLI prints the
// message and exits 2.
struct InvalidInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ParamType { Int, Float, Bool, Choice };
using ParamValue = std::variant<int64_t, double, bool, std::string>;

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::Int;
  ParamValue def;
  double min = 0, max = 0;            // Int and Float: inclusive range
  std::vector<std::string> choices;   // Choice
  std::string help;
  std::string describe_range() const;
};

// Resolved values for every declared parameter (defaults included), in declaration order.
class ParamValues {
 public:
  ParamValues() = default;
  int64_t get_int(const std::string& n) const { return std::get<int64_t>(at(n)); }
  double get_float(const std::string& n) const { return std::get<double>(at(n)); }
  bool get_bool(const std::string& n) const { return std::get<bool>(at(n)); }
  const std::string& get_choice(const std::string& n) const { return std::get<std::string>(at(n)); }
  const std::vector<std::pair<std::string, ParamValue>>& items() const { return items_; }
  void set(const std::string& n, ParamValue v);
  const ParamValue& at(const std::string& n) const;

 private:
  std::vector<std::pair<std::string, ParamValue>> items_;
};

// The closest of `known` to `name` (edit distance), when close enough to be a misspelling of it.
std::optional<std::string> closest_name(const std::string& name, const std::vector<std::string>& known);
// The error for a name that is not one of `known`: "unknown WHAT 'NAME' (did you mean 'X'?);
// LIST_LABEL: a, b, c" (the suggestion only when one is close).
InvalidInput unknown_name(const std::string& what, const std::string& name, const std::vector<std::string>& known,
                          const std::string& list_label = "known");

// "64", "0.75", "true", "dense": the value as the command line spells it.
std::string format_param_value(const ParamValue& v);
// "k=256 share_kv=false": every value, space-separated (table rows, titles).
std::string params_text(const ParamValues& values);

// Parses "name=value" assignments against `owner`'s declared parameters (defaults for the rest);
// unknown names and out-of-range or ill-typed values throw InvalidInput listing what is valid.
ParamValues resolve_params(const std::string& owner, const std::vector<ParamSpec>& specs,
                           const std::vector<std::string>& assignments);

}  // namespace ab
