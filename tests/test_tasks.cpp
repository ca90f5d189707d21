// Tasks: determinism, the ListOps labels and windows, the copy layout, Pathfinder's balance and
// connectivity (by flood fill over the generator's contour map), the real-data readers on
// fixture files written here, and the task verbs of the binary.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "attention_impls/attention.hpp"
#include "tasks/task.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {

namespace fs = std::filesystem;
using test::exec;

TaskOptions opts(uint64_t seed, int64_t seq = 0, const std::string& dir = "") {
  TaskOptions o;
  o.seed = seed;
  o.seq = seq;
  o.data_dir = dir;
  return o;
}

class EveryTask : public ::testing::TestWithParam<std::string> {};
TEST_P(EveryTask, SameSeedSameBatchesOtherSeedDifferent) {
  const std::string name = GetParam();
  const int64_t seq = name == "pathx" ? 0 : (name == "text" || name == "retrieval" || name == "listops") ? 512 : 0;
  const auto a = make_task(name, opts(3, seq)), b = make_task(name, opts(3, seq)), c = make_task(name, opts(4, seq));
  const Batch x = a->batch(0, 4), y = b->batch(0, 4), z = c->batch(0, 4);
  EXPECT_EQ(x.tokens, y.tokens);
  EXPECT_EQ(x.tokens2, y.tokens2);
  EXPECT_EQ(x.labels, y.labels);
  EXPECT_NE(x.tokens, z.tokens);
  EXPECT_EQ(x.tokens.size(), static_cast<size_t>(4 * a->seq()));
  // Example i of a batch is example(i) alone: batches can start anywhere.
  const Batch later = a->batch(2, 2);
  EXPECT_TRUE(std::equal(later.tokens.begin(), later.tokens.end(), x.tokens.begin() + 2 * a->seq()));
  const auto& info = find_task(name);
  for (int32_t t : x.tokens) ASSERT_TRUE(t >= 0 && t < info.vocab) << t;
  for (int32_t l : x.labels) ASSERT_TRUE(info.classes == 0 ? l == -1 : (l >= 0 && l < info.classes)) << l;
}
INSTANTIATE_TEST_SUITE_P(All, EveryTask,
                         ::testing::Values("copy", "listops", "text", "retrieval", "image", "pathfinder", "pathx"));

