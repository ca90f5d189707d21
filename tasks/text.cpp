// text and retrieval: byte-level classification and document matching (LRA; tasks.md).
// Real data: the LRA TSV layouts from --data-dir, read whole and validated when the task is made
// (a missing, truncated or malformed file is an error naming the file and the record):
//   text       DIR/text.tsv: label <TAB> text, label 0 or 1, one record per line
//   retrieval  DIR/retrieval.tsv (or LRA's new_aan_pairs.train.tsv): label <TAB> id1 <TAB> id2
//              <TAB> text1 <TAB> text2, label 0 or 1 (LRA writes 0.0 / 1.0)
// A first line that is the column names is skipped. Documents longer than N are cut to N bytes.
// Synthetic data, same alphabet and lengths (N/2 to N bytes):
//   text       words, with 2m+1 sentiment words (m in 3..8, fewer when they would not fit)
//              scattered over the whole document; the label says whether the positive ones
//              outnumber the negative ones, by exactly one, so no local window decides it.
//   retrieval  two documents, each with a hidden phrase of four rare words inserted at a random
//              place; label 1 when the two phrases are the same.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/params.hpp"  // InvalidInput
#include "core/rng.hpp"
#include "tasks/task.hpp"
#include "core/files.hpp"

namespace ab {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string>& neutral_words() {
  static const std::vector<std::string> w = {
      "the", "film", "story", "a", "of", "and", "was", "it", "in", "actor", "scene", "plot", "to", "is", "that",
      "this", "with", "for", "as", "on", "director", "music", "camera", "end", "first", "time", "but", "an",
      "by", "script", "character", "from", "at", "one", "his", "her", "they", "about", "there", "when"};
  return w;
}
const std::vector<std::string> kPositive = {"good", "great", "superb", "lovely", "brilliant", "moving"};
const std::vector<std::string> kNegative = {"bad", "awful", "poor", "dull", "boring", "clumsy"};

std::vector<int32_t> to_tokens(const std::string& text, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < text.size() && static_cast<int64_t>(i) < n; ++i) t[i] = static_cast<unsigned char>(text[i]) + 1;
  return t;
}

// The bytes of words written each with its space.
int64_t bytes_of(const std::vector<std::string>& words) {
  int64_t b = 0;
  for (const auto& w : words) b += static_cast<int64_t>(w.size()) + 1;
  return b;
}

// Neutral words up to `length` bytes (each word and its space), with the given words inserted at
// random word positions. The inserted words always fit (the caller keeps them within `length`)
// and no word is cut off: a filler word that would pass `length` ends the document instead.
std::string document(Rng& rng, int64_t length, const std::vector<std::string>& inserts) {
  std::vector<std::string> words;
  int64_t bytes = bytes_of(inserts);
  const auto& pool = neutral_words();
  while (true) {
    const std::string& w = pool[rng.below(pool.size())];
    if (bytes + static_cast<int64_t>(w.size()) + 1 > length) break;
    words.push_back(w);
    bytes += static_cast<int64_t>(w.size()) + 1;
  }
  for (const auto& w : inserts) words.insert(words.begin() + static_cast<int64_t>(rng.below(words.size() + 1)), w);
  std::string s;
  for (const auto& w : words) s += w + ' ';
  return s;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> f;
  size_t at = 0;
  while (true) {
    const size_t tab = line.find('\t', at);
    f.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
    if (tab == std::string::npos) return f;
    at = tab + 1;
  }
}

