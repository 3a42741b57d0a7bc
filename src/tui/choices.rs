//! What a viewer chooses between: the views, the time windows, the threads' sort order and the
//! timeline's zoom steps.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Overview,
    Threads,
    Phases,
    Queues,
    Charts,
    Timeline,
    Warnings,
}

impl View {
    pub const ALL: [View; 7] = [
        View::Overview,
        View::Threads,
        View::Phases,
        View::Queues,
        View::Charts,
        View::Timeline,
        View::Warnings,
    ];

    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "1 overview",
            View::Threads => "2 threads",
            View::Phases => "3 phases",
            View::Queues => "4 queues+gpu",
            View::Charts => "5 charts",
            View::Timeline => "6 timeline",
            View::Warnings => "7 warnings",
        }
    }

    pub(crate) fn index(self) -> usize {
        View::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }
}

/// Which rolling window the phase bars show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    OneSecond,
    TenSeconds,
    Run,
}

impl Window {
    pub fn name(self) -> &'static str {
        match self {
            Window::OneSecond => "1s",
            Window::TenSeconds => "10s",
            Window::Run => "run",
        }
    }
}

/// The order of the threads in the threads view and the timeline's lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// As the pipeline registers them: loader, targets, drafters.
    Pipeline,
    /// Busiest CPU first.
    Cpu,
    /// Waiting first, then working, then exited.
    State,
    /// Slowest step first.
    MsPerStep,
    Name,
}

impl Sort {
    pub fn name(self) -> &'static str {
        match self {
            Sort::Pipeline => "pipeline",
            Sort::Cpu => "cpu",
            Sort::State => "state",
            Sort::MsPerStep => "ms/step",
            Sort::Name => "name",
        }
    }

    pub fn next(self) -> Sort {
        match self {
            Sort::Pipeline => Sort::Cpu,
            Sort::Cpu => Sort::State,
            Sort::State => Sort::MsPerStep,
            Sort::MsPerStep => Sort::Name,
            Sort::Name => Sort::Pipeline,
        }
    }
}

/// The timeline's widths, seconds: `+` zooms in, `-` out.
pub const ZOOMS_S: [f64; 6] = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0];
