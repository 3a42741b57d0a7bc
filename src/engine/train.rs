//! Training the drafter: anchors, blocks and their masks and labels (blocks), the recipe a
//! target implies (recipe), the loss, AdamW (optim), the lr schedule, and one optimizer step
//! (drafter_step) with its CUDA graphs (drafter_graph). Uses the models, the GPU room and the
//! data; the pipeline runs it.

pub mod blocks;
pub mod drafter_graph;
pub mod drafter_step;
pub mod grad_mean;
pub mod loss;
pub mod optim;
pub mod presets;
pub mod recipe;
pub mod schedule;
