#include "model/trainer.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>

#include "core/dropout.hpp"
#include "core/files.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stop_signals.hpp"  // continued_count: a paused step is not timed

namespace ab {

// ---- schedules ----
double Schedule::at(int64_t s) const {
  const double S = static_cast<double>(s), W = static_cast<double>(std::max<int64_t>(warmup, 0));
  switch (kind) {
    case constant: return lr;
    case linear_warmup_rsqrt: {
      const double w = std::max(W, 1.0);
      return lr * std::min(1.0, S / w) / std::sqrt(std::max(S, w));
    }
    case cosine: {
      if (s <= warmup) return lr * S / std::max(W, 1.0);
      const double span = std::max(1.0, static_cast<double>(horizon > 0 ? horizon : steps) - W);
      return lr * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, (S - W) / span)));
    }
    case onecycle: {
      // PyTorch's OneCycleLR (anneal_strategy='linear', div_factor 25, final_div_factor 1e4)
      // at its step_num = s - 1.
      const double initial = lr / 25.0, minimum = initial / 1e4;
      const double total = static_cast<double>(steps), k = S - 1;
      const double end1 = std::max(1.0, W) - 1, end2 = total - 1;
      if (k <= end1) return end1 > 0 ? initial + (lr - initial) * k / end1 : lr;
      return end2 > end1 ? lr + (minimum - lr) * (k - end1) / (end2 - end1) : minimum;
    }
    case step: return s <= decay_at ? lr : lr * decay_factor;
  }
  return lr;
}

Schedule Schedule::parse(const std::string& text) {
  Schedule s;
  if (text == "constant") s.kind = constant;
  else if (text == "linear-warmup-rsqrt") s.kind = linear_warmup_rsqrt;
  else if (text == "cosine") s.kind = cosine;
  else if (text.rfind("cosine:", 0) == 0) {
    s.kind = cosine;
    char* end = nullptr;
    s.horizon = std::strtoll(text.c_str() + 7, &end, 10);
    if (text.size() == 7 || *end != '\0' || s.horizon < 1)
      throw InvalidInput(fmt::format("--schedule '{}': cosine:H takes H, the steps the cosine spans (at least the warm-up; "
                                     "the run may stop before, as with early stopping)",
                                     text));
  }
  else if (text == "onecycle") s.kind = onecycle;
  else if (text.rfind("step:", 0) == 0) {
    s.kind = step;
    const auto colon = text.find(':', 5);
    char* end = nullptr;
    const std::string at = text.substr(5, colon == std::string::npos ? std::string::npos : colon - 5);
    s.decay_at = std::strtoll(at.c_str(), &end, 10);
    const bool at_ok = !at.empty() && *end == '\0' && s.decay_at > 0;
    s.decay_factor = colon == std::string::npos ? 0.1 : std::strtod(text.c_str() + colon + 1, &end);
    if (!at_ok || (colon != std::string::npos && *end != '\0') || !(s.decay_factor > 0 && s.decay_factor <= 1))
      throw InvalidInput(fmt::format("--schedule '{}': step takes step:S or step:S:F (S a step, 0 < F <= 1)", text));
  } else {
    throw unknown_name("schedule", text, {"constant", "linear-warmup-rsqrt", "cosine", "cosine:H", "onecycle", "step:S[:F]"},
                       "schedules");
  }
  return s;
}

Schedule Schedule::for_run(double peak, int64_t warmup_steps, int64_t run_steps) const {
  Schedule s = *this;
  s.lr = peak;
  s.warmup = warmup_steps;
  s.steps = run_steps;
  if (s.kind == cosine && s.horizon > 0 && s.horizon < warmup_steps)
    throw InvalidInput(fmt::format("--schedule {}: cosine:H takes H, the steps the cosine spans (at least the warm-up, "
                                   "{} steps)",
                                   name(), warmup_steps));
  if ((s.kind == linear_warmup_rsqrt || s.kind == onecycle) && warmup_steps < 1)
    throw InvalidInput(fmt::format("--schedule {} needs --warmup-steps of at least 1", name()));
  return s;
}

std::string Schedule::name() const {
  switch (kind) {
    case constant: return "constant";
    case linear_warmup_rsqrt: return "linear-warmup-rsqrt";
    case cosine: return horizon > 0 ? fmt::format("cosine:{}", horizon) : "cosine";
    case onecycle: return "onecycle";
    case step: return fmt::format("step:{}:{:g}", decay_at, decay_factor);
  }
  return "constant";
}

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

