//! Training the drafter: anchors, blocks and their masks and labels (blocks), the recipe a
//! target implies and the presets' own (recipe, presets), the loss, AdamW (optim), the lr
//! schedule, one optimizer step (step) with its CUDA graphs (step_graphs), and what the step
//! asks of its replicas (grad_mean). Uses the models, the GPU room and the data; the pipeline
//! runs it.

pub mod blocks;
pub mod grad_mean;
pub mod loss;
pub mod optim;
pub mod presets;
pub mod recipe;
pub mod schedule;
pub mod step;
pub mod step_graphs;
