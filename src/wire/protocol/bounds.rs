//! What a reader checks of every message before it trusts it (`Msg::check`): each number and
//! length within the protocol's bounds (`MAX_*` in src/wire/protocol.rs).

use super::*;

fn bounded(what: &str, v: u64, max: u64) -> Result<(), String> {
    if v > max {
        Err(format!("{what} {v} is beyond {max}"))
    } else {
        Ok(())
    }
}

fn text(what: &str, s: &str) -> Result<(), String> {
    bounded(&format!("{what} of"), s.len() as u64, MAX_TEXT as u64).map_err(|e| e + " bytes")
}

fn phase_list(what: &str, ph: &[(u16, u64)]) -> Result<(), String> {
    bounded(
        &format!("{what} phase entries"),
        ph.len() as u64,
        MAX_PHASE_ENTRIES as u64,
    )?;
    ph.iter()
        .try_for_each(|(_, ns)| bounded(&format!("{what} phase ns"), *ns, MAX_SPAN_NS))
}

impl Msg {
    /// Every number and length of the message within the protocol's bounds (`MAX_*`): what a
    /// reader checks before it sizes a table by an id or adds a duration up.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Msg::Hello(h) => {
                text("the program name", &h.program)?;
                if let Some(why) = &h.cupti {
                    text("the cupti note", why)?;
                }
                if let Some(host) = &h.host {
                    text("the host name", host)?;
                }
                if let Some(j) = &h.job {
                    text("the job id", &j.id)?;
                    text("the job's host", &j.host)?;
                    text("the job's master address", &j.master_addr)?;
                }
                bounded("the hello's clock", h.now_ns, MAX_TIME_NS)?;
                if !(h.ns_per_mark.is_finite() && (0.0..=1e9).contains(&h.ns_per_mark)) {
                    return Err(format!("ns_per_mark {} is not a cost", h.ns_per_mark));
                }
                Ok(())
            }
            Msg::Thread(t) => {
                bounded("thread id", t.id as u64, MAX_THREADS as u64 - 1)?;
                text("the thread name", &t.name)?;
                text("the stage name", &t.stage)?;
                text("the device", &t.device)
            }
            Msg::Queue(q) => {
                bounded("queue id", q.id as u64, MAX_QUEUES as u64 - 1)?;
                bounded("queue capacity", q.capacity as u64, MAX_DEPTH as u64)?;
                text("the queue name", &q.name)?;
                text("the producer", &q.producer)?;
                text("the consumer", &q.consumer)
            }
            Msg::Step(s) => {
                bounded("the step's thread id", s.th as u64, MAX_THREADS as u64 - 1)?;
                bounded("the step's end", s.end, MAX_TIME_NS)?;
                bounded("the step's wall ns", s.wall, MAX_SPAN_NS)?;
                bounded("the step's idle ns", s.idle, MAX_SPAN_NS)?;
                bounded("the step's tokens", s.tok, MAX_COUNT)?;
                bounded(
                    "the step's phase counts",
                    s.n.len() as u64,
                    MAX_PHASE_ENTRIES as u64,
                )?;
                bounded(
                    "the step's host syncs",
                    s.sy.len() as u64,
                    MAX_PHASE_ENTRIES as u64,
                )?;
                if let Some(c) = &s.cu {
                    bounded("the step's launches", c.launches, MAX_COUNT)?;
                    bounded("the step's launch ns", c.launch_ns, MAX_SPAN_NS)?;
                    bounded("the step's sync ns", c.sync_ns, MAX_SPAN_NS)?;
                }
                phase_list("the step's", &s.ph)
            }
            Msg::Sample(s) => sample(s),
            Msg::Status { text: t } => text("a status line", t),
            Msg::Refused { reason } => text("a refusal", reason),
            Msg::Dropped { frames } => bounded("dropped frames", *frames, MAX_COUNT),
            Msg::Command { .. } | Msg::Unknown => Ok(()),
        }
    }
}