nlohmann::json eval_json(const EvalResult& e) {
  return {{"loss", e.loss}, {"accuracy", e.accuracy}, {"token_accuracy", e.token_accuracy}, {"examples", e.examples}};
}

// Copies between the trained tensors and one flat buffer.
void copy_out(const std::vector<TransformerModel::StateTensor>& ts, float* flat) {
  for (const auto& t : ts) flat = std::copy_n(t.data, t.count, flat);
}
void copy_in(const std::vector<TransformerModel::StateTensor>& ts, const float* flat) {
  for (const auto& t : ts) {
    std::copy_n(flat, t.count, t.data);
    flat += t.count;
  }
}
int64_t floats_of(const std::vector<TransformerModel::StateTensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.count;
  return n;
}
constexpr char kMagic[] = "ATTNBENCH-CHECKPOINT\n";
}  // namespace

// ---- the run's state ----
struct Trainer::State {
  int64_t step = 0;  // steps done
  double best_val = -1;
  // Breaks a tie of validation accuracy (a copy run whose exact-copy rate stays 0 for a while):
  // the lower loss is the better model.
  double best_val_loss = std::numeric_limits<double>::infinity();
  int64_t best_step = 0;
  double elapsed = 0, train_seconds = 0;  // totals over every process of the run
  // Steps during which the process was stopped and continued (SIGSTOP, Ctrl-Z): their wall time
  // holds the pause, so train_seconds leaves them out and the step time is the others' mean.
  int64_t paused_steps = 0;
  EvalResult last_val;
  Buffer<float> best;  // the trained tensors at the best validation accuracy
  bool has_best = false;
  bool stopped_early = false;  // stop_at was reached: the run is finished at `step`
  std::string converted_from;  // the checkpoint's run in another dtype (TrainConfig::convert_dtype)
};

Trainer::Trainer(TrainConfig c) : config_(std::move(c)) {
  if (config_.steps < 1) throw InvalidInput("--steps must be at least 1");
  if (config_.eval_every < 0 || config_.checkpoint_every < 0) throw InvalidInput("--eval-every and --checkpoint-every must not be negative");
  if (config_.eval_examples < 1 || config_.test_examples < 1) throw InvalidInput("--eval-examples and --test-examples must be at least 1");
  if (config_.log_every < 1) throw InvalidInput("--log-every must be at least 1");
  config_.model.optimizer.lr = static_cast<float>(config_.schedule.at(1));
  model_ = std::make_unique<TransformerModel>(config_.model, ModelMode::train);
  // The three splits (real data is read here, once, and checked).
  for (auto [split, task] : {std::pair{Split::train, &train_}, std::pair{Split::val, &val_}, std::pair{Split::test, &test_}}) {
    TaskOptions o = config_.data;
    o.split = split;
    *task = make_task(config_.task, o);
  }
}

Trainer::~Trainer() = default;

size_t Trainer::working_bytes() const {
  // The best-validation copy holds the trained tensors (the parameters and the mechanisms' own;
  // their sizes are known before setup).
  return model_->working_bytes() + static_cast<size_t>(floats_of(model_->trained_tensors())) * sizeof(float);
}

// Real data cycles through the split in a fresh permutation per epoch, seeded by (seed, epoch);
// a generator's examples are fresh every step.
Batch Trainer::training_batch(int64_t step) {
  const int64_t B = config_.model.batch, first = (step - 1) * B;
  const int64_t size = train_->size();
  if (size == 0) return train_->batch(first, B);
  std::vector<int64_t> indices(static_cast<size_t>(B));
  for (int64_t j = 0; j < B; ++j) {
    const int64_t i = first + j, epoch = i / size;
    if (epoch != order_epoch_) {
      order_.resize(static_cast<size_t>(size));
      std::iota(order_.begin(), order_.end(), 0);
      Rng rng(config_.seed ^ mix64(static_cast<uint64_t>(epoch) + 1), 0x5348554646ull);  // "SHUFF"
      for (int64_t k = size - 1; k > 0; --k)
        std::swap(order_[static_cast<size_t>(k)], order_[rng.below(static_cast<uint64_t>(k + 1))]);
      order_epoch_ = epoch;
    }
    indices[static_cast<size_t>(j)] = order_[static_cast<size_t>(i % size)];
  }
  return train_->batch_of(indices);
}

