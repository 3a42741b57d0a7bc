//! Every word and abbreviation the screens show, as the help overlay lists them: what a view
//! holds, and what each term means. Data only; panels/help.rs lays it out.

use super::choices::View;

/// What each view holds (the tab bar names them, `1`-`7` go to them).
pub fn view_text(v: View) -> &'static str {
    match v {
        View::Overview => "threads, phase bars, queues, GPUs, loss and tok/s at a glance",
        View::Threads => "every thread with helpers; the selected one's phases, CPU, steps",
        View::Phases => "phase bars with ms per phase, the critical path, shares over time",
        View::Queues => "each queue's depth, wait shares, rates, item age; the GPUs",
        View::Charts => "loss and tok/s over the run, large",
        View::Timeline => "each thread's phases over the last seconds, queue depths, verdicts",
        View::Warnings => "the warnings in force: severity, evidence, the fix, how long",
    }
}

/// (section, [(term, meaning)]): the words on screen, grouped by where they are.
pub const GLOSSARY: [(&str, &[(&str, &str)]); 8] = [
    (
        "header",
        &[
            (
                "step",
                "optimizer steps taken (step 163/300: of --steps, ETA at this rate)",
            ),
            ("tok/s", "training tokens a second, over the last second"),
            ("loss", "the drafter's training loss at its last step"),
            (
                "tau",
                "acceptance length: tokens of a draft block the target would accept, +1",
            ),
            ("lr", "learning rate now"),
            (
                "PROF",
                "phase profiling on/off (p); off: steps, tokens, loss still counted",
            ),
            (
                "GPU",
                "how GPU phases are timed (g): async host wall, events, sync",
            ),
            (
                "RUNNING",
                "training goes on; PAUSED: space paused it; FINISHED: it ended",
            ),
            (
                "FROZEN",
                "the display stands still (f); training goes on behind it",
            ),
            (
                "REPLAY",
                "a recording played back; the engine cannot be changed",
            ),
            (
                "dropped",
                "step records lost, telemetry channel full (+spans, +snaps missed)",
            ),
            (
                "prof",
                "28 ns/mark x 199/s: one phase mark's cost x marks a second",
            ),
            ("snap", "the hub's time to build the last snapshot"),
        ],
    ),
    (
        "verdict (header, timeline ▼ marks; held for the dwell before it changes)",
        &[
            ("balanced", "no stage waits on a queue for long: normal"),
            ("warming up", "too little running time to judge yet"),
            (
                "loader-bound",
                "targets wait on an empty batch queue: the loader is slowest",
            ),
            (
                "target-bound",
                "drafters wait on an empty HS queue: the targets are slowest",
            ),
            (
                "drafter-bound",
                "targets wait on a full HS queue: the drafters are slowest",
            ),
            (
                "stalled",
                "no step ended for several step times (a fault): says what hangs",
            ),
            (
                "queues only",
                "profiling off: judged from the queues' wait times alone",
            ),
            (
                "×3",
                "on the timeline: three changes too close to label, the last named",
            ),
        ],
    ),
    (
        "threads",
        &[
            ("cpu%", "CPU time of the OS thread; 100 is one core"),
            (
                "phase",
                "what the thread does now; state: working, or waiting on a queue",
            ),
            (
                "os",
                "kernel state: R running, S asleep, D in I/O, T stopped, Z exited, I idle",
            ),
            ("R1S3", "a group of threads: 1 running, 3 asleep"),
            (
                "↳ intra-op x2",
                "libtorch's pool threads of the worker above; helper, autograd",
            ),
            ("other", "threads of the process no worker owns"),
            (
                "step/s",
                "steps a second; ms/step: wall ms per step, in the window",
            ),
            (
                "rss, host",
                "this process's resident memory; the host's used/total",
            ),
            (
                "cuda",
                "a thread's kernel launches a step, ms in launch and sync calls (CUPTI)",
            ),
        ],
    ),
    (
        "phases (window 1s / 10s / run: w)",
        &[
            (
                "read, pack",
                "the loader reads documents and packs them into a batch",
            ),
            ("push_wait", "the loader waits on a full batch queue"),
            ("batch_wait", "a target waits on an empty batch queue"),
            ("h2d", "host-to-device copy of a batch"),
            ("forward", "a model's forward pass (target or drafter)"),
            (
                "HS, hs_pack",
                "hidden states: the target's layers the drafter learns from",
            ),
            ("hs_push_wait", "a target waits on a full HS queue"),
            ("hs_wait", "a drafter waits on an empty HS queue"),
            (
                "anchors",
                "the drafter picks the positions its blocks start at",
            ),
            ("loss, backward", "the drafter's loss and its gradients"),
            ("clip, optim", "gradient clipping; the AdamW step"),
            ("metrics", "accuracy and tau of the step"),
            ("grad_sync", "gradients averaged between drafters"),
            ("other", "wall time not covered by a phase"),
            (
                "+2",
                "two more phases than the line has room for (shown where it is wider)",
            ),
        ],
    ),
    (
        "critical path",
        &[
            ("busy", "a step's wall time less its waits on queues"),
            (
                "sets the step",
                "the stage whose busy time per thread is largest",
            ),
            (
                "to gain",
                "… before it limits: how much faster the critical stage can get",
            ),
            ("", "before the next slowest stage sets the step instead"),
        ],
    ),
    (
        "queues",
        &[
            (
                "depth",
                "items in it now / its capacity (min, max, mean over the window)",
            ),
            ("empty, full", "share of the window it was empty, full"),
            ("push, pop", "items put in, taken out a second"),
            (
                "age",
                "mean time an item waited in the queue before it was taken",
            ),
            (
                "▽ starve",
                "consumers wait on it empty (yellow: it holds up the run)",
            ),
            (
                "△ blocked",
                "producers wait on it full: the consumer side is slower",
            ),
        ],
    ),
    (
        "GPUs",
        &[
            ("util, mem bw", "SM busy share; memory-bandwidth busy share"),
            ("mem", "device memory used / total (this process's share)"),
            (
                "W, MHz, °C",
                "power draw, SM clock, temperature; throttle reasons",
            ),
            (
                "placement",
                "the split of targets and drafters the stage times call for",
            ),
        ],
    ),
    (
        "warnings",
        &[
            (
                "⚠ N error N warn",
                "warnings in force by severity (view 7 lists them)",
            ),
            (
                "starved, blocked",
                "a stage waited on an empty / full queue longer than set",
            ),
            (
                "queue_jitter",
                "a queue ran both empty and full within a window: too shallow",
            ),
            ("gpu_idle", "a GPU idle while work waits in a queue"),
            ("profiling_cost", "the profiler's own cost over its budget"),
            (
                "host_sync",
                "host syncs inside a step (a producer that counts them)",
            ),
        ],
    ),
];
