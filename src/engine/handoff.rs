//! The hand-off between a target worker and a drafter worker: hidden states and their batch,
//! with the event the producer recorded after its forward, taken on the consumer's device and
//! streams without the host waiting.

use super::cuda::{Event, Stream};
use super::data::PackedBatch;
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
            // The copy to another GPU runs behind this thread's current stream on the source.
            let here = Stream::current(src)?;
            here.wait(ready)?;
            for t in self.tensors() {
                here.record_tensor(t)?;
            }
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

    fn tensors(&self) -> [&Tensor; 5] {
        let b = &self.batch;
        [
            &self.hidden,
            &b.input_ids,
            &b.positions,
            &b.doc_ids,
            &b.loss_mask,
        ]
    }
}