// The first `count` examples of a split (all of a real split when it has fewer), in batches of
// the model's size; the last batch padded with the first examples, which do not count.
EvalResult Trainer::evaluate(TransformerModel& model, Task& task, int64_t count) {
  const int64_t B = config_.model.batch;
  const int64_t n = evaluated_examples(task, count);
  TransformerModel::Evaluation total;
  for (int64_t first = 0; first < n; first += B) {
    const int64_t valid = std::min(B, n - first);
    std::vector<int64_t> idx(static_cast<size_t>(B));
    for (int64_t j = 0; j < B; ++j) idx[static_cast<size_t>(j)] = j < valid ? first + j : j - valid;
    const auto e = model.evaluate(task.batch_of(idx), valid);
    total.loss_sum += e.loss_sum;
    total.predictions += e.predictions;
    total.correct += e.correct;
    total.sequences += e.sequences;
    total.exact += e.exact;
    total.query_share_sum += e.query_share_sum;
    total.query_examples += e.query_examples;
  }
  EvalResult r;
  r.examples = n;
  r.loss = total.predictions ? total.loss_sum / static_cast<double>(total.predictions) : 0;
  r.token_accuracy = total.predictions ? static_cast<double>(total.correct) / static_cast<double>(total.predictions) : 0;
  if (find_task(config_.task).accuracy == AccuracyKind::per_query)
    r.accuracy = total.query_examples ? total.query_share_sum / static_cast<double>(total.query_examples) : 0;
  else
    r.accuracy = total.sequences ? static_cast<double>(total.exact) / static_cast<double>(total.sequences) : 0;
  return r;
}

// The model's trained tensors in a model of another length, tested there. What does not carry
// over is said, not guessed: learned absolute positions exist for the trained length only, and
// a mechanism whose learned tensors are sized by N (Linformer's projections, Synthesizer's
// logits) has none for another length.
std::vector<LengthResult> Trainer::test_at_lengths() {
  std::vector<LengthResult> out;
  const auto trained = model_->trained_tensors();
  for (const int64_t n : config_.test_seqs) {
    LengthResult lr;
    lr.seq = n;
    try {
      TaskOptions o = config_.data;
      o.seq = n;
      o.split = Split::test;
      o.train_examples = 0;
      auto task = make_task(config_.task, o);
      ModelConfig mc = config_.model;
      mc.seq = n;
      mc.loss_positions = model_config_for_task(find_task(config_.task), o).loss_positions;
      TransformerModel m(mc, ModelMode::fwd);
      m.setup(config_.seed);
      const auto there = m.trained_tensors();
      std::string mismatch;
      for (size_t i = 0; i < there.size() && mismatch.empty(); ++i) {
        const auto it = std::find_if(trained.begin(), trained.end(), [&](const auto& t) { return t.name == there[i].name; });
        if (it == trained.end()) mismatch = fmt::format("{} has no trained values", there[i].name);
        else if (it->count != there[i].count)
          mismatch = it->name == "positions" ? fmt::format("learned positions exist for N = {} only", config_.model.seq)
                                             : fmt::format("{} is sized by N ({} values at N = {}, {} here)", it->name,
                                                           it->count, config_.model.seq, there[i].count);
        else std::copy_n(it->data, it->count, there[i].data);
      }
      if (!mismatch.empty()) {
        lr.why_not = mismatch;
      } else {
        lr.accuracy = evaluate(m, *task, config_.test_examples).accuracy;
      }
    } catch (const InvalidInput& e) {
      lr.why_not = e.what();  // the mechanism or the task refuses the length
    }
    out.push_back(std::move(lr));
  }
  return out;
}


std::string checkpoint_path(const std::string& dir) { return (std::filesystem::path(dir) / "checkpoint.bin").string(); }

