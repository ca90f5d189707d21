// The point schema (bench/point.hpp) round trip, field by field: every identity field `run`
// writes reads back, appears in the point's name, in the reproducing label and in `table`'s
// group title. One parametrised test over the table, so a new field is covered by adding it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/point.hpp"
#include "bench/result_reader.hpp"
#include "bench/table.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {

struct Written {
  nlohmann::json entry;   // the first entry as `run` wrote it
  PointResult read;       // the point as the reader reads it back
  std::string table;      // `table`'s markdown of the file
};

// One attention-level and one model-level point, each with a value of its own in every field.
const std::vector<Written>& written() {
  static const std::vector<Written> w = [] {
    std::vector<Written> out;
    const char* commands[] = {
        "run --attn local --param block=16 --param lookback=2 --seq 48 --batch 2 --heads 3 --dhead 8 --causal "
        "--mode fwdbwd --threads 1 --reps 1 --min-time 0",
        "run --level model --task listops --mode train --attn local --param block=16 --seq 32 --layers 1 --dmodel 16 "
        "--heads 2 --mlp 24 --batch 2 --threads 1 --reps 1 --min-time 0"};
    for (const char* c : commands) {
      const std::string path = test::temp_path("schema.json");
      auto e = test::exec(std::string(c) + " --out " + path, false);
      EXPECT_EQ(e.code, 0) << c << "\n" << e.out;
      std::ifstream in(path);
      Written x;
      x.entry = nlohmann::json::parse(in)["benchmarks"][0];
      const ResultFile rf = read_result_file(path);
      x.read = rf.points.at(0);
      x.table = make_table({rf}, TableOptions{"time", "none", "md", false, "", ""});
      std::filesystem::remove(path);
      out.push_back(std::move(x));
    }
    return out;
  }();
  return w;
}

class PointSchema : public ::testing::TestWithParam<size_t> {};

TEST_P(PointSchema, FieldRoundTripsThroughNameLabelJsonAndTable) {
  const PointField& f = point_fields()[GetParam()];
  for (const Written& w : written()) {
    const PointId& id = w.read.id;
    SCOPED_TRACE(id.name());
    if (!has_field(f, id)) {
      EXPECT_FALSE(w.entry["point"].contains(f.key));
      continue;
    }
    // Written by `run`, read back with the same value.
    const nlohmann::json& stored = std::string(f.key) == "threads" ? w.entry : w.entry["point"];
    ASSERT_TRUE(stored.contains(f.key)) << f.key;
    const PointValue v = f.get(id);
    if (f.type == PointFieldType::Params) {
      EXPECT_EQ(stored[f.key].size(), id.params.items().size());
      for (const auto& [k, pv] : id.params.items()) EXPECT_EQ(stored[f.key][k], format_param_value(pv)) << k;
    } else {
      std::visit([&](const auto& x) { EXPECT_EQ(stored[f.key], x) << f.key; }, v);
    }
    EXPECT_EQ(id.name(), w.entry["run_name"]);
    // In the name.
    const std::string name = id.name();
    if (f.type == PointFieldType::Params) {
      for (const auto& [k, pv] : id.params.items())
        EXPECT_NE(name.find("/" + k + ":" + format_param_value(pv)), std::string::npos) << k;
    } else {
      const std::string seg = std::string(f.segment) + ":" + value_text(v);
      EXPECT_TRUE(name.rfind(seg, 0) == 0 || name.find("/" + seg) != std::string::npos) << seg << " in " << name;
    }
    // In the reproducing label.
    const std::string label = w.read.label;
    if (!f.in_arguments || f.in_arguments(id)) {
      if (f.type == PointFieldType::Params) {
        for (const auto& [k, pv] : id.params.items())
          EXPECT_NE(label.find("--param " + k + "=" + format_param_value(pv)), std::string::npos) << label;
      } else if (f.type == PointFieldType::Flag) {
        EXPECT_EQ(label.find(std::string(" ") + f.option) != std::string::npos, std::get<bool>(v)) << label;
      } else {
        EXPECT_NE(label.find(std::string(" ") + f.option + " " + value_text(v)), std::string::npos) << label;
      }
    }
    // In the table: a grouping field in the group's title, the others as rows or columns.
    if (f.group_cluster > 0) {
      EXPECT_NE(group_title(id).find(f.describe(id)), std::string::npos) << f.key;
      EXPECT_NE(w.table.find(group_title(id)), std::string::npos) << w.table;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryField, PointSchema, ::testing::Range<size_t>(0, point_fields().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) { return std::string(point_fields()[i.param].key); });

}  // namespace
}  // namespace ab
