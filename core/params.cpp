#include "core/params.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cctype>

namespace ab {

std::optional<std::string> closest_name(const std::string& name, const std::vector<std::string>& known) {
  // Damerau-Levenshtein (optimal string alignment), case-insensitive.
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string a = lower(name);
  std::optional<std::string> best;
  size_t best_d = std::string::npos;
  for (const auto& k : known) {
    const std::string b = lower(k);
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
      for (size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    const size_t dist = d[a.size()][b.size()];
    // A prefix of the name is a suggestion too ("perf" for "performer").
    const size_t score = b.rfind(a, 0) == 0 && a.size() >= 3 ? 1 : dist;
    if (score < best_d) {
      best_d = score;
      best = k;
    }
  }
  if (!best || best_d == 0 || best_d > std::max<size_t>(1, name.size() / 3)) return std::nullopt;
  return best;
}

InvalidInput unknown_name(const std::string& what, const std::string& name, const std::vector<std::string>& known,
                          const std::string& list_label) {
  const auto near = closest_name(name, known);
  return InvalidInput(fmt::format("unknown {} '{}'{}; {}: {}", what, name, near ? fmt::format(" (did you mean '{}'?)", *near) : "",
                                  list_label, fmt::join(known, ", ")));
}

std::string format_param_value(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>) return fmt::format("{:g}", x);
        else if constexpr (std::is_same_v<T, int64_t>) return std::to_string(x);
        else return x;
      },
      v);
}

std::string params_text(const ParamValues& values) {
  std::string s;
  for (const auto& [k, v] : values.items()) s += (s.empty() ? "" : " ") + k + "=" + format_param_value(v);
  return s;
}

std::string ParamSpec::describe_range() const {
  switch (type) {
    case ParamType::Int:
      return fmt::format("integer in [{}, {}]", static_cast<int64_t>(min), static_cast<int64_t>(max));
    case ParamType::Float: return fmt::format("number in [{:g}, {:g}]", min, max);
    case ParamType::Bool: return "true or false";
    case ParamType::Choice: return fmt::format("one of {}", fmt::join(choices, ", "));
  }
  return "";
}

void ParamValues::set(const std::string& n, ParamValue v) {
  for (auto& [name, value] : items_)
    if (name == n) {
      value = std::move(v);
      return;
    }
  items_.emplace_back(n, std::move(v));
}

const ParamValue& ParamValues::at(const std::string& n) const {
  for (const auto& [name, value] : items_)
    if (name == n) return value;
  throw std::logic_error("parameter not declared: " + n);
}

namespace {
ParamValue parse_value(const std::string& owner, const ParamSpec& p, const std::string& text) {
  auto bad = [&]() {
    return InvalidInput(fmt::format("{}: parameter {}={} is invalid; expected {}", owner, p.name,
                                    text, p.describe_range()));
  };
  switch (p.type) {
    case ParamType::Int: {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno) throw bad();
      if (static_cast<double>(v) < p.min || static_cast<double>(v) > p.max) throw bad();
      return static_cast<int64_t>(v);
    }
    case ParamType::Float: {
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(v) || v < p.min || v > p.max) throw bad();
      return v;
    }
    case ParamType::Bool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      throw bad();
    case ParamType::Choice:
      if (std::find(p.choices.begin(), p.choices.end(), text) == p.choices.end()) throw bad();
      return text;
  }
  throw bad();
}
}  // namespace

ParamValues resolve_params(const std::string& owner, const std::vector<ParamSpec>& specs,
                           const std::vector<std::string>& assignments) {
  ParamValues out;
  for (const auto& p : specs) out.set(p.name, p.def);
  for (const auto& a : assignments) {
    auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InvalidInput(fmt::format("--param '{}' is not of the form name=value", a));
    std::string name = a.substr(0, eq), text = a.substr(eq + 1);
    auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& p) { return p.name == name; });
    if (it == specs.end()) {
      std::vector<std::string> names;
      for (const auto& p : specs) names.push_back(p.name);
      throw InvalidInput(fmt::format("{} has no parameter '{}'; its parameters: {}", owner, name,
                                     names.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(names, ", "))));
    }
    out.set(name, parse_value(owner, *it, text));
  }
  return out;
}

}  // namespace ab