// The file: the magic line; the header's length in decimal, a space and the CRC-32 of the header
// and the payload together, and a newline; the JSON header (identity, step, bookkeeping, the
// tensors' names and sizes); then the payload: every state tensor, then the best-validation
// copy. The checksum covers the header too, and every header field is also checked against the
// run on loading, so an edited step or time is refused, not trusted. Written to a temporary
// file, synced and renamed over the last checkpoint, which stays whole until the new one is
// complete; a temporary left by a run killed in the middle of a write is removed by the next.
void Trainer::save_checkpoint(const State& st, TrainOutcome& out) {
  namespace fs = std::filesystem;
  const double t0 = now();
  const auto state = model_->state();
  nlohmann::json tensors = nlohmann::json::array();
  int64_t floats = 0;
  for (const auto& t : state) {
    tensors.push_back({{"name", t.name}, {"count", t.count}});
    floats += t.count;
  }
  const int64_t best_floats = st.has_best ? static_cast<int64_t>(st.best.size()) : 0;
  nlohmann::json header = {{"version", kCheckpointVersion},
                           {"identity", config_.identity},
                           {"dtype", to_string(config_.model.dtype)},  // the steps' products; the state is float32 in every dtype
                           {"step", st.step},
                           {"best_val_accuracy", st.best_val},
                           {"best_step", st.best_step},
                           {"has_best", st.has_best},
                           {"stopped_early", st.stopped_early},
                           {"elapsed_seconds", st.elapsed},
                           {"train_seconds", st.train_seconds},
                           {"paused_steps", st.paused_steps},
                           {"last_val", eval_json(st.last_val)},
                           {"tensors", tensors},
                           {"best_floats", best_floats},
                           {"payload_bytes", (floats + best_floats) * static_cast<int64_t>(sizeof(float))},
                           {"rng", "none stored: data, permutations, dropout masks and redraws derive from (seed, step)"}};
  // JSON has no infinity (nlohmann writes null): before the first evaluation the field is left out.
  if (std::isfinite(st.best_val_loss)) header["best_val_loss"] = st.best_val_loss;
  const std::string head = header.dump();
  uLong crc = crc32_z(0L, reinterpret_cast<const Bytef*>(head.data()), head.size());
  for (const auto& t : state)
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(t.data), static_cast<size_t>(t.count) * sizeof(float));
  if (best_floats)
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(st.best.data()), static_cast<size_t>(best_floats) * sizeof(float));
  const std::string path = checkpoint_path(config_.checkpoint_dir);
  remove_stale_temporaries(path);
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(getpid()));
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error(fmt::format("cannot write the checkpoint {}: {}", tmp, std::strerror(errno)));
  bool ok = std::fputs(kMagic, f) >= 0 && std::fprintf(f, "%zu %lu\n", head.size(), static_cast<unsigned long>(crc)) > 0 &&
            std::fwrite(head.data(), 1, head.size(), f) == head.size();
  for (const auto& t : state) ok = ok && std::fwrite(t.data, sizeof(float), static_cast<size_t>(t.count), f) == static_cast<size_t>(t.count);
  if (best_floats) ok = ok && std::fwrite(st.best.data(), sizeof(float), static_cast<size_t>(best_floats), f) == static_cast<size_t>(best_floats);
  ok = std::fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  const int write_errno = errno;
  const long bytes = std::ftell(f);
  ok = std::fclose(f) == 0 && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    std::error_code rm;
    fs::remove(tmp, rm);
    throw std::runtime_error(fmt::format("writing the checkpoint {} failed ({}); the previous one is intact", path,
                                         ec ? ec.message() : std::strerror(write_errno)));
  }
  out.checkpoints += 1;
  out.checkpoint_bytes = bytes;
  out.checkpoint_seconds += now() - t0;
}

void check_checkpoint_directory(const std::string& dir) {
  make_directory("--checkpoint", dir);
  const std::string path = checkpoint_path(dir);
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(std::filesystem::status(path, ec)))
    throw InvalidInput(fmt::format("{} exists and is not a regular file (a directory, FIFO or device): not a checkpoint; "
                                   "move it away",
                                   path));
}

