//! The DFlash training engine: data, the Qwen3 target, the DFlash drafter, blocks and masks,
//! the loss, the optimizer, checkpoints, and the pipelined workers.

pub mod blocks;
pub mod chat;
pub mod checkpoint;
pub mod checksum;
pub mod config;
pub mod cuda;
pub mod data;
pub mod decode;
pub mod drafter;
pub mod drafter_graph;
pub mod drafter_step;
pub mod drafter_worker;
pub mod fast_paths;
pub mod flops;
pub mod handoff;
pub mod jsonl;
pub mod layers;
pub mod loss;
pub mod marks;
pub mod nccl;
pub mod optim;
pub mod pipeline;
pub mod qwen3;
pub mod recipe;
pub mod replica_check;
pub mod replicas;
pub mod save_dir;
pub mod schedule;
pub mod spec;
pub mod target_graph;
pub mod tiled;
pub mod tokenize;
pub mod varlen;
pub mod weights;
pub mod workers;