/// A sample: its clock and counts, then each live step, queue, allocator and GPU in it.
fn sample(s: &Sample) -> Result<(), String> {
    bounded("the sample's clock", s.now, MAX_TIME_NS)?;
    bounded("the sample's dropped", s.dropped, MAX_COUNT)?;
    bounded("live steps", s.live.len() as u64, MAX_THREADS as u64)?;
    bounded("queue samples", s.q.len() as u64, MAX_QUEUES as u64)?;
    s.live.iter().try_for_each(live_step)?;
    s.q.iter().try_for_each(queue_sample)?;
    bounded(
        "allocator samples",
        s.alloc.len() as u64,
        MAX_CUDA_DEVICES as u64,
    )?;
    s.alloc.iter().try_for_each(allocator_sample)?;
    bounded("GPUs in a sample", s.gpu.len() as u64, MAX_GPUS as u64)?;
    for (k, g) in s.gpu.iter().enumerate() {
        if s.gpu[..k].iter().any(|o| o.index == g.index) {
            return Err(format!("GPU {} listed twice in a sample", g.index));
        }
        gpu_sample(g)?;
    }
    Ok(())
}

fn live_step(l: &WireLive) -> Result<(), String> {
    bounded(
        "a live step's thread id",
        l.th as u64,
        MAX_THREADS as u64 - 1,
    )?;
    bounded("a live step's start", l.ss, MAX_TIME_NS)?;
    bounded("a live phase's start", l.ps, MAX_TIME_NS)?;
    phase_list("a live step's", &l.acc)?;
    bounded(
        "a live step's sites",
        l.sites.len() as u64,
        MAX_SITES as u64,
    )?;
    bounded("a live step's steps", l.steps, MAX_COUNT)?;
    for (at, op, n, ns) in &l.sites {
        text("a sync site", at)?;
        text("a sync site's op", op)?;
        bounded("a sync site's count", *n, MAX_COUNT)?;
        bounded("a sync site's time", *ns, MAX_COUNT)?;
    }
    Ok(())
}

fn queue_sample(q: &WireQueue) -> Result<(), String> {
    bounded("a queue sample's id", q.id as u64, MAX_QUEUES as u64 - 1)?;
    bounded("a queue sample's time", q.at, MAX_TIME_NS)?;
    for (what, v) in [("depth", q.depth), ("min", q.min), ("max", q.max)] {
        bounded(&format!("a queue's {what}"), v as u64, MAX_DEPTH as u64)?;
    }
    for v in [
        q.push,
        q.pop,
        q.push_wait,
        q.pop_wait,
        q.empty,
        q.full,
        q.age_sum,
    ] {
        bounded("a queue counter", v, MAX_COUNT)?;
    }
    Ok(())
}

fn allocator_sample(a: &WireAlloc) -> Result<(), String> {
    bounded(
        "an allocator sample's device",
        a.cuda as u64,
        MAX_CUDA_DEVICES as u64 - 1,
    )?;
    for v in [
        a.reserved,
        a.allocated,
        a.segments,
        a.allocs,
        a.frees,
        a.retries,
        a.graphs,
    ] {
        bounded("an allocator counter", v, MAX_COUNT)?;
    }
    Ok(())
}

fn gpu_sample(g: &WireGpu) -> Result<(), String> {
    bounded("a GPU's index", g.index as u64, MAX_GPUS as u64 - 1)?;
    if let Some(n) = g.cuda {
        bounded("a GPU's device", n as u64, MAX_CUDA_DEVICES as u64 - 1)?;
    }
    bounded("a GPU's utilisation", g.util.max(g.bw) as u64, 100)?;
    text("a GPU's name", &g.name)?;
    bounded("a GPU's throttle reasons", g.throttle.len() as u64, 32)?;
    for t in &g.throttle {
        text("a GPU's throttle reason", t)?;
    }
    for v in [g.used, g.total, g.ours.unwrap_or(0)] {
        bounded("a GPU's memory", v, MAX_COUNT)?;
    }
    if !(g.w.is_finite() && (0.0..=1e6).contains(&g.w)) {
        return Err(format!("a GPU's power {} W is not a power", g.w));
    }
    Ok(())
}
