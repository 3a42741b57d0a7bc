//! The models: the target's and the drafter's shapes (shapes), their layers, the
//! Qwen3/Llama target (qwen3) and its CUDA graph (target_graph), the DFlash drafter and its
//! attention in tiles (drafter, tiled), the targets' document attention (varlen), decoding,
//! safetensors weights (a tensor read at a time: tensor_file), the target's FP8 GEMMs (fp8), the FLOP count and the memory estimate.
//! Uses the GPU room and the data room's types; never the step, the pipeline or the
//! multi-process code.

pub mod decode;
pub mod drafter;
pub mod flops;
pub mod fp8;
pub mod layers;
pub mod memory;
pub mod qwen3;
pub mod shapes;
pub mod target_graph;
pub mod tensor_file;
pub mod tiled;
pub mod varlen;
pub mod weights;