void Trainer::load_checkpoint(State& st) {
  const std::string path = checkpoint_path(config_.checkpoint_dir);
  if (!std::filesystem::exists(path)) throw InvalidInput(fmt::format("--resume: no checkpoint {} to resume from", path));
  require_regular_file(path);  // a FIFO would block the read forever
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("--resume: cannot read the checkpoint {}", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  auto corrupt = [&](const std::string& why) {
    return InvalidInput(fmt::format("{} is not a usable checkpoint ({}); nothing was loaded", path, why));
  };
  const size_t magic = sizeof(kMagic) - 1;
  if (all.compare(0, magic, kMagic) != 0) throw corrupt("no checkpoint header");
  const size_t nl = all.find('\n', magic);
  if (nl == std::string::npos) throw corrupt("truncated header");
  // Line 2: the header's length, and (version 2 on) the checksum of the header and the payload.
  const std::string line = all.substr(magic, nl - magic);
  if (line.empty() || line.find_first_not_of("0123456789 ") != std::string::npos) throw corrupt("truncated header");
  char* end = nullptr;
  const unsigned long long head_len = std::strtoull(line.c_str(), &end, 10);
  const bool has_file_crc = *end == ' ';
  const unsigned long long file_crc = has_file_crc ? std::strtoull(end + 1, &end, 10) : 0;
  if (*end != '\0' || head_len > all.size() - nl - 1) throw corrupt("truncated header");
  const size_t at = nl + 1 + head_len;
  // Version 2: the checksum covers everything after its line, so damage anywhere, the header's
  // fields included, is found before any of it is interpreted.
  if (has_file_crc && crc32_z(0L, reinterpret_cast<const Bytef*>(all.data() + nl + 1), all.size() - nl - 1) != file_crc)
    throw corrupt("checksum mismatch");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(all.substr(nl + 1, head_len));
  } catch (const nlohmann::json::exception&) {
    throw corrupt("its header is not JSON");
  }
  if (!h.is_object()) throw corrupt("its header is not a JSON object");
  // A header field of the expected type, or the file is refused naming the field.
  auto field = [&](const char* key, nlohmann::json::value_t type) -> const nlohmann::json& {
    if (!h.contains(key)) throw corrupt(fmt::format("its header has no '{}'", key));
    const auto& v = h.at(key);
    const bool ok = type == nlohmann::json::value_t::number_float ? v.is_number()
                    : type == nlohmann::json::value_t::number_integer ? v.is_number_integer()
                                                                      : v.type() == type;
    if (!ok) throw corrupt(fmt::format("its header's '{}' has the wrong type", key));
    return v;
  };
  using vt = nlohmann::json::value_t;
  const int64_t version = field("version", vt::number_integer).get<int64_t>();
  if (version != 1 && version != kCheckpointVersion)
    throw corrupt(fmt::format("format version {}, this attnbench reads versions 1 and {}", version, kCheckpointVersion));
  if ((version >= 2) != has_file_crc) throw corrupt("its second line does not match its format version");
  const std::string identity = field("identity", vt::string).get<std::string>();
  const auto& others = config_.other_dtype_identities;
  const bool other_dtype = std::find(others.begin(), others.end(), identity) != others.end();
  if (other_dtype && !config_.convert_dtype)
    throw InvalidInput(fmt::format("{} holds this run in another --dtype:\n  it holds  {}\n  this run  {}\n(refused; nothing was "
                                   "loaded; --convert-dtype continues it in this run's dtype)",
                                   path, identity, config_.identity));
  if (other_dtype) st.converted_from = identity;
  else if (identity != config_.identity)
    throw InvalidInput(fmt::format("{} belongs to another run:\n  it holds  {}\n  this run  {}\n(refused; nothing was loaded)",
                                   path, identity, config_.identity));
  const auto state = model_->state();
  const auto& tensors = field("tensors", vt::array);
  if (tensors.size() != state.size()) throw corrupt("its tensors do not match this model's");
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.is_object() || !t.contains("name") || !t.at("name").is_string() || !t.contains("count") ||
        !t.at("count").is_number_integer())
      throw corrupt(fmt::format("its header's tensor {} is not a name and a count", i));
    if (t.at("name").get<std::string>() != state[i].name || t.at("count").get<int64_t>() != state[i].count)
      throw corrupt(fmt::format("tensor {} is {} x {}, this model has {} x {}", i, t.at("name").get<std::string>(),
                                t.at("count").get<int64_t>(), state[i].name, state[i].count));
  }
  const int64_t floats = floats_of(state), best_floats = field("best_floats", vt::number_integer).get<int64_t>();
  const bool has_best = field("has_best", vt::boolean).get<bool>();
  if (best_floats != (has_best ? floats_of(model_->trained_tensors()) : 0)) throw corrupt("the best copy's size");
  const size_t payload = static_cast<size_t>(floats + best_floats) * sizeof(float);
  if (all.size() - at != payload) throw corrupt(fmt::format("{} bytes of tensors, {} expected: truncated", all.size() - at, payload));
  // Version 1's checksum covers the payload only; the field checks below cover its header.
  if (version == 1 &&
      crc32_z(0L, reinterpret_cast<const Bytef*>(all.data() + at), payload) != field("crc32", vt::number_integer).get<uint64_t>())
    throw corrupt("checksum mismatch");
  // Every field against the run: the checksum catches damage, these catch a header that was
  // edited and re-checksummed, or written by a broken build.
  auto in_range = [&](const char* key, double lo, double hi, double value) {
    if (!(std::isfinite(value) && value >= lo && value <= hi))
      throw corrupt(fmt::format("its '{}' is {}, outside [{}, {}]", key, value, lo, hi));
    return value;
  };
  const double inf = std::numeric_limits<double>::max();
  const int64_t step = field("step", vt::number_integer).get<int64_t>();
  if (step < 0 || step > config_.steps) throw corrupt(fmt::format("its 'step' is {}, outside this run's 0 .. {} steps", step, config_.steps));
  const int64_t best_step = field("best_step", vt::number_integer).get<int64_t>();
  if (best_step < 0 || best_step > step) throw corrupt(fmt::format("its 'best_step' is {}, outside 0 .. {}", best_step, step));
  const double best_val = field("best_val_accuracy", vt::number_float).get<double>();
  if (best_val != -1) in_range("best_val_accuracy", 0, 1, best_val);  // -1: no evaluation yet
  if (has_best != (best_val >= 0)) throw corrupt("'has_best' and 'best_val_accuracy' disagree");
  const double elapsed = in_range("elapsed_seconds", 0, inf, field("elapsed_seconds", vt::number_float).get<double>());
  const double train_seconds = in_range("train_seconds", 0, elapsed, field("train_seconds", vt::number_float).get<double>());
  // Absent in files of binaries before pauses were detected: every step counted as timed.
  const int64_t paused_steps = h.contains("paused_steps") ? field("paused_steps", vt::number_integer).get<int64_t>() : 0;
  if (paused_steps < 0 || paused_steps > step) throw corrupt(fmt::format("its 'paused_steps' is {}, outside 0 .. {}", paused_steps, step));
  const auto& lv = field("last_val", vt::object);
  EvalResult last_val;
  for (const char* key : {"loss", "accuracy", "token_accuracy", "examples"})
    if (!lv.contains(key) || !lv.at(key).is_number()) throw corrupt(fmt::format("its 'last_val.{}' is missing or not a number", key));
  last_val.loss = in_range("last_val.loss", 0, inf, lv.at("loss").get<double>());
  last_val.accuracy = in_range("last_val.accuracy", 0, 1, lv.at("accuracy").get<double>());
  last_val.token_accuracy = in_range("last_val.token_accuracy", 0, 1, lv.at("token_accuracy").get<double>());
  if (!lv.at("examples").is_number_integer() || lv.at("examples").get<int64_t>() < 0)
    throw corrupt("its 'last_val.examples' is not a count");
  last_val.examples = lv.at("examples").get<int64_t>();
  // Absent: no evaluation yet (+inf), or a checkpoint from before the field (-inf: ties keep
  // the earliest, as that binary did).
  const double best_val_loss = h.contains("best_val_loss")
                                   ? in_range("best_val_loss", 0, inf, field("best_val_loss", vt::number_float).get<double>())
                               : best_val < 0 ? std::numeric_limits<double>::infinity()
                                              : -std::numeric_limits<double>::infinity();
  // Everything checked: load.
  const float* p = reinterpret_cast<const float*>(all.data() + at);
  for (const auto& t : state) {
    std::memcpy(t.data, p, static_cast<size_t>(t.count) * sizeof(float));
    p += t.count;
  }
  if (best_floats) std::memcpy(st.best.data(), p, static_cast<size_t>(best_floats) * sizeof(float));
  st.has_best = has_best;
  st.step = step;
  st.best_val = best_val;
  st.best_val_loss = best_val_loss;
  st.best_step = best_step;
  st.elapsed = elapsed;
  st.train_seconds = train_seconds;
  st.paused_steps = paused_steps;
  st.last_val = last_val;
  // Absent in files of binaries before early stopping: a run that did not stop early.
  st.stopped_early = h.contains("stopped_early") ? field("stopped_early", vt::boolean).get<bool>() : false;
}

