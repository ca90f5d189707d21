// A point's identity converted to each engine's configuration, one function per engine, in one
// place: the attention call's problem (the attention level), the model (the model level) and the
// trainer (training runs). Every verb that runs a point starts from these.
#pragma once
#include "attention_impls/attention.hpp"
#include "bench/points/point.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"

namespace ab {

// The attention level's --positions: the additive encodings; rope, which a mechanism that
// rotates its own feature maps takes inside (Capabilities::rope_feature_maps; for the others it
// is the model's rotation of q and k ahead of the mechanism, SKIPPED there); or none (the
// mechanism alone, as without the option; a sweep over encodings names it). Sinusoidal and
// learned positions belong to a model's embedding: InvalidInput.
struct AttentionPositions {
  PositionBiasSpec bias;
  bool rope = false;
};
AttentionPositions attention_positions(const PointId& id);

// An attention-level point's problem: its shape, contiguous strides, threads, dtype, and the
// --positions it takes inside the mechanism (InvalidInput for an encoding that belongs to a model).
AttnProblem attention_problem(const PointId& id);

// The model a model-level point runs: the task's shape with the point's sizes.
ModelConfig model_config(const PointId& id);

// The trainer's configuration of a training point: the model, the recipe, the data options.
TrainConfig train_config(const PointId& id);

}  // namespace ab