// Records of a TSV file with `fields` columns: (label, fields...). Every record must end with a
// newline (a file cut short loses its last one) and have a label of 0 or 1.
std::vector<std::pair<int32_t, std::vector<std::string>>> read_tsv(const fs::path& path, size_t fields) {
  require_regular_file(path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("{}: cannot open (missing?)", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  std::vector<std::pair<int32_t, std::vector<std::string>>> out;
  size_t at = 0;
  int64_t record = 0;
  while (at < all.size()) {
    ++record;
    const size_t nl = all.find('\n', at);
    if (nl == std::string::npos)
      throw InvalidInput(fmt::format("{}: record {} is truncated (no end of line)", path.string(), record));
    std::string line = all.substr(at, nl - at);
    at = nl + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto f = split_tabs(line);
    if (record == 1 && !f.empty() && f[0] == "label") continue;  // the column names
    if (f.size() != fields)
      throw InvalidInput(fmt::format("{}: record {} has {} tab-separated fields, expected {}", path.string(), record, f.size(), fields));
    int32_t label;
    if (f[0] == "0" || f[0] == "0.0") label = 0;
    else if (f[0] == "1" || f[0] == "1.0") label = 1;
    else throw InvalidInput(fmt::format("{}: record {} has label '{}', expected 0 or 1", path.string(), record, f[0]));
    out.push_back({label, std::move(f)});
  }
  if (out.empty()) throw InvalidInput(fmt::format("{}: no records", path.string()));
  return out;
}

// The file of a split: DIR/STEM.SPLIT.tsv (SPLIT spelt train, `val_word`, test) when the
// directory has them, else DIR/WHOLE read whole and cut by split_range (`*whole_file` true).
fs::path split_file(const std::string& dir, const std::string& stem, const char* val_word, const std::string& whole,
                    Split split, bool* whole_file) {
  const std::string word = split == Split::val ? val_word : to_string(split);
  const fs::path own = fs::path(dir) / fmt::format("{}.{}.tsv", stem, word);
  *whole_file = !fs::exists(own);
  return *whole_file ? fs::path(dir) / whole : own;
}

// Keeps a split's records of a file that holds them all.
template <class T>
void keep_split(std::vector<T>& records, Split split, bool whole_file) {
  if (!whole_file) return;
  const auto [b, e] = split_range(records.size(), split);
  records = std::vector<T>(records.begin() + static_cast<int64_t>(b), records.begin() + static_cast<int64_t>(e));
}

class TextTask final : public Task {
 public:
  TextTask(const TaskOptions& o) : seed_(o.seed) {
    seq_ = o.seq > 0 ? o.seq : 4000;
    if (seq_ < 64) throw InvalidInput(fmt::format("text: --seq {} is too short; at least 64", seq_));
    if (!o.data_dir.empty()) {
      bool whole = false;
      path_ = split_file(o.data_dir, "text", "val", "text.tsv", o.split, &whole);
      for (auto& [label, f] : read_tsv(path_, 2)) records_.push_back({label, f[1]});
      keep_split(records_, o.split, whole);
      if (records_.empty()) throw InvalidInput(fmt::format("{}: no records for the {} split", path_.string(), to_string(o.split)));
    }
  }
  Example example(int64_t index) const override {
    Example e;
    if (!records_.empty()) {
      const auto& r = records_[static_cast<size_t>(index % static_cast<int64_t>(records_.size()))];
      e.label = r.first;
      e.tokens = to_tokens(r.second, seq_);
      return e;
    }
    Rng rng(seed_, example_stream(index));
    const int64_t length = seq_ / 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(seq_ - seq_ / 2 + 1)));
    const int m = 3 + static_cast<int>(rng.below(6));
    e.label = static_cast<int32_t>(rng.below(2));
    std::vector<std::string> inserts;
    for (int k = 0; k < m + (e.label == 1); ++k) inserts.push_back(kPositive[rng.below(kPositive.size())]);
    for (int k = 0; k < m + (e.label == 0); ++k) inserts.push_back(kNegative[rng.below(kNegative.size())]);
    // A short document holds fewer pairs: drop a positive and a negative word until they fit.
    while (bytes_of(inserts) > length) {
      inserts.erase(std::find_first_of(inserts.begin(), inserts.end(), kPositive.begin(), kPositive.end()));
      inserts.erase(std::find_first_of(inserts.begin(), inserts.end(), kNegative.begin(), kNegative.end()));
    }
    e.tokens = to_tokens(document(rng, length, inserts), seq_);
    return e;
  }
  std::string readable(const Example& e) const override { return text_of_tokens(e.tokens, 400); }
  std::string source() const override {
    return records_.empty() ? Task::source() : fmt::format("real: {} ({} records)", path_.string(), records_.size());
  }
  int64_t size() const override { return static_cast<int64_t>(records_.size()); }

 private:
  uint64_t seed_;
  fs::path path_;
  std::vector<std::pair<int32_t, std::string>> records_;
};

