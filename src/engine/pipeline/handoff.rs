//! The hand-off between a target worker and a drafter worker: hidden states and their batch,
//! with the event the producer recorded after its forward, taken on the consumer's device and
//! streams without the host waiting. Between GPUs the consumer takes the next batch ahead of
//! its step and copies it device to device on a copy stream of its own, so that the copy runs
//! while its current step computes.

use crate::engine::data::PackedBatch;
use crate::engine::gpu::cuda::{Event, Stream};
use anyhow::Result;
use tch::{Device, Tensor};

/// Hidden states on their way from a target worker to a drafter worker.
pub struct HiddenBatch {
    /// [b, s, n * hidden] on the target's device
    pub hidden: Tensor,
    /// The batch it came from, its tensors on the target's device.
    pub batch: PackedBatch,
    /// On a GPU: recorded on the target's stream after the forward; the consumer's stream waits
    /// for it on the device (the host never does).
    pub ready: Option<Event>,
}

impl HiddenBatch {
    /// Takes the hand-off on the consumer's side: the consumer's streams wait for the producer's
    /// `ready` event, and the producer's memory is marked as used there, so that its allocator does
    /// not hand it out again while this side's kernels still read it. Then moves it to `device`.
    pub fn receive(self, device: Device) -> Result<(Tensor, PackedBatch)> {
        if let (Some(ready), Device::Cuda(src)) = (&self.ready, self.hidden.device()) {
            self.wait_at_source(ready, src)?;
            if let Device::Cuda(dst) = device {
                if dst != src {
                    Stream::current(dst)?.wait(ready)?;
                }
            }
        }
        let hidden = self.hidden.to_device(device);
        let batch = self.batch.to_device(device);
        Ok((hidden, batch))
    }

    /// This thread's current stream on the source GPU (where a copy to another GPU runs) waits
    /// for the producer's `ready`, and the producer's memory is marked as used there.
    fn wait_at_source(&self, ready: &Event, src: usize) -> Result<()> {
        let here = Stream::current(src)?;
        here.wait(ready)?;
        for t in self.tensors() {
            here.record_tensor(t)?;
        }
        Ok(())
    }

    fn tensors(&self) -> [&Tensor; 5] {
        tensors_of(&self.hidden, &self.batch)
    }

    /// Takes the hand-off ahead of its step. From another GPU: copied now to `device` on `copy`
    /// (a stream of the consumer's device that has nothing queued, so the copy does not wait
    /// for the consumer's current step); `consumer` is made current again after. On the same
    /// device there is nothing to copy: it is kept as it is.
    pub fn prefetch(self, device: Device, copy: &Stream, consumer: &Stream) -> Result<Prefetched> {
        let (Some(ready), Device::Cuda(src), Device::Cuda(dst)) =
            (&self.ready, self.hidden.device(), device)
        else {
            return Ok(Prefetched::Local(self));
        };
        if src == dst {
            return Ok(Prefetched::Local(self));
        }
        self.wait_at_source(ready, src)?;
        copy.make_current()?;
        let copied = (|| -> Result<Prefetched> {
            let hidden = self.hidden.to_device(device);
            let batch = self.batch.to_device(device);
            let done = Event::new(false)?;
            done.record(copy)?;
            Ok(Prefetched::Copied {
                hidden,
                batch,
                done,
            })
        })();
        // The consumer's stream is current again whatever happened.
        consumer.make_current()?;
        copied
    }
}

fn tensors_of<'a>(hidden: &'a Tensor, b: &'a PackedBatch) -> [&'a Tensor; 5] {
    [hidden, &b.input_ids, &b.positions, &b.doc_ids, &b.loss_mask]
}

/// A hand-off taken ahead of its step.
pub enum Prefetched {
    /// Not copied yet (same device, or the CPU): taken as usual when its step comes.
    Local(HiddenBatch),
    /// Already on the consumer's device; `done` marks the copy's end on the copy stream.
    Copied {
        hidden: Tensor,
        batch: PackedBatch,
        done: Event,
    },
}

impl Prefetched {
    /// The hidden states and batch on `device` for the step that uses them: the consumer's
    /// stream waits (on the device) for the copy, and the copied memory is marked as used there.
    pub fn take(self, device: Device, consumer: Option<&Stream>) -> Result<(Tensor, PackedBatch)> {
        match self {
            Prefetched::Local(h) => h.receive(device),
            Prefetched::Copied {
                hidden,
                batch,
                done,
            } => {
                if let Some(s) = consumer {
                    s.wait(&done)?;
                    for t in tensors_of(&hidden, &batch) {
                        s.record_tensor(t)?;
                    }
                }
                Ok((hidden, batch))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn a_batch_from_another_gpu_is_copied_ahead_and_one_from_the_same_gpu_is_kept() {
        if !crate::cuda_shim::AVAILABLE
            || !tch::Cuda::is_available()
            || tch::Cuda::device_count() < 2
        {
            eprintln!("fewer than 2 CUDA devices (or no CUDA shim): not run");
            return;
        }
        let (src, dst) = (Device::Cuda(0), Device::Cuda(1));
        let producer = Stream::from_pool(0).unwrap();
        producer.make_current().unwrap();
        let hand_off = || {
            let hidden = Tensor::arange(8 * 4096, (Kind::Float, src)).view([1, 8, 4096]) * 2.0;
            let ids = Tensor::arange(8, (Kind::Int64, src)).view([1, 8]);
            let ready = Event::new(false).unwrap();
            ready.record(&producer).unwrap();
            HiddenBatch {
                hidden,
                batch: PackedBatch {
                    rows: 1,
                    seq: 8,
                    input_ids: ids.copy(),
                    positions: ids.copy(),
                    doc_ids: ids.zeros_like(),
                    loss_mask: ids.ones_like().to_kind(Kind::Bool),
                    host_doc_ids: vec![0; 8],
                    host_loss_mask: vec![true; 8],
                    docs_placed: 1,
                    truncated: 0,
                    doc_tokens: 0,
                },
                ready: Some(ready),
            }
        };
        let consumer = Stream::from_pool(1).unwrap();
        consumer.make_current().unwrap();
        let copy = Stream::from_pool(1).unwrap();
        let h = hand_off();
        let want = h.hidden.to_device(Device::Cpu);
        let p = h.prefetch(dst, &copy, &consumer).unwrap();
        assert!(matches!(p, Prefetched::Copied { .. }), "copied ahead");
        let (hidden, batch) = p.take(dst, Some(&consumer)).unwrap();
        assert_eq!((hidden.device(), batch.input_ids.device()), (dst, dst));
        let got = hidden.to_device(Device::Cpu);
        assert_eq!(f64::try_from((got - want).abs().max()).unwrap(), 0.0);
        // The same device: nothing to copy, kept for its step.
        let p = hand_off().prefetch(src, &copy, &consumer).unwrap();
        assert!(matches!(p, Prefetched::Local(_)));
    }
}