TEST(ListOps, LabelsEqualTheEvaluatorLengthsRespectTheWindowAllOperatorsAndDepthsOccur) {
  std::set<int32_t> depths, operators, labels;
  // Small windows reach the shallow trees (a depth-2 tree has at most 12 tokens), LRA's the deep ones.
  for (auto [seq, count] : {std::pair{24, 1500}, std::pair{128, 1500}, std::pair{2000, 1500}}) {
    const auto task = make_task("listops", opts(1, seq));
    for (int64_t i = 0; i < count; ++i) {
      const Example e = task->example(i);
      ASSERT_EQ(e.tokens.size(), static_cast<size_t>(seq));
      const int64_t len = std::count_if(e.tokens.begin(), e.tokens.end(), [](int32_t t) { return t != 0; });
      ASSERT_GT(len, seq / 4) << i;
      ASSERT_LT(len, seq) << i;
      for (int64_t k = len; k < seq; ++k) ASSERT_EQ(e.tokens[static_cast<size_t>(k)], 0);
      ASSERT_EQ(e.label, listops_evaluate(e.tokens)) << listops_spelling(e.tokens);
      ASSERT_LE(e.depth, 10);
      depths.insert(e.depth);
      labels.insert(e.label);
      for (int32_t t : e.tokens)
        if (t >= 11 && t <= 14) operators.insert(t);
    }
  }
  EXPECT_EQ(operators, (std::set<int32_t>{11, 12, 13, 14}));
  EXPECT_EQ(depths, (std::set<int32_t>{2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(labels.size(), 10u);
}

TEST(ListOps, EvaluatorAndSpelling) {
  // [MAX 2 9 [MIN 4 7 ] 0 ] = 9; [MED 1 2 5 8 ] = (2 + 5) / 2 rounded down = 3; [SM 7 8 ] = 5.
  const std::vector<int32_t> e = {12, 3, 10, 11, 5, 8, 15, 1, 15, 0, 0};
  EXPECT_EQ(listops_evaluate(e), 9);
  EXPECT_EQ(listops_spelling(e), "[MAX 2 9 [MIN 4 7 ] 0 ]");
  EXPECT_EQ(listops_evaluate({13, 2, 3, 6, 9, 15}), 3);
  EXPECT_EQ(listops_evaluate({14, 8, 9, 15}), 5);
  EXPECT_THROW(listops_evaluate({12, 3, 10}), InvalidInput);
  EXPECT_THROW(listops_evaluate({12, 15}), InvalidInput);
}

TEST(Copy, LayoutAndLossMask) {
  for (int64_t seq : {128, 37}) {
    const auto task = make_task("copy", opts(2, seq));
    for (int64_t i = 0; i < 300; ++i) {
      const Example e = task->example(i);
      const auto sep = std::find(e.tokens.begin(), e.tokens.end(), 0);
      ASSERT_NE(sep, e.tokens.end());
      const int64_t n = sep - e.tokens.begin();
      ASSERT_GE(n, seq / 4);
      ASSERT_LT(n, seq / 2);
      for (int64_t k = 0; k < n; ++k) {
        ASSERT_TRUE(e.tokens[k] >= 1 && e.tokens[k] <= 10);
        ASSERT_EQ(e.tokens[n + 1 + k], e.tokens[k]);
      }
      for (int64_t k = 2 * n + 1; k < seq; ++k) ASSERT_EQ(e.tokens[k], 11);
      for (int64_t k = 0; k < seq; ++k) ASSERT_EQ(e.loss_mask[k], k >= n && k <= 2 * n ? 1 : 0) << k;
      ASSERT_EQ(e.label, -1);
    }
  }
}

// Pixels reachable from `from` through drawn pixels (8-connected).
std::vector<bool> flood(const Example& e, int64_t side, int64_t from) {
  std::vector<bool> seen(e.contour.size(), false);
  std::vector<int64_t> stack{from};
  seen[static_cast<size_t>(from)] = true;
  while (!stack.empty()) {
    const int64_t p = stack.back();
    stack.pop_back();
    for (int64_t dy = -1; dy <= 1; ++dy)
      for (int64_t dx = -1; dx <= 1; ++dx) {
        const int64_t x = p % side + dx, y = p / side + dy;
        if (x < 0 || y < 0 || x >= side || y >= side) continue;
        const size_t q = static_cast<size_t>(y * side + x);
        if (!seen[q] && e.contour[q] != 0) {
          seen[q] = true;
          stack.push_back(q);
        }
      }
  }
  return seen;
}

// The synthetic text label is what the document says: its positive words outnumber its negative
// ones by exactly one, and every sentiment word chosen is in the document (none cut off at the end).
// Retrieval: each document holds one phrase of four five-letter words, the same in both exactly
// when the label is 1. Documents fill N/2 to N bytes, less than a word short at most.
std::vector<std::string> words_of(const std::vector<int32_t>& tokens) {
  std::vector<std::string> words(1);
  for (int32_t t : tokens) {
    if (t == 0) break;
    if (t == ' ' + 1) words.emplace_back();
    else words.back() += static_cast<char>(t - 1);
  }
  if (words.back().empty()) words.pop_back();
  return words;
}
int64_t bytes_of(const std::vector<int32_t>& tokens) { return std::count_if(tokens.begin(), tokens.end(), [](int32_t t) { return t != 0; }); }

TEST(SyntheticText, LabelsFollowTheSentimentCountAndNoWordIsCutOff) {
  const SyntheticWords vocab = synthetic_words();
  const auto in = [](const std::vector<std::string>& list, const std::string& w) { return std::find(list.begin(), list.end(), w) != list.end(); };
  for (int64_t seq : {64, 128, 1000}) {
    const auto text = make_task("text", opts(7, seq)), retrieval = make_task("retrieval", opts(7, seq));
    int positives = 0;
    for (int64_t i = 0; i < 500; ++i) {
      const Example e = text->example(i);
      int pos = 0, neg = 0;
      for (const auto& w : words_of(e.tokens)) {
        pos += in(vocab.positive, w);
        neg += in(vocab.negative, w);
        ASSERT_TRUE(in(vocab.positive, w) || in(vocab.negative, w) || in(vocab.neutral, w)) << "'" << w << "'";
      }
      ASSERT_EQ(pos - neg, e.label ? 1 : -1) << "N " << seq << " example " << i << ": " << text_of_tokens(e.tokens, 2000);
      ASSERT_GE(pos + neg, 1);
      ASSERT_LE(bytes_of(e.tokens), seq);
      ASSERT_GE(bytes_of(e.tokens), seq / 2 - 12) << i;
      positives += e.label;

      const Example r = retrieval->example(i);
      std::string phrases[2];
      for (int d = 0; d < 2; ++d) {
        const auto tokens = d ? r.tokens2 : r.tokens;
        ASSERT_LE(bytes_of(tokens), seq);
        std::vector<std::string> rare;
        for (const auto& w : words_of(tokens))
          if (!in(vocab.neutral, w)) rare.push_back(w);
        ASSERT_EQ(rare.size(), 4u) << "N " << seq << " example " << i << " document " << d << ": " << text_of_tokens(tokens, 2000);
        for (const auto& w : rare) phrases[d] += w + " ";
      }
      ASSERT_EQ(phrases[0] == phrases[1], r.label == 1) << i;
    }
    EXPECT_NEAR(positives / 500.0, 0.5, 0.07) << seq;
  }
}

TEST(Pathfinder, LabelsBalancedAndMarkersConnectedExactlyWhenPositive) {
  for (auto [name, count] : {std::pair{"pathfinder", 2000}, std::pair{"pathx", 60}}) {
    const auto task = make_task(name, opts(5));
    const int64_t side = task->image_side();
    int positives = 0;
    for (int64_t i = 0; i < count; ++i) {
      const Example e = task->example(i);
      positives += e.label;
      ASSERT_EQ(e.contour.size(), static_cast<size_t>(side * side));
      // The image shows exactly the drawn contours, with the markers brightest.
      for (size_t p = 0; p < e.contour.size(); ++p) ASSERT_EQ(e.tokens[p] != 0, e.contour[p] != 0) << p;
      ASSERT_EQ(e.tokens[static_cast<size_t>(e.marker_a)], 255);
      ASSERT_EQ(e.tokens[static_cast<size_t>(e.marker_b)], 255);
      const bool joined = flood(e, side, e.marker_a)[static_cast<size_t>(e.marker_b)];
      ASSERT_EQ(joined, e.label == 1) << name << " example " << i;
      std::set<int32_t> snakes(e.contour.begin(), e.contour.end());
      ASSERT_GE(snakes.size(), 3u) << "background and at least two snakes";
    }
    EXPECT_NEAR(double(positives) / count, 0.5, name == std::string("pathfinder") ? 0.05 : 0.2) << name;
  }
}

TEST(Pathfinder, DifficultySetsTheContourLength) {
  auto pixels_of_first_snake = [](const std::string& difficulty) {
    TaskOptions o = opts(8);
    o.difficulty = difficulty;
    const auto task = make_task("pathx", o);
    double total = 0;
    for (int64_t i = 0; i < 20; ++i) {
      const Example e = task->example(i);
      total += static_cast<double>(std::count(e.contour.begin(), e.contour.end(), 2));  // the second long snake: no marker on positives
    }
    return total / 20;
  };
  const double easy = pixels_of_first_snake("easy"), hard = pixels_of_first_snake("hard");
  EXPECT_GT(hard, 1.8 * easy) << easy << " " << hard;  // 14 paddles against 6
  TaskOptions o = opts(1);
  o.difficulty = "impossible";
  EXPECT_THROW(make_task("pathfinder", o), InvalidInput);
}

// ---- real-data readers ----
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) : path(test::temp_path(name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& file, const std::string& bytes) const {
    std::ofstream(path / file, std::ios::binary) << bytes;
  }
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Readers, TextTsvLoadsAndRejectsBadFiles) {
  TempDir d("text_tsv");
  d.write("text.tsv", "label\ttext\n1\tA fine film.\n0\tDull.\n");
  const auto task = make_task("text", opts(1, 64, d.path.string()));
  EXPECT_NE(task->source().find("2 records"), std::string::npos) << task->source();
  const Batch b = task->batch(0, 3);
  EXPECT_EQ(b.labels, (std::vector<int32_t>{1, 0, 1}));  // records repeat
  EXPECT_EQ(b.tokens[0], 'A' + 1);
  EXPECT_EQ(b.tokens[11], '.' + 1);
  EXPECT_EQ(b.tokens[12], 0);
  EXPECT_EQ(text_of_tokens(std::vector<int32_t>(b.tokens.begin() + 64, b.tokens.begin() + 128), 100), "Dull.");
  // Counting the classes of a real split stops at its end instead of counting records again.
  EXPECT_EQ(label_counts(*task, 2, 0, 100).counts, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(label_counts(*task, 2, 1, 100).counts, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(label_counts(*task, 2, 1, 100).commonest(), 0);
  EXPECT_EQ(label_counts(*task, 2, 1, 100).commonest_share(), 1.0);
  EXPECT_NE(message_of([&] { label_counts(*task, 2, 2, 1); }).find("example 2 is past the split's 2 examples"), std::string::npos);
  d.write("text.tsv", "1\tA fine film.\n0\tDu");  // cut short
  EXPECT_NE(message_of([&] { make_task("text", opts(1, 64, d.path.string())); }).find("text.tsv: record 2 is truncated"), std::string::npos);
  d.write("text.tsv", "1\tA fine film.\n7\tDull.\n");
  EXPECT_NE(message_of([&] { make_task("text", opts(1, 64, d.path.string())); }).find("record 2 has label '7'"), std::string::npos);
  d.write("text.tsv", "1\tA\tfine\n");
  EXPECT_NE(message_of([&] { make_task("text", opts(1, 64, d.path.string())); }).find("record 1 has 3 tab-separated fields"), std::string::npos);
  fs::remove(d.path / "text.tsv");
  EXPECT_NE(message_of([&] { make_task("text", opts(1, 64, d.path.string())); }).find("cannot open"), std::string::npos);
}

TEST(Readers, RetrievalTsvLoadsAndRejectsTruncated) {
  TempDir d("retrieval_tsv");
  d.write("new_aan_pairs.train.tsv", "1.0\tp1\tp2\tfirst doc\tsecond doc\n0.0\tp3\tp4\tthird\tfourth\n");
  const auto task = make_task("retrieval", opts(1, 64, d.path.string()));
  const Example e = task->example(1);
  EXPECT_EQ(e.label, 0);
  EXPECT_EQ(text_of_tokens(e.tokens, 100), "third");
  EXPECT_EQ(text_of_tokens(e.tokens2, 100), "fourth");
  d.write("new_aan_pairs.train.tsv", "1.0\tp1\tp2\tfirst doc\n");
  EXPECT_NE(message_of([&] { make_task("retrieval", opts(1, 64, d.path.string())); }).find("record 1 has 4 tab-separated fields, expected 5"),
            std::string::npos);
}

TEST(Readers, CifarBinaryLoadsGreyAndRejectsTruncated) {
  TempDir d("cifar");
  // Two records: label 3 all pure red; label 9 with pixel 0 white and the rest black.
  std::string bytes;
  bytes += '\x03';
  bytes += std::string(1024, '\xff') + std::string(2048, '\0');
  bytes += '\x09';
  std::string img(3072, '\0');
  img[0] = img[1024] = img[2048] = '\xff';
  bytes += img;
  d.write("data_batch_1.bin", bytes);
  const auto task = make_task("image", opts(1, 0, d.path.string()));
  const Example a = task->example(0), b = task->example(1);
  EXPECT_EQ(a.label, 3);
  EXPECT_EQ(a.tokens[500], 76);  // round(0.299 * 255)
  EXPECT_EQ(b.label, 9);
  EXPECT_EQ(b.tokens[0], 255);
  EXPECT_EQ(b.tokens[1], 0);
  d.write("data_batch_1.bin", bytes.substr(0, 3073 + 100));
  EXPECT_NE(message_of([&] { make_task("image", opts(1, 0, d.path.string())); }).find("data_batch_1.bin: record 2 is truncated (100 of 3073 bytes)"),
            std::string::npos);
  bytes[3073] = 12;
  d.write("data_batch_1.bin", bytes);
  EXPECT_NE(message_of([&] { make_task("image", opts(1, 0, d.path.string())); }).find("record 2 has label 12"), std::string::npos);
  fs::remove(d.path / "data_batch_1.bin");
  EXPECT_NE(message_of([&] { make_task("image", opts(1, 0, d.path.string())); }).find("no CIFAR-10 batches"), std::string::npos);
}

// ---- the binary ----
TEST(TaskCli, ListSampleJsonPngAndBadInput) {
  auto e = exec("list tasks", false);
  ASSERT_EQ(e.code, 0);
  for (const char* t : {"copy", "listops", "text", "retrieval", "image", "pathfinder", "pathx"})
    EXPECT_NE(e.out.find(std::string("| ") + t + " |"), std::string::npos) << t;
  e = exec("task sample --task listops --count 5 --seq 200 --format jsonl", false);
  ASSERT_EQ(e.code, 0) << e.out;
  std::istringstream lines(e.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    const auto tokens = j.at("tokens").get<std::vector<int32_t>>();
    EXPECT_EQ(tokens.size(), 200u);
    // The readable form is the expression laid out by depth: the spelling, with line breaks and
    // indentation between its tokens.
    std::string flat;
    std::istringstream words(j.at("readable").get<std::string>());
    for (std::string w; words >> w;) flat += (flat.empty() ? "" : " ") + w;
    EXPECT_EQ(flat, listops_spelling(tokens));
    EXPECT_EQ(j.at("label").get<int32_t>(), listops_evaluate(tokens));
    ++n;
  }
  EXPECT_EQ(n, 5);
  const std::string png = test::temp_path("png");
  fs::remove_all(png);
  e = exec("task sample --task pathfinder --count 2 --png " + png, false);
  ASSERT_EQ(e.code, 0) << e.out;
  int pngs = 0;
  for (const auto& f : fs::directory_iterator(png)) {
    std::ifstream in(f.path(), std::ios::binary);
    char sig[8];
    in.read(sig, 8);
    EXPECT_EQ(std::string(sig, 8), std::string("\x89PNG\r\n\x1a\n", 8));
    ++pngs;
  }
  EXPECT_EQ(pngs, 2);
  fs::remove_all(png);
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"task sample --task nope", "unknown task 'nope'"},
           {"task sample --task image --seq 100", "--seq must be 1024"},
           {"task sample --task text --data-dir /nonexistent", "--data-dir /nonexistent: no such directory"},
           {"task sample --task copy --png /tmp/x", "not an image task"},
           {"task sample --task copy --format xml", "unknown format 'xml'"}}) {
    e = exec(args);
    EXPECT_EQ(e.code, 2) << args << ": " << e.out;
    EXPECT_NE(e.out.find(msg), std::string::npos) << e.out;
  }
  e = exec("task rate --task copy --reps 2");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("samples/s"), std::string::npos) << e.out;
}