TrainOutcome Trainer::run(bool resume, const std::function<void(const CurvePoint&)>& curve,
                          const std::atomic<bool>* interrupt) {
  TrainOutcome out;
  const size_t before = MemoryMeter::current();
  MemoryMeter::reset_peak();
  model_->setup(config_.seed);
  State st;
  st.best = Buffer<float>(static_cast<size_t>(floats_of(model_->trained_tensors())));
  if (resume) {
    load_checkpoint(st);
    out.resumed = true;
    out.resumed_at = st.step;
    out.converted_from = st.converted_from;
  }
  const int64_t tokens_per_step = config_.model.batch * config_.model.seq * (config_.model.two_tower ? 2 : 1);
  const double t_run = now() - st.elapsed;  // elapsed counts across resumes
  double window_loss = 0, window_train = 0;
  int64_t window_paused = 0;
  int64_t window_steps = 0;
  auto evaluate_val = [&](int64_t step) {
    const double t0 = now();
    const EvalResult v = evaluate(*val_, config_.eval_examples);
    out.eval_seconds += now() - t0;
    st.last_val = v;
    if (v.accuracy > st.best_val || (v.accuracy == st.best_val && v.loss < st.best_val_loss)) {
      st.best_val = v.accuracy;
      st.best_val_loss = v.loss;
      st.best_step = step;
      copy_out(model_->trained_tensors(), st.best.data());
      st.has_best = true;
    }
    CurvePoint p;
    p.step = step;
    p.samples = step * config_.model.batch;
    p.elapsed_s = now() - t_run;
    p.val = v;
    if (curve) curve(p);
  };
  for (int64_t step = st.step + 1; step <= config_.steps && !st.stopped_early; ++step) {
    const double t0 = now();
    const Batch batch = training_batch(step);
    const double t1 = now();
    const double lr = config_.schedule.at(step);
    const uint64_t continued_before = continued_count();
    const auto r = model_->train_step(batch, step, static_cast<float>(lr));
    const double t2 = now();
    out.data_seconds += t1 - t0;
    if (continued_count() != continued_before) {
      ++st.paused_steps;
      ++window_paused;
    } else {
      st.train_seconds += t2 - t1;
      window_train += t2 - t1;
    }
    if (!std::isfinite(r.loss)) throw std::runtime_error(fmt::format("the training loss is not finite at step {}", step));
    window_loss += r.loss;
    ++window_steps;
    st.step = step;
    if (step % config_.log_every == 0 || step == config_.steps) {
      CurvePoint p;
      p.step = step;
      p.samples = step * config_.model.batch;
      p.loss = window_loss / static_cast<double>(window_steps);
      p.lr = lr;
      p.grad_norm = r.grad_norm;
      p.tokens_per_s = window_train > 0 ? static_cast<double>(tokens_per_step * (window_steps - window_paused)) / window_train : 0;
      p.elapsed_s = now() - t_run;
      if (curve) curve(p);
      window_loss = window_train = 0;
      window_steps = window_paused = 0;
    }
    if ((config_.eval_every > 0 && step % config_.eval_every == 0) || step == config_.steps) {
      evaluate_val(step);
      st.stopped_early = config_.stop_at > 0 && st.last_val.accuracy >= config_.stop_at;
    }
    const bool stop = interrupt && interrupt->load();
    st.elapsed = now() - t_run;
    if (!config_.checkpoint_dir.empty() &&
        ((config_.checkpoint_every > 0 && step % config_.checkpoint_every == 0) || step == config_.steps || stop || st.stopped_early))
      save_checkpoint(st, out);
    if (stop && step < config_.steps && !st.stopped_early) {
      out.interrupted = true;
      break;
    }
  }
  out.stopped_early = st.stopped_early;
  out.steps_done = st.step;
  out.train_seconds = st.train_seconds;
  out.paused_steps = st.paused_steps;
  out.best_val_accuracy = std::max(st.best_val, 0.0);
  out.best_step = st.best_step;
  out.last_val = st.last_val;
  if (!out.interrupted) {
    const double t0 = now();
    out.test_final = evaluate(*test_, config_.test_examples);
    if (st.has_best) {
      copy_in(model_->trained_tensors(), st.best.data());
      out.test_best = evaluate(*test_, config_.test_examples);
    } else {
      out.test_best = out.test_final;
    }
    out.eval_seconds += now() - t0;
  }
  out.peak_bytes = MemoryMeter::peak() - before;
  // Other lengths, with the best-validation parameters (each a model of its own: not in the
  // run's peak).
  if (!out.interrupted) out.at_lengths = test_at_lengths();
  return out;
}

}  // namespace ab