class RetrievalTask final : public Task {
 public:
  RetrievalTask(const TaskOptions& o) : seed_(o.seed) {
    seq_ = o.seq > 0 ? o.seq : 4000;
    if (seq_ < 64) throw InvalidInput(fmt::format("retrieval: --seq {} is too short; at least 64", seq_));
    if (!o.data_dir.empty()) {
      // LRA's files are new_aan_pairs.{train,eval,test}.tsv.
      bool whole = false;
      path_ = split_file(o.data_dir, "new_aan_pairs", "eval", "retrieval.tsv", o.split, &whole);
      for (auto& [label, f] : read_tsv(path_, 5)) records_.push_back({label, {f[3], f[4]}});
      keep_split(records_, o.split, whole);
      if (records_.empty()) throw InvalidInput(fmt::format("{}: no records for the {} split", path_.string(), to_string(o.split)));
    }
  }
  Example example(int64_t index) const override {
    Example e;
    if (!records_.empty()) {
      const auto& r = records_[static_cast<size_t>(index % static_cast<int64_t>(records_.size()))];
      e.label = r.first;
      e.tokens = to_tokens(r.second.first, seq_);
      e.tokens2 = to_tokens(r.second.second, seq_);
      return e;
    }
    Rng rng(seed_, example_stream(index));
    e.label = static_cast<int32_t>(rng.below(2));
    const std::string p1 = phrase(rng), p2 = e.label ? p1 : phrase(rng);
    for (auto [out, p] : {std::pair{&e.tokens, &p1}, std::pair{&e.tokens2, &p2}}) {
      const int64_t length = seq_ / 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(seq_ - seq_ / 2 + 1)));
      *out = to_tokens(document(rng, length, {*p}), seq_);
    }
    return e;
  }
  std::string readable(const Example& e) const override {
    return "doc 1: " + text_of_tokens(e.tokens, 200) + "\ndoc 2: " + text_of_tokens(e.tokens2, 200);
  }
  std::string source() const override {
    return records_.empty() ? Task::source() : fmt::format("real: {} ({} records)", path_.string(), records_.size());
  }
  int64_t size() const override { return static_cast<int64_t>(records_.size()); }

 private:
  // Four rare words of five random letters.
  static std::string phrase(Rng& rng) {
    std::string s;
    for (int w = 0; w < 4; ++w) {
      if (w) s += ' ';
      for (int c = 0; c < 5; ++c) s += static_cast<char>('a' + rng.below(26));
    }
    return s;
  }
  uint64_t seed_;
  fs::path path_;
  std::vector<std::pair<int32_t, std::pair<std::string, std::string>>> records_;
};

}  // namespace

SyntheticWords synthetic_words() { return {neutral_words(), kPositive, kNegative}; }

TaskInfo text_task_info() {
  TaskInfo t;
  t.name = "text";
  t.summary = "byte-level document classification (IMDb in LRA)";
  t.alphabet = "0 pad, byte b as b+1";
  t.default_seq = 4000;
  t.vocab = 257;
  t.classes = 2;
  t.model = ModelShape{4, 256, 4, 1024, 32, Pooling::cls};
  t.real_data = "DIR/text.{train,val,test}.tsv, or DIR/text.tsv cut 90/5/5 by record: label<TAB>text";
  t.make = [](const TaskOptions& o) { return std::make_unique<TextTask>(o); };
  return t;
}

TaskInfo retrieval_task_info() {
  TaskInfo t;
  t.name = "retrieval";
  t.summary = "byte-level document matching, two towers (AAN in LRA); N per document";
  t.alphabet = "0 pad, byte b as b+1";
  t.default_seq = 4000;
  t.vocab = 257;
  t.classes = 2;
  t.model = ModelShape{4, 128, 4, 512, 32, Pooling::cls};
  t.two_tower = true;
  t.real_data =
      "DIR/new_aan_pairs.{train,eval,test}.tsv (LRA's), or DIR/retrieval.tsv cut 90/5/5 by record: "
      "label<TAB>id1<TAB>id2<TAB>text1<TAB>text2";
  t.make = [](const TaskOptions& o) { return std::make_unique<RetrievalTask>(o); };
  return t;
}

}  // namespace ab
