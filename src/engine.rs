//! The DFlash training engine, in rooms by job (bottom up): `gpu` (CUDA, CUPTI, fast paths) and
//! `data` (packing, JSONL, tokenizing, chat templates) near the ground; `model` (the target, the
//! drafter, their shapes and weights); `train` (blocks, loss, optimizer, the drafter's step);
//! `checkpoint`; `pipeline` (the workers and their queues) with `parallel` beside it (replicas,
//! multi-process jobs); `bench` on top. `spec` (the resolved run) and `cxx/` (the C++ and CUDA
//! sources the build compiles) sit at the root.

pub mod bench;
pub mod checkpoint;
pub mod data;
pub mod gpu;
pub mod model;
pub mod parallel;
pub mod pipeline;
pub mod spec;
pub mod train;
