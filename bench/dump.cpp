#include "bench/dump.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench/runner.hpp"
#include "core/npy.hpp"

namespace ab {

void dump_point(const PointId& id, uint64_t seed, const std::string& dir) {
  namespace fs = std::filesystem;
  RunOptions opts;
  opts.seed = seed;
  PointId pid = id;
  const MechanismInfo& info = find_mechanism(id.mechanism);
  pid.mode = info.caps.backward ? RunMode::fwdbwd : RunMode::fwd;
  PreparedPoint pp = prepare_point(pid, opts);
  if (pp.status != Status::OK) throw InvalidInput(pp.message);

  const auto& s = id.shape;
  const bool bwd = pid.mode == RunMode::fwdbwd;
  AttnData data(s, seed, bwd);
  Rng rng(seed, kStreamParams);
  pp.impl->setup(attention_mode(pid.mode), rng);
  pp.impl->forward(data.args());
  if (bwd) pp.impl->backward(data.args());

  fs::path target(dir);
  fs::path tmp = target;
  tmp += fmt::format(".tmp.{}", static_cast<long>(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  nlohmann::json files = nlohmann::json::object();
  const std::vector<int64_t> shape = {s.B, s.H, s.N, s.D};
  auto put = [&](const std::string& name, const Tensor& t) {
    write_npy((tmp / (name + ".npy")).string(), t.data(), shape);
    files[name] = name + ".npy";
  };
  put("q", data.q);
  put("k", data.k);
  put("v", data.v);
  put("out", data.o);
  if (bwd) {
    put("dout", data.dout);
    put("dq", data.dq);
    put("dk", data.dk);
    put("dv", data.dv);
  }
  for (const auto& t : pp.impl->dump_tensors()) {
    const std::string file = t.name + ".npy";
    if (t.f32) write_npy((tmp / file).string(), t.f32, t.shape);
    else write_npy((tmp / file).string(), t.i64, t.shape);
    files[t.name] = file;
  }
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [k, v] : id.params.items())
    std::visit([&](const auto& x) { params[k] = x; }, v);
  nlohmann::json cfg = {{"mechanism", id.mechanism}, {"params", params}, {"B", s.B},
                        {"H", s.H},                  {"N", s.N},           {"D", s.D},
                        {"causal", id.causal},       {"seed", seed},       {"scale", 1.0 / std::sqrt(double(s.D))},
                        {"tensors", files}};
  if (const std::string note = pp.impl->dump_note(); !note.empty()) cfg["note"] = note;
  FILE* f = std::fopen((tmp / "config.json").c_str(), "w");
  if (!f) throw std::runtime_error("cannot write " + (tmp / "config.json").string());
  const std::string text = cfg.dump(2) + "\n";
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  fs::remove_all(target);
  fs::rename(tmp, target);
}

}  // namespace ab
