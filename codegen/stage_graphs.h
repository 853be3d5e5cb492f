// A pipeline stage's training graph cut in two: a forward graph that runs once per micro-batch and leaves behind
// what the backward needs (its stash), and a backward graph that takes the stash and the gradients of the
// stage's outputs and produces the gradients of its params and inputs. With recomputation the stash is the
// stage's inputs only and the backward re-runs the forward first (docs/autodiff.md, "Stage graphs").
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codegen/autodiff.h"
#include "importer/importer.h"
#include "plan/plan.h"

namespace apart {

struct StageGraphOptions {
  // What to differentiate, as for build_training_graph: `loss` set only on the stage that holds the model's loss;
  // `output_gradients` the stage outputs that later stages read (float ones; their gradients come in);
  // `input_gradients` the stage inputs produced by earlier stages (float ones; their gradients go out);
  // `import` binds the batch dim to the micro-batch size of one replica.
  TrainingGraphOptions training;
  // Keep only the stage inputs between forward and backward; the backward recomputes the forward first.
  bool recompute = false;
  // ZB-H1: also split the backward into its input-gradient pass and its weight-gradient pass (StageGraphs below).
  bool split_weight_pass = false;
};

// Both graphs are standard ONNX models (ai.apart ops where build_training_graph uses them) with the stage's params
// as initializers (the same data or external-data references as the stage's forward): a runtime shares one copy
// of each param between the two.
struct StageGraphs {
  // Inputs: the stage's forward inputs. Outputs, in this order: the loss (when the stage holds it), the stage
  // outputs in `output_gradient_inputs` order, then `stash` in order, then the values in `state_updates`, then
  // `outputs_without_gradient`. A name is output once, at its first place (a stash value that is also a stage
  // output or a stage input is not repeated; a stage input in the stash is output as it came in).
  onnx::ModelProto forward;
  // Inputs: `stash` (by the same names), then the gradient inputs of `output_gradient_inputs` (and
  // `loss_seed_input`, in the fused graph's input order). Outputs, in this
  // order: one gradient per param in `gradients` order, then the input gradients in `input_gradients` order.
  onnx::ModelProto backward;
  // Forward values (stage inputs included) the backward reads, but not those it computes itself (constants,
  // values of params alone, integers folded from static shapes); with recompute: the stage's inputs it needs.
  std::vector<std::string> stash;
  std::string loss_output;         // "" on stages without the loss
  // The backward input that carries the loss's gradient seed (the loss scale), when options.training asked for one.
  std::string loss_seed_input;
  std::vector<std::pair<std::string, std::string>> gradients;               // param → its gradient (backward output)
  std::vector<std::pair<std::string, std::string>> input_gradients;         // stage input → its gradient (backward output)
  std::vector<std::pair<std::string, std::string>> output_gradient_inputs;  // stage output → its gradient (backward input)
  std::vector<std::pair<std::string, std::string>> state_updates;           // initializer → its new value (forward output)
  // The forward model's other outputs, which get no gradient: integer or boolean boundary values a later stage
  // reads, outputs beside the loss (forward outputs).
  std::vector<std::string> outputs_without_gradient;

  // With split_weight_pass, ZB-H1's two passes over the backward's nodes (Qi et al., ICLR 2024 §2): B, every node an
  // input gradient needs, and W, the others (what only param gradients need), each in the backward's order. B then W
  // computes what `backward` computes, node for node, so the same bits. Empty models without split_weight_pass.
  // input_pass: inputs, the backward's inputs B reads (in the backward's order); outputs, the input gradients in
  // `input_gradients` order, the param gradients B computes (those an input gradient needs too) in `gradients`
  // order, then `carried`.
  onnx::ModelProto input_pass;
  // weight_pass: inputs, the backward's inputs W reads (in its order), then `carried`; outputs, the other param
  // gradients in `gradients` order. A stage without input gradients has an empty B: W is its whole backward.
  onnx::ModelProto weight_pass;
  std::vector<std::string> carried;  // values B computes and W reads, in B's order
};

// Builds the stage's training graph (build_training_graph) and cuts it between forward and backward. Running
// `forward` then `backward` computes exactly what the fused training graph computes, with the same kernels in
// the same order (bitwise equal on the CPU backend), with or without recompute. Throws what
// build_training_graph throws.
StageGraphs build_stage_graphs(const onnx::ModelProto& forward, const StageGraphOptions& options);

// A stage file reads some values only for their static shape: a Shape (or Size) of a value another stage computes,
// replicated into this stage with the constant tasks that read it (torch exports' Shape -> Gather -> Concat of an
// attention's input, the cut inside that attention). The file declares such a value as a graph input, but the plan
// sends nothing for it: the planner's boundaries are what batch tasks read (DESIGN.md, "Partitioning").
// Replaces each reader of a graph input outside `sent` (and not an initializer) with a Constant holding what the
// importer folds it to under `import` (the batch bound as the stage runs it), and drops those inputs; returns their
// names. InvalidModel, naming the value and the node, when a reader needs more than the shape (a stage file that is
// not its plan's).
std::vector<std::string> fold_shape_only_inputs(onnx::ModelProto& stage, const std::set<std::string>& sent,
                                                const ImportOptions& import);

// How every reader of the plan's model imports it, so that node indices agree with the plan's task graph: Constant
// weights as params as the plan was made (constants_as_params), and the loss it appended (added_loss). Throws
// InvalidArgument for an added_loss form apart does not know.
ImportOptions planned_import(const PlanDocument& plan);
// The plan's record of ImportOptions::loss (absent when none was added).
std::optional<PlanModel::AddedLoss> added_loss_record(const AddedLoss& loss);

}  // namespace apart
