#include "bench/engine/dump.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/engine/runner.hpp"
#include "bench/results/result_writer.hpp"
#include "core/npy.hpp"
#include "core/sysinfo.hpp"

namespace ab {

namespace {
namespace fs = std::filesystem;

// Where a dump may go, decided before anything is computed: a new path, an empty directory, or a
// directory that holds exactly an earlier dump (the files its config.json lists). Anything else
// holds the user's files and is refused; `earlier` gets the files of an earlier dump, which are
// the only ones a dump ever removes.
fs::path dump_target(const std::string& dir, std::vector<fs::path>* earlier, bool* exists) {
  if (dir.empty()) throw InvalidInput("dump --out: an empty path");
  fs::path target = fs::absolute(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "a/b/" and "." end in a separator
  if (target == target.root_path() || !target.has_filename())
    throw InvalidInput(fmt::format("dump --out '{}': the root directory is not a dump directory", dir));
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(target, ec);
  if (ec && st.type() != fs::file_type::not_found) throw InvalidInput(fmt::format("dump --out '{}': {}", dir, ec.message()));
  // The dump is made in .NAME.tmp.XXXXXX beside it first.
  if (target.filename().string().size() + 12 > 255)
    throw InvalidInput(fmt::format("dump --out '{}': the directory name is {} characters; at most 243", dir,
                                   target.filename().string().size()));
  *exists = fs::exists(st);
  if (!*exists) return target;
  if (fs::is_symlink(st))
    throw InvalidInput(fmt::format("dump --out '{}' is a symbolic link; give the directory itself", dir));
  if (!fs::is_directory(st))
    throw InvalidInput(fmt::format("dump --out '{}' exists and is not a directory; a dump writes a new or empty directory", dir));
  std::set<std::string> listed;
  const fs::path config = target / "config.json";
  if (fs::is_regular_file(config)) {
    try {
      std::ifstream f(config);
      const nlohmann::json cfg = nlohmann::json::parse(f);
      if (cfg.is_object() && cfg.contains("tensors") && cfg["tensors"].is_object() && cfg.contains("mechanism")) {
        listed.insert("config.json");
        for (const auto& [name, file] : cfg["tensors"].items())
          if (file.is_string() && fs::path(file.get<std::string>()).filename() == file.get<std::string>())
            listed.insert(file.get<std::string>());
      }
    } catch (const std::exception&) {
      listed.clear();  // not a dump's config: the directory is the user's
    }
  }
  for (const auto& entry : fs::directory_iterator(target)) {
    const std::string name = entry.path().filename().string();
    if (!listed.count(name) || !entry.is_regular_file())
      throw InvalidInput(fmt::format("dump --out '{}' holds '{}', which an attnbench dump did not write; a dump writes a "
                                     "new directory, an empty one or its own earlier dump",
                                     dir, name));
    earlier->push_back(entry.path());
  }
  return target;
}

}  // namespace

namespace {
// The point's tensors as .npy files in `tmp`: inputs, output and, with a backward pass, dout and
// the input gradients; the mechanism's own tensors (dump_tensors) and the gradient of each
// learned one ("d" + its name, in its dumped shape: what the trainer's optimiser receives, for
// the loss sum(dout * out)). Returns {name: file}.
nlohmann::json write_dump_tensors(const fs::path& tmp, const PointId& id, PreparedPoint& pp, const AttnData& data, bool bwd) {
  nlohmann::json files = nlohmann::json::object();
  const auto& s = id.shape;
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
  const std::vector<DumpTensor> own = pp.impl->dump_tensors();
  for (const auto& t : own) {
    const std::string file = t.name + ".npy";
    if (t.f32) write_npy((tmp / file).string(), t.f32, t.shape);
    else write_npy((tmp / file).string(), t.i64, t.shape);
    files[t.name] = file;
  }
  if (bwd)
    for (const auto& l : pp.impl->learned()) {
      if (!l.grad) throw std::logic_error(id.mechanism + ": no gradient for the learned tensor " + l.name);
      std::vector<int64_t> grad_shape = {l.count};
      for (const auto& t : own)
        if (t.name == l.name) grad_shape = t.shape;
      const std::string name = "d" + l.name;
      write_npy((tmp / (name + ".npy")).string(), l.grad, grad_shape);
      files[name] = name + ".npy";
    }
  return files;
}

// config.json: the mechanism, its parameters, the shape, the seed, the scale, the tensors'
// files, the mechanism's note, and the additive position encoding inside it (--positions):
// enough to recompute it (its learned table, if any, is among the tensors: position_bias or
// shaw_keys).
nlohmann::json dump_config(const PointId& id, uint64_t seed, const PreparedPoint& pp, nlohmann::json files) {
  const auto& s = id.shape;
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [k, v] : id.params.items())
    std::visit([&](const auto& x) { params[k] = x; }, v);
  nlohmann::json cfg = {{"mechanism", id.mechanism}, {"params", params}, {"B", s.B},
                        {"H", s.H},                  {"N", s.N},           {"D", s.D},
                        {"causal", id.causal},       {"seed", seed},       {"scale", 1.0 / std::sqrt(double(s.D))},
                        {"tensors", std::move(files)}};
  if (const std::string note = pp.impl->dump_note(); !note.empty()) cfg["note"] = note;
  if (id.train.positions) {
    const PositionEncoding& pe = *id.train.positions;
    if (pe.bias.active())
      cfg["positions"] = {{"encoding", to_string(pe.kind)}, {"buckets", pe.bias.buckets},
                          {"max_distance", pe.bias.max_distance}, {"clip", pe.bias.clip}};
  }
  return cfg;
}

// The finished scratch directory into place: a new path by one rename; an existing (empty, or
// earlier-dump) directory keeps its inode: the earlier dump's files are removed, the new ones
// moved in, config.json last.
void move_dump_into_place(const fs::path& tmp, const fs::path& target, bool exists, const std::vector<fs::path>& earlier) {
  if (!exists) {
    fs::rename(tmp, target);
    return;
  }
  for (const auto& p : earlier) fs::remove(p);
  for (const auto& entry : fs::directory_iterator(tmp))
    if (entry.path().filename() != "config.json") fs::rename(entry.path(), target / entry.path().filename());
  fs::rename(tmp / "config.json", target / "config.json");
  fs::remove(tmp);
}
}  // namespace

void dump_point(const PointId& id, uint64_t seed, const std::string& dir) {
  std::vector<fs::path> earlier;
  bool exists = false;
  const fs::path target = dump_target(dir, &earlier, &exists);
  RunOptions opts;
  opts.seed = seed;
  opts.mem_limit = default_memory_limit();  // a shape no machine holds is refused as `run` refuses it
  opts.param_grads = true;                   // the learned tensors' gradients, as training computes them
  PointId pid = id;
  const MechanismInfo& info = find_mechanism(id.mechanism);
  pid.mode = info.caps.backward ? RunMode::fwdbwd : RunMode::fwd;
  PreparedPoint pp = prepare_point(pid, opts);
  if (pp.status != Status::OK) throw InvalidInput(pp.message);

  const bool bwd = pid.mode == RunMode::fwdbwd;
  AttnData data(id.shape, seed, bwd);
  Rng rng(seed, kStreamParams);
  pp.impl->setup(attention_mode(pid.mode), rng);
  pp.impl->forward(data.args());
  if (bwd) pp.impl->backward(data.args());

  // Everything into a new scratch directory beside the target (made here, so removable), then
  // into place.
  std::string pattern = (target.parent_path() / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  if (!mkdtemp(pattern.data()))
    throw std::runtime_error(fmt::format("cannot create a scratch directory beside {}: {}", target.string(), std::strerror(errno)));
  const fs::path tmp = pattern;
  try {
    nlohmann::json files = write_dump_tensors(tmp, id, pp, data, bwd);
    write_file_atomic((tmp / "config.json").string(), dump_config(id, seed, pp, std::move(files)).dump(2) + "\n");
    move_dump_into_place(tmp, target, exists, earlier);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // the scratch directory made above, nothing else
    throw;
  }
}

}  // namespace ab
