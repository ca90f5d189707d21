#include "bench/points/configs.hpp"

#include <fmt/format.h>

#include "attention_impls/registry.hpp"
#include "tasks/task.hpp"

namespace ab {

AttentionPositions attention_positions(const PointId& id) {
  if (!id.train.positions || id.level == Level::model) return {};
  const PositionEncoding& pe = *id.train.positions;
  if (pe.kind == Positions::rope) return {{}, true};
  if (!pe.bias.active() && pe.kind != Positions::none)
    throw InvalidInput(fmt::format("--positions {} belongs to a model (--level model); the attention level takes none, alibi, bias, shaw or rope",
                                   to_string(pe)));
  return {pe.bias, false};
}

AttnProblem attention_problem(const PointId& id) {
  AttnProblem p;
  p.shape = id.shape;
  p.causal = id.causal;
  p.strides = Strides3::contiguous(id.shape);
  p.threads = id.threads;
  p.dtype = id.dtype;
  const AttentionPositions ap = attention_positions(id);
  p.bias = ap.bias;
  p.rope = ap.rope && find_mechanism(id.mechanism).caps.rope_feature_maps;
  return p;
}

ModelConfig model_config(const PointId& id) {
  ModelConfig c = model_config_for_task(find_task(id.task), task_options(id));
  c.batch = id.shape.B;
  c.heads = id.shape.H;
  c.layers = id.model.layers;
  c.dmodel = id.model.dmodel;
  c.mlp = id.model.mlp;
  c.tie_embeddings = id.model.tie_embeddings;
  c.mechanism = id.mechanism;
  c.params = id.params;
  c.threads = id.threads;
  c.causal = id.causal;
  c.dtype = id.dtype;
  if (id.train.positions) {  // else the task's
    const PositionEncoding& pe = *id.train.positions;
    c.positions = pe.kind;
    c.position_bias = pe.bias;
  }
  return c;
}

TrainConfig train_config(const PointId& id) {
  TrainConfig c;
  c.task = id.task;
  c.data = task_options(id);
  c.data.seed = static_cast<uint64_t>(id.train.seed);
  c.model = model_config(id);
  c.model.dropout = static_cast<float>(id.train.dropout);
  c.model.attn_dropout = static_cast<float>(id.train.attn_dropout);
  c.model.clip = static_cast<float>(id.train.clip);
  c.model.clip_mode = id.train.clip_mode;
  c.model.optimizer.beta1 = static_cast<float>(id.train.beta1);
  c.model.optimizer.beta2 = static_cast<float>(id.train.beta2);
  c.model.optimizer.eps = static_cast<float>(id.train.adam_eps);
  c.model.optimizer.weight_decay = static_cast<float>(id.train.weight_decay);
  c.steps = id.train.steps;
  c.schedule = id.train.schedule.for_run(id.train.lr, id.train.warmup, id.train.steps);
  c.eval_every = id.train.eval_every;
  c.eval_examples = id.train.eval_examples;
  c.test_examples = id.train.test_examples;
  c.seed = static_cast<uint64_t>(id.train.seed);
  c.identity = id.name();
  for (const Dtype other : {Dtype::f32, Dtype::bf16})
    if (other != id.dtype) {
      PointId o = id;
      o.dtype = other;
      c.other_dtype_identities.push_back(o.name());
    }
  c.stop_at = id.train.stop_at;
  c.test_seqs = id.train.test_seq;
  return c;
}

}  // namespace ab