// --split shows the examples `train` draws that split from; --format labels counts their classes
// and names the accuracy of answering the commonest one (what a model that learned nothing scores).
TEST(TaskCli, SplitAndLabelCounts) {
  TaskOptions o = opts(1, 64);
  o.split = Split::val;
  const auto val = make_task("text", o);
  auto e = exec("task sample --task text --seq 64 --split val --count 1 --format jsonl", false);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto j = nlohmann::json::parse(e.out);
  EXPECT_EQ(j.at("split"), "val");
  EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), val->example(0).tokens);
  EXPECT_NE(j.at("tokens").get<std::vector<int32_t>>(), make_task("text", opts(1, 64))->example(0).tokens);

  o.split = Split::test;
  const auto test = make_task("text", o);
  int64_t counts[2] = {0, 0};
  for (int64_t i = 5; i < 205; ++i) ++counts[test->example(i).label];
  e = exec("task sample --task text --seq 64 --split test --first 5 --count 200 --format labels", false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("examples 5 to 204"), std::string::npos) << e.out;
  for (int c : {0, 1})
    EXPECT_NE(e.out.find(fmt::format("| {} | {} | {:.2f}% |", c, counts[c], counts[c] / 2.0)), std::string::npos) << e.out;
  const int top = counts[1] > counts[0] ? 1 : 0;
  EXPECT_NE(e.out.find(fmt::format("answering label {} for every example scores {:.2f}%", top, counts[top] / 2.0)), std::string::npos)
      << e.out;

  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"task sample --task text --split dev", "unknown split 'dev'"},
           {"task rate --task text --split dev", "unknown split 'dev'"},
           {"task sample --task copy --format labels", "copy predicts next tokens"}}) {
    e = exec(args);
    EXPECT_EQ(e.code, 2) << args << ": " << e.out;
    EXPECT_NE(e.out.find(msg), std::string::npos) << e.out;
  }
}

}  // namespace
}  // namespace ab
