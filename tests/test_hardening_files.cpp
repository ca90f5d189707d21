// Hardening, second round (issue 55): checkpoints, the training log, output paths, exports and the
// figures a run reports. Each test reproduces what a hostile user saw before the fix (a crash, a
// hang, lost work, raw library text, a silently ignored option, an inflated figure) and asserts
// the fixed behaviour: exit code, one line naming the thing, the user's files untouched.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "bench/results/result_reader.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {
namespace fs = std::filesystem;
using test::exec;

const std::string S = "--task copy --seq 16 --layers 1 --dmodel 16 --heads 2 --mlp 16 --batch 4 --attn linear ";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// A fresh directory for one test.
fs::path fresh_dir(const std::string& name) {
  const fs::path d = test::temp_path(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The command, stopped by SIGKILL after `seconds` (exit -1 then): a hang fails the test, never
// blocks the suite.
test::Exec exec_limited(const std::string& args, int seconds = 60) {
  return exec(args, true, fmt::format("-u ATTNBENCH_NONE timeout -s KILL {}", seconds));
}

// A tmpfs mounted for the test (root only: the tests that need a full or read-only file system
// are skipped elsewhere, saying why). Unmounted when it goes out of scope.
struct TmpFs {
  fs::path dir;
  bool mounted = false;
  TmpFs(const std::string& name, const std::string& options) : dir(fresh_dir(name)) {
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  void remount_read_only() { ASSERT_EQ(::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr), 0); }
  // Fills the file system to the last byte (the filler file is removed to free it again).
  void fill() {
    FILE* f = std::fopen((dir / "filler").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::vector<char> block(4096, 'x');
    while (std::fwrite(block.data(), 1, block.size(), f) == block.size()) {
    }
    std::fclose(f);
    for (size_t n = 512; n >= 1; n /= 2) {  // the last partial blocks
      FILE* g = std::fopen((dir / "filler").c_str(), "ab");
      while (g && std::fwrite(block.data(), 1, n, g) == n && std::fflush(g) == 0) {
      }
      if (g) std::fclose(g);
    }
  }
  void free_space() { fs::remove(dir / "filler"); }
  ~TmpFs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};
#define SKIP_UNLESS_MOUNTED(t) \
  if (!(t).mounted) GTEST_SKIP() << "cannot mount a tmpfs here (not root): the full and read-only disk cases need one"

// ---- the checkpoint's header ----

// A checkpoint file in parts: magic line, the length-and-checksum line, header, payload.
struct CheckpointFile {
  std::string magic, header, payload;
  static CheckpointFile read(const fs::path& p) {
    const std::string all = slurp(p);
    CheckpointFile c;
    const size_t nl1 = all.find('\n');
    const size_t nl2 = all.find('\n', nl1 + 1);
    c.magic = all.substr(0, nl1 + 1);
    const size_t len = std::stoull(all.substr(nl1 + 1, nl2 - nl1 - 1));
    c.header = all.substr(nl2 + 1, len);
    c.payload = all.substr(nl2 + 1 + len);
    return c;
  }
  // Written with the checksum the header and payload have now (an edit that re-checksums), or
  // with `crc` (an edit that does not).
  void write_to(const fs::path& p, std::optional<unsigned long> crc = std::nullopt) const {
    const std::string body = header + payload;
    const unsigned long sum = crc ? *crc : crc32_z(0L, reinterpret_cast<const Bytef*>(body.data()), body.size());
    ::ab::write(p, magic + std::to_string(header.size()) + " " + std::to_string(sum) + "\n" + body);
  }
  unsigned long crc() const {
    const std::string body = header + payload;
    return crc32_z(0L, reinterpret_cast<const Bytef*>(body.data()), body.size());
  }
};

// 1. An edited header is refused before anything is loaded, with one line naming the field:
// before the fix, step -50 crashed a text run (a negative index), step -2^62 hung with a signed
// overflow, and 1e308 accuracies and negative times were accepted.
TEST(HardeningFiles, CheckpointHeaderIsCoveredAndCheckedAgainstTheRun) {
  const fs::path dir = fresh_dir("ck_header");
  const std::string run = "train " + S + "--steps 20 --eval-every 10 --checkpoint " + (dir / "ck").string();
  ASSERT_EQ(exec(run).code, 0);
  const fs::path ck = dir / "ck" / "checkpoint.bin";
  const CheckpointFile good = CheckpointFile::read(ck);
  const std::string original = slurp(ck);
  struct Edit {
    const char* field;
    nlohmann::json value;
    const char* says;
  };
  const std::vector<Edit> edits = {
      {"step", -50, "'step' is -50"},
      {"step", int64_t{-4611686018427387904}, "'step'"},
      {"step", 21, "'step' is 21"},
      {"best_step", 30, "'best_step'"},
      {"best_val_accuracy", 1e308, "'best_val_accuracy'"},
      {"best_val_accuracy", -0.5, "'best_val_accuracy'"},
      {"elapsed_seconds", -1e300, "'elapsed_seconds'"},
      {"train_seconds", 1e300, "'train_seconds'"},
      {"train_seconds", "fast", "'train_seconds' has the wrong type"},
      {"best_val_loss", -1, "'best_val_loss'"},
      {"has_best", "yes", "'has_best' has the wrong type"},
      {"last_val", {{"loss", 1}, {"accuracy", 7}, {"token_accuracy", 0}, {"examples", 10}}, "'last_val.accuracy'"},
      {"tensors", "none", "'tensors' has the wrong type"},
  };
  for (const bool rechecksum : {false, true}) {
    for (const auto& edit : edits) {
      CheckpointFile c = good;
      auto h = nlohmann::json::parse(c.header);
      h[edit.field] = edit.value;
      c.header = h.dump();
      if (rechecksum) c.write_to(ck);
      else c.write_to(ck, good.crc());  // the checksum of the file before the edit
      const auto e = exec_limited(run + " --resume");
      EXPECT_EQ(e.code, 2) << edit.field << " = " << edit.value << ": " << e.out;
      EXPECT_NE(e.out.find(rechecksum ? edit.says : "checksum mismatch"), std::string::npos)
          << edit.field << " = " << edit.value << ": " << e.out;
      EXPECT_EQ(e.out.find("json.exception"), std::string::npos) << e.out;
      EXPECT_EQ(test::lines_of(e.out).size(), 1u) << e.out;
    }
  }
  // The untouched checkpoint still resumes (a finished run: evaluated, not trained again).
  write(ck, original);
  EXPECT_EQ(exec(run + " --resume").code, 0);
  fs::remove_all(dir);
}

// 1. A text run (real data read through an example order) resumed from step -50 crashed with
// SIGSEGV; it is refused like the copy run.
TEST(HardeningFiles, NegativeStepOnARealDataRunIsRefusedNotACrash) {
  const fs::path dir = fresh_dir("ck_text");
  const fs::path data = dir / "data";
  fs::create_directories(data);
  std::string tsv;
  for (int i = 0; i < 40; ++i) tsv += fmt::format("{}\tsome words of review {} good bad\n", i % 2, i);
  write(data / "text.train.tsv", tsv);
  write(data / "text.val.tsv", tsv);
  write(data / "text.test.tsv", tsv);
  const std::string run = "train --task text --data-dir " + data.string() +
                          " --seq 64 --layers 1 --dmodel 16 --heads 2 --mlp 16 --batch 4 --attn linear --steps 4 --checkpoint " +
                          (dir / "ck").string();
  auto e = exec(run);
  ASSERT_EQ(e.code, 0) << e.out;
  const fs::path ck = dir / "ck" / "checkpoint.bin";
  CheckpointFile c = CheckpointFile::read(ck);
  auto h = nlohmann::json::parse(c.header);
  h["step"] = -50;
  c.header = h.dump();
  c.write_to(ck);
  e = exec_limited(run + " --resume");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("'step' is -50"), std::string::npos) << e.out;
  fs::remove_all(dir);
}

// 2, 9. A FIFO or a directory where the checkpoint or the log should be: one line, exit 2, at
// once (a FIFO blocked forever; a directory ended "disk full?" with exit 0).
TEST(HardeningFiles, CheckpointAndLogMustBeRegularFiles) {
  const fs::path dir = fresh_dir("ck_fifo");
  const std::string ck = (dir / "ck").string();
  fs::create_directories(ck);
  ASSERT_EQ(mkfifo((dir / "ck" / "checkpoint.bin").c_str(), 0644), 0);
  auto e = exec_limited("train " + S + "--steps 5 --checkpoint " + ck + " --resume", 30);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("checkpoint.bin exists and is not a regular file"), std::string::npos) << e.out;
  e = exec_limited("train " + S + "--steps 5 --checkpoint " + ck, 30);
  EXPECT_EQ(e.code, 2) << e.out;

  const std::string ck2 = (dir / "ck2").string();
  fs::create_directories(dir / "ck2" / "checkpoint.bin");
  e = exec_limited("train " + S + "--steps 5 --checkpoint " + ck2, 30);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("not a regular file"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("disk full"), std::string::npos) << e.out;

  const fs::path log = dir / "curve.jsonl";
  ASSERT_EQ(mkfifo(log.c_str(), 0644), 0);
  const std::string ck3 = (dir / "ck3").string();
  ASSERT_EQ(exec("train " + S + "--steps 5 --checkpoint " + ck3).code, 0);
  for (const char* resume : {"", " --resume"}) {
    e = exec_limited("train " + S + "--steps 10 --checkpoint " + ck3 + " --log " + log.string() + resume, 30);
    EXPECT_EQ(e.code, 2) << resume << ": " << e.out;
    EXPECT_NE(e.out.find("--log"), std::string::npos) << e.out;
  }
  fs::remove_all(dir);
}

// 3. An empty --out is refused before any work, for every verb that writes one (sweep ran every
// point and then failed; train exited 0 and wrote nothing).
TEST(HardeningFiles, EmptyOutputIsRefusedBeforeAnyWork) {
  const fs::path dir = fresh_dir("empty_out");
  const std::string a = (dir / "a.json").string();
  ASSERT_EQ(exec("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + a).code, 0);
  for (const std::string& cmd :
       std::vector<std::string>{std::string("sweep --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out ''"),
        std::string("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out ''"),
        "train " + S + "--steps 3 --out ''", "merge " + a + " --out ''", "export " + a + " --out ''",
        "dump --attn flash --out ''", "train " + S + "--steps 3 --log ''", "train " + S + "--steps 3 --checkpoint ''"}) {
    const auto e = exec(cmd);
    EXPECT_EQ(e.code, 2) << cmd << ": " << e.out;
    EXPECT_NE(e.out.find("empty"), std::string::npos) << cmd << ": " << e.out;
    EXPECT_EQ(e.out.find("[1/1]"), std::string::npos) << "no point may run: " << e.out;
  }
  fs::remove_all(dir);
}

// 3, 8, 10. A read-only file system: --out, --log, --checkpoint and --train-dir are refused up
// front (the log once failed after training, with exit 0), naming the option, no library text.
TEST(HardeningFiles, ReadOnlyFileSystemIsRefusedUpFront) {
  TmpFs ro("ro_fs", "size=1m");
  SKIP_UNLESS_MOUNTED(ro);
  fs::create_directories(ro.dir / "sub");
  ro.remount_read_only();
  const std::string d = ro.dir.string();
  struct Case {
    std::string cmd, option;
  };
  const std::vector<Case> cases = {
      {"train " + S + "--steps 3 --log " + d + "/x.jsonl", "--log"},
      {"train " + S + "--steps 3 --out " + d + "/x.json", "--out"},
      {"train " + S + "--steps 3 --checkpoint " + d + "/ck", "--checkpoint"},
      {"train " + S + "--steps 3 --checkpoint " + d + "/sub", "--checkpoint"},
      {"sweep --verb train " + S + "--steps 3 --out " + d + "/x.json", "--out"},
      {"sweep --verb train " + S + "--steps 3 --out " + test::temp_path("rw.json") + " --train-dir " + d + "/t", "--train-dir"},
      {"sweep --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + d + "/x.json", "--out"},
  };
  for (const auto& c : cases) {
    const auto e = exec_limited(c.cmd, 60);
    EXPECT_EQ(e.code, 2) << c.cmd << ": " << e.out;
    EXPECT_NE(e.out.find(c.option), std::string::npos) << c.cmd << ": " << e.out;
    EXPECT_EQ(e.out.find("filesystem error"), std::string::npos) << e.out;
    EXPECT_EQ(e.out.find("step"), std::string::npos) << "nothing may train: " << e.out;
  }
  fs::remove(test::temp_path("rw.json"));
}

// 10. --checkpoint or --train-dir naming a file or a symbolic-link loop, and paths too long for
// the file system: exit 2 with one line (was "filesystem error: ..." and exit 1).
TEST(HardeningFiles, BadDirectoriesAndLongPathsAreInputErrors) {
  const fs::path dir = fresh_dir("bad_dirs");
  write(dir / "afile", "mine");
  fs::create_symlink(dir / "loop1", dir / "loop2");
  fs::create_symlink(dir / "loop2", dir / "loop1");
  const std::string long_name(300, 'a');
  std::string deep = dir.string();
  while (deep.size() < 5000) deep += "/" + std::string(200, 'b');
  const std::string rw = (dir / "ok.json").string();
  std::vector<std::string> cmds;
  for (const std::string& bad : std::vector<std::string>{(dir / "afile").string(), (dir / "loop1" / "x").string(), long_name, deep}) {
    cmds.push_back("train " + S + "--steps 3 --checkpoint " + bad);
    cmds.push_back("sweep --verb train " + S + "--steps 3 --out " + rw + " --train-dir " + bad);
  }
  for (const std::string& bad : std::vector<std::string>{long_name, deep, (dir / "loop1" / "x.json").string()}) {
    cmds.push_back("train " + S + "--steps 3 --out " + bad);
    cmds.push_back("train " + S + "--steps 3 --log " + bad);
    cmds.push_back("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + bad);
    cmds.push_back("sweep --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + bad);
    cmds.push_back("export " + bad);
    cmds.push_back("dump --attn flash --out " + bad);
    cmds.push_back("task sample --task text --data-dir " + bad);
  }
  for (const auto& cmd : cmds) {
    const auto e = exec_limited(cmd, 60);
    EXPECT_EQ(e.code, 2) << cmd.substr(0, 120) << ": " << e.out;
    EXPECT_EQ(e.out.rfind("attnbench: error: ", 0), 0u) << e.out;
    EXPECT_EQ(e.out.find("filesystem error"), std::string::npos) << e.out;
    EXPECT_EQ(test::lines_of(e.out).size(), 1u) << e.out;
  }
  EXPECT_EQ(slurp(dir / "afile"), "mine");
  EXPECT_FALSE(fs::exists(rw));
  fs::remove_all(dir);
}

// 4. A full disk at the end of a run: the result goes to stdout, the message says how to get it
// into --out (resume the finished checkpoint: it only evaluates), and the exit code is 1; a
// checkpoint that cannot be written fails the run with exit 1, not 0.
TEST(HardeningFiles, FullDiskKeepsTheResultAndSaysHowToRecover) {
  TmpFs full("full_fs", "size=256k");
  SKIP_UNLESS_MOUNTED(full);
  const fs::path dir = fresh_dir("full_ck");
  const std::string out = (full.dir / "r.json").string();
  const std::string run = "train " + S + "--steps 10 --checkpoint " + (dir / "ck").string() + " --out " + out;
  full.fill();
  auto e = exec_limited(run, 120);
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("--resume --checkpoint"), std::string::npos) << e.out;
  const auto json_at = e.out.find("{\n");
  ASSERT_NE(json_at, std::string::npos) << "the result on stdout: " << e.out;
  const auto doc = nlohmann::json::parse(e.out.substr(json_at, e.out.find("\n}\n", json_at) + 2 - json_at));
  ASSERT_EQ(doc.at("benchmarks").at(0).at("run_name").get<std::string>().rfind("attn:linear/", 0), 0u);
  const double accuracy = doc["benchmarks"][0]["token_accuracy"].get<double>();
  EXPECT_FALSE(fs::exists(out));
  // Space again: resuming the finished run writes the same result without training.
  full.free_space();
  e = exec_limited(run + " --resume", 120);
  ASSERT_EQ(e.code, 0) << e.out;
  const ResultFile rf = read_result_file(out);
  ASSERT_EQ(rf.points.size(), 1u);
  EXPECT_EQ(rf.points[0].train->token_accuracy, accuracy);

  // The checkpoint on the full disk: FAILED, exit 1, the reason named.
  fs::remove(out);
  full.fill();
  e = exec_limited("train " + S + "--steps 10 --checkpoint " + (full.dir / "ck").string(), 120);
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("No space left on device"), std::string::npos) << e.out;
  fs::remove_all(dir);
}

// 5. --force never lets an output replace one of the command's inputs (export replaced the
// result file with its own CSV), through links and hard links too.
TEST(HardeningFiles, ForceNeverOverwritesAnInput) {
  const fs::path dir = fresh_dir("force_input");
  const fs::path a = dir / "a.json";
  ASSERT_EQ(exec("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + a.string()).code, 0);
  const std::string before = slurp(a);
  fs::create_symlink(a, dir / "link.json");
  fs::create_hard_link(a, dir / "hard.json");
  for (const std::string& out : std::vector<std::string>{a.string(), (dir / "link.json").string(), (dir / "hard.json").string(),
                                 (dir / "." / "a.json").string()}) {
    for (const std::string& verb : std::vector<std::string>{"export " + a.string() + " --format csv", "merge " + a.string()}) {
      const auto e = exec(verb + " --out " + out + " --force");
      EXPECT_EQ(e.code, 2) << verb << " --out " << out << ": " << e.out;
      EXPECT_NE(e.out.find("is also an input"), std::string::npos) << e.out;
    }
  }
  EXPECT_EQ(slurp(a), before);
  fs::remove_all(dir);
}

// 6. A checkpoint write killed mid-way leaves checkpoint.bin.tmp.PID; the next run in that
// directory removes its own stale temporaries (of processes that are gone), says so, and leaves
// every other file alone.
TEST(HardeningFiles, StaleCheckpointTemporariesAreRemoved) {
  const fs::path dir = fresh_dir("stale_tmp");
  const fs::path ck = dir / "ck";
  fs::create_directories(ck);
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  const fs::path stale = ck / fmt::format("checkpoint.bin.tmp.{}", gone);
  const fs::path live = ck / fmt::format("checkpoint.bin.tmp.{}", getpid());  // a writer still running
  write(stale, std::string(1 << 20, 'x'));
  write(live, "busy");
  write(ck / "checkpoint.bin.tmp.notapid", "mine");
  write(ck / "notes.txt", "mine");
  const auto e = exec("train " + S + "--steps 3 --checkpoint " + ck.string());
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_NE(e.out.find("removed " + stale.string()), std::string::npos) << e.out;
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(slurp(ck / "checkpoint.bin.tmp.notapid"), "mine");
  EXPECT_EQ(slurp(ck / "notes.txt"), "mine");
  fs::remove_all(dir);
}

// 8. A run whose status is not OK exits non-zero (a diverging run ended FAILED with exit 0).
TEST(HardeningFiles, ARunThatIsNotOkExitsNonZero) {
  const fs::path dir = fresh_dir("not_ok");
  const std::string out = (dir / "r.json").string();
  const auto e = exec("train " + S + "--steps 30 --lr 1e30 --out " + out);
  EXPECT_EQ(e.code, 1) << e.out;
  const ResultFile rf = read_result_file(out);
  ASSERT_EQ(rf.points.size(), 1u);
  EXPECT_EQ(rf.points[0].status, Status::FAILED);
  EXPECT_NE(rf.points[0].message.find("not finite"), std::string::npos) << rf.points[0].message;
  fs::remove_all(dir);
}

// 10. A resumed sweep validates the whole file before changing it: a wrongly typed context field
// left a 'resumed_by' written into the file and a raw JSON error.
TEST(HardeningFiles, SweepResumeValidatesTheContextBeforeWriting) {
  const fs::path dir = fresh_dir("resume_ctx");
  const std::string f = (dir / "s.json").string();
  const std::string sweep = "sweep --attn flash --seq 16,32 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + f;
  ASSERT_EQ(exec(sweep + " --filter N:16/").code, 0);
  auto doc = nlohmann::json::parse(slurp(f));
  for (const auto& [field, value] : std::vector<std::pair<const char*, nlohmann::json>>{
           {"warnings", 5}, {"warnings", {1, 2}}, {"resumed_by", "x"}, {"retried", {1}}, {"num_cpus", "two"},
           {"load_avg", {"high"}}, {"date", 3}, {"shard", false}}) {
    auto d = doc;
    d["context"][field] = value;
    write(f, d.dump(2));
    const std::string before = slurp(f);
    const auto e = exec(sweep + " --resume");
    EXPECT_EQ(e.code, 2) << field << ": " << e.out;
    EXPECT_NE(e.out.find(std::string("context '") + field + "'"), std::string::npos) << e.out;
    EXPECT_EQ(e.out.find("json.exception"), std::string::npos) << e.out;
    EXPECT_EQ(slurp(f), before) << field << ": the file was modified";
  }
  // export reads a file without a context as table and compare do.
  doc.erase("context");
  write(f, doc.dump(2));
  EXPECT_EQ(exec("export " + f).code, 0);
  EXPECT_EQ(exec("table " + f).code, 0);
  fs::remove_all(dir);
}

// 10. Shapes no machine holds are refused up front, as `run` refuses them (task sample and dump
// allocated until std::bad_alloc).
TEST(HardeningFiles, ImpossibleTaskAndDumpShapesAreRefused) {
  const fs::path dir = fresh_dir("shapes");
  for (const std::string& cmd :
       std::vector<std::string>{std::string("task sample --task text --seq 2147483648"), std::string("task rate --task text --seq 10000 --batch 100000000"),
        "dump --attn flash --batch 2147483648 --out " + (dir / "d").string()}) {
    const auto e = exec_limited(cmd, 30);
    EXPECT_EQ(e.code, 2) << cmd << ": " << e.out;
    EXPECT_EQ(e.out.find("bad_alloc"), std::string::npos) << e.out;
  }
  EXPECT_FALSE(fs::exists(dir / "d"));
  fs::remove_all(dir);
}

// 11. Options that would be ignored are refused: train's preset-only options without a preset,
// an empty --preset, and --data-dir where no task reads data (even a missing one or a FIFO).
TEST(HardeningFiles, IgnoredOptionsAreRefused) {
  const fs::path dir = fresh_dir("ignored");
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0644), 0);
  for (const std::string& cmd :
       std::vector<std::string>{"train " + S + "--steps 3 --shard 0/1", "train " + S + "--steps 3 --shard 1/1", "train " + S + "--steps 3 --train-dir " + dir.string(),
        "train " + S + "--steps 3 --preset ''", "train " + S + "--steps 3 --data-dir /nonexistent",
        "train " + S + "--steps 3 --data-dir " + (dir / "fifo").string(), "train " + S + "--steps 3 --data-dir " + dir.string(),
        "run --level model --mode train " + S + "--data-dir " + dir.string(),
        std::string("run --attn flash --seq 16 --data-dir /tmp"), std::string("task sample --task copy --data-dir /tmp")}) {
    const auto e = exec_limited(cmd, 30);
    EXPECT_EQ(e.code, 2) << cmd << ": " << e.out;
    EXPECT_EQ(test::lines_of(e.out).size(), 1u) << e.out;
  }
  fs::remove_all(dir);
}

// 12. SQL export: every string sqlite3 can hold loads (quotes, newlines, non-ASCII, a double
// quote in a field name); a NUL byte, which SQL text cannot hold, is refused naming the field.
TEST(HardeningFiles, SqlExportLoadsIntoSqlite) {
  if (std::system("command -v sqlite3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "sqlite3 is not installed (scripts/setup.sh --tests)";
  const fs::path dir = fresh_dir("sql");
  const fs::path a = dir / "a.json";
  ASSERT_EQ(exec("run --attn flash,linear --seq 16 --heads 1 --dhead 4 --reps 2 --min-time 0 --out " + a.string()).code, 0);
  auto doc = nlohmann::json::parse(slurp(a));
  const std::string hostile = "it's \"quoted\"\nline two; DROP TABLE results; -- \xc3\xbc\xf0\x9f\x99\x82";
  for (auto& b : doc["benchmarks"]) {
    b["label"] = hostile;
    b["odd\"name"] = "x";
  }
  write(dir / "h.json", doc.dump(2));
  auto e = exec("export " + (dir / "h.json").string() + " --format sql --out " + (dir / "h.sql").string());
  ASSERT_EQ(e.code, 0) << e.out;
  const std::string db = (dir / "h.db").string();
  ASSERT_EQ(std::system(("sqlite3 " + db + " < " + (dir / "h.sql").string()).c_str()), 0);
  FILE* p = popen(("sqlite3 " + db + " \"SELECT count(*), count(DISTINCT label), max(label) FROM results\"").c_str(), "r");
  std::string got;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) got.append(buf, n);
  pclose(p);
  EXPECT_EQ(got, fmt::format("{}|1|{}\n", doc["benchmarks"].size(), hostile));

  doc["benchmarks"][0]["label"] = std::string("a\0b", 3);
  write(dir / "nul.json", doc.dump(2));
  e = exec("export " + (dir / "nul.json").string() + " --format sql", true);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("NUL byte"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("'label'"), std::string::npos) << e.out;
  fs::remove_all(dir);
}

// 13. The model level's per-layer breakdown covers the timed steps only: it sums to at most the
// measured step time (the timers sit inside the step) and to most of it. The untimed rounds that
// size a repetition to --min-time were counted in the timers but not in the divisor, inflating
// every layer by (reps + 1) / reps.
TEST(HardeningFiles, LayerBreakdownSumsToTheStepTime) {
  const auto e = exec("run --level model --mode train --task copy --seq 64 --layers 2 --dmodel 32 --heads 2 --mlp 64 --batch 4 "
                      "--attn flash --reps 2 --min-time 0.05 --out -",
                      false);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto doc = nlohmann::json::parse(e.out);
  double step_ms = 0, layers_ms = -1, iterations = 0;
  for (const auto& b : doc["benchmarks"]) {
    if (b["run_type"] != "iteration") continue;
    step_ms += b["real_time"].get<double>() * b["iterations"].get<double>();
    iterations += b["iterations"].get<double>();
    double sum = 0;
    for (const auto& [k, v] : b.items())
      if (k.size() > 3 && k.substr(k.size() - 3) == "_ms") sum += v.get<double>();
    layers_ms = sum;  // the same breakdown on every repetition: a mean over all timed steps
  }
  step_ms /= iterations;
  ASSERT_GT(layers_ms, 0);
  EXPECT_LE(layers_ms, step_ms * 1.01) << "the breakdown exceeds the step it is part of";
  EXPECT_GE(layers_ms, step_ms * 0.5) << "the breakdown leaves most of the step out";
}

// --retry-failed really runs a failed training point again: made to fail on purpose, it is
// FAILED; retried with the fault gone it is OK, the earlier status kept in 'retried'; retried with
// the fault still there it is FAILED again.
TEST(HardeningFiles, RetryFailedReRunsAFailedTrainingPoint) {
  const fs::path dir = fresh_dir("retry_train");
  const std::string out = (dir / "t.json").string();
  const std::string sweep = "sweep --verb train " + S + "--steps 5 --seed 1,2 --out " + out;
  const std::string fault = "ATTNBENCH_FAULT=exit:/seed:2";
  auto e = exec(sweep, true, fault);
  ASSERT_EQ(e.code, 0) << e.out;
  auto status_of = [&](int seed) {
    for (const auto& r : read_result_file(out).points)
      if (r.id.train.seed == seed) return r.status;
    return Status::SKIPPED;
  };
  ASSERT_EQ(status_of(1), Status::OK);
  ASSERT_EQ(status_of(2), Status::FAILED);
  e = exec(sweep + " --resume --retry-failed", true, fault);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(status_of(2), Status::FAILED);
  e = exec(sweep + " --resume --retry-failed");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(status_of(1), Status::OK);
  EXPECT_EQ(status_of(2), Status::OK);
  const auto ctx = read_result_file(out).context;
  ASSERT_TRUE(ctx.contains("retried"));
  EXPECT_EQ(ctx["retried"].size(), 2u);
  for (const auto& r : ctx["retried"]) EXPECT_EQ(r["status"], "FAILED");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ab
