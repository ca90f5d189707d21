// The point schema (bench/points/point.hpp) round trip, field by field: every identity field `run`
// writes reads back, appears in the point's name, in the reproducing label and in `table`'s
// group title. One parametrised test over the table, so a new field is covered by adding it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "bench/points/point.hpp"
#include "bench/results/result_reader.hpp"
#include "bench/results/table.hpp"
#include "bench/points/train_presets.hpp"
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

// Every point of every training preset (and its timing points) named, read back from its name
// alone, and named again: the same name and the same point fields (JSON), so a name is a point.
TEST(PointNames, EveryPresetPointRoundTripsThroughItsName) {
  TrainPresetOptions o;
  o.data_dir = "/usr/share/datasets/fashion-mnist";  // a value holding '/'
  size_t checked = 0;
  for (const std::string& preset : train_presets())
    for (const auto& points : {train_preset_grid(preset, o), train_preset_timing_points(preset, o)})
      for (const PointId& id : points) {
        const PointId back = PointId::from_name(id.name());
        ASSERT_EQ(back.name(), id.name()) << preset;
        nlohmann::json a, b;
        write_point(id, a);
        write_point(back, b);
        ASSERT_EQ(a, b) << id.name();
        ++checked;
      }
  EXPECT_GT(checked, 500u);
  // The two points `run` wrote above, attention and model level.
  for (const Written& w : written()) EXPECT_EQ(PointId::from_name(w.read.id.name()).name(), w.read.id.name());
}

// A recipe's values are typed: a rate is the number its name spells (six significant digits),
// so the run trains with what the name shows; the schedule and the encoding are parsed once,
// into their shapes, and spelled canonically.
TEST(PointNames, RecipeValuesAreTypedAndTrainWithWhatTheNameSpells) {
  PointId id = train_preset_grid("zoology-mqar", TrainPresetOptions{}).front();
  point_field("lr").set(id, std::string("0.00123456789"));
  point_field("schedule").set(id, std::string("step:30"));
  point_field("positions").set(id, std::string("bias"));
  point_field("test_seq").set(id, std::string("256,1024"));
  EXPECT_EQ(id.train.lr, 0.00123457);
  EXPECT_EQ(id.train.schedule.kind, Schedule::step);
  EXPECT_EQ(id.train.schedule.decay_at, 30);
  ASSERT_TRUE(id.train.positions.has_value());
  EXPECT_EQ(id.train.positions->kind, Positions::bias);
  EXPECT_EQ(id.train.test_seq, (std::vector<int64_t>{256, 1024}));
  const std::string name = id.name();
  for (const char* seg : {"/lr:0.00123457/", "/schedule:step:30:0.1/", "/positions:bias:32:128/", "/test_seq:256,1024"})
    EXPECT_NE(name.find(seg), std::string::npos) << seg << " in " << name;
  const PointId back = PointId::from_name(name);
  EXPECT_EQ(back.train.lr, id.train.lr);
  EXPECT_EQ(back.name(), name);
  EXPECT_THROW(point_field("test_seq").set(id, std::string("1024,256")), InvalidInput);
  EXPECT_THROW(point_field("clip_mode").set(id, std::string("sideways")), InvalidInput);
}

// --seed on a preset gives every configuration each seed asked for (the recall and extrapolation
// presets took the first seed alone, silently).
TEST(PresetSeeds, EveryConfigurationRunsEverySeedGiven) {
  TrainPresetOptions o;
  o.seeds = {2, 3};
  for (const std::string& preset : train_presets()) {
    std::map<std::string, std::set<int64_t>> seeds_of;  // configuration (name without the seed) -> seeds
    for (PointId id : train_preset_grid(preset, o)) {
      const int64_t seed = id.train.seed;
      id.train.seed = 0;
      seeds_of[id.name()].insert(seed);
    }
    ASSERT_FALSE(seeds_of.empty()) << preset;
    for (const auto& [config, seeds] : seeds_of) EXPECT_EQ(seeds, (std::set<int64_t>{2, 3})) << preset << ": " << config;
  }
}

// The field table scripts read names through: every field, in the name's order.
TEST(PointNames, ListFieldsExportsTheSchemaAsJson) {
  const auto e = test::exec("list fields --format json", false);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto j = nlohmann::json::parse(e.out);
  ASSERT_EQ(j["fields"].size(), point_fields().size());
  for (size_t i = 0; i < point_fields().size(); ++i) {
    EXPECT_EQ(j["fields"][i]["segment"], point_fields()[i].segment);
    EXPECT_EQ(j["fields"][i]["key"], point_fields()[i].key);
  }
  const auto wrong = test::exec("list mechanisms --format json");
  EXPECT_EQ(wrong.code, 2) << wrong.out;
  EXPECT_NE(wrong.out.find("list fields"), std::string::npos) << wrong.out;
}

TEST(PointNames, ANameThatIsNotOneIsRefusedNamingTheSegment) {
  const std::string good = written()[0].read.id.name();
  auto refused = [](const std::string& name, const std::string& says) {
    try {
      PointId::from_name(name);
      ADD_FAILURE() << "accepted " << name;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("", "attn:NAME");
  refused(good + "/colour:red", "'colour:red'");
  std::string n = good;
  n.replace(n.find("/N:48"), 5, "/N:4x8");
  refused(n, "N '4x8' is not an integer");
  n = good;
  n.replace(n.find("causal:1"), 8, "causal:2");
  refused(n, "causal '2' is not 0 or 1");
}

}  // namespace
}  // namespace ab
