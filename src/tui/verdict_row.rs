//! The timeline's verdict row, no terminal: the verdict in force at the left edge, then a mark
//! where it changed, laid out so that no label covers another. Changes too close together to
//! label apart become one mark, `▼×3 stalled`: three changes from that column on, the last one
//! to `stalled` (the text after a mark is always what is in force from there).

use super::lanes::TimeSpan;
use crate::telemetry::names::Names;
use crate::telemetry::verdict::Verdict;

/// One mark's label on the row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// Column of its first character.
    pub start: usize,
    /// `▼text`, or `text▼` where the mark is too near the right edge for the text to follow.
    pub text: String,
    /// Some change it stands for is to a verdict other than `balanced`.
    pub alert: bool,
    /// Some change it stands for is to `stalled` (a fault: red whatever came after).
    pub fault: bool,
    /// The verdict in force after it.
    pub verdict: Verdict,
}

#[cfg(test)]
impl Label {
    /// The first column after it.
    fn end(&self) -> usize {
        self.start + self.text.chars().count()
    }
}

/// What the row shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerdictRow<'a> {
    /// The verdict in force at the left edge, where the first mark leaves room for it.
    pub at_left: Option<&'a str>,
    pub marks: Vec<Label>,
}

/// A run of changes shown as one mark: its first and last columns, how many, and the last one.
#[derive(Clone, Copy)]
struct Run {
    first: usize,
    last: usize,
    changes: usize,
    verdict: Verdict,
    alert: bool,
    fault: bool,
}

impl Run {
    /// Columns its label takes on `cols` columns, `[start, end)`, without building the text:
    /// from its first change on, or ending at its last where the text would not fit before the
    /// right edge.
    fn extent(&self, cols: usize, names: &Names) -> (usize, usize) {
        let count = match self.changes {
            1 => 0,
            n => 2 + n.to_string().len(), // "×n "
        };
        let len = 1 + count + names.verdict_short(self.verdict).chars().count();
        if self.at_start(len, cols) {
            (self.first, self.first + len)
        } else {
            let start = (self.last + 1).saturating_sub(len);
            (start, start + len)
        }
    }

    fn at_start(&self, len: usize, cols: usize) -> bool {
        self.first + len <= cols
    }

    /// Its label on `cols` columns (at `extent`).
    fn label(&self, cols: usize, names: &Names) -> Label {
        let short = names.verdict_short(self.verdict);
        let what = match self.changes {
            1 => short.to_string(),
            n => format!("×{n} {short}"),
        };
        let (start, _) = self.extent(cols, names);
        let text = if self.at_start(what.chars().count() + 1, cols) {
            format!("▼{what}")
        } else {
            format!("{what}▼")
        };
        Label {
            start,
            text,
            alert: self.alert,
            fault: self.fault,
            verdict: self.verdict,
        }
    }

    fn then(self, later: Run) -> Run {
        Run {
            first: self.first,
            last: later.last,
            changes: self.changes + later.changes,
            verdict: later.verdict,
            alert: self.alert || later.alert,
            fault: self.fault || later.fault,
        }
    }
}

/// The row for `changes` ((hub clock ns, new verdict), oldest first) over `span` in `cols`
/// columns. A mark whose label would touch the one before it (no blank column between) merges
/// with it. Verdicts are said in the words of `names`.
pub fn verdict_row<'a, 'n>(
    changes: impl IntoIterator<Item = &'a (u64, Verdict)> + Clone,
    span: TimeSpan,
    cols: usize,
    names: &'n Names,
) -> VerdictRow<'n> {
    let left = span.left_ns();
    let at_left = changes
        .clone()
        .into_iter()
        .take_while(|(t, _)| *t <= left)
        .last()
        .map(|(_, v)| names.verdict_short(*v));
    let mut runs: Vec<Run> = Vec::new();
    for &(t, verdict) in changes {
        // A change in the newest snapshot is at the right edge itself.
        let t = if t == span.right_ns {
            t.saturating_sub(1)
        } else {
            t
        };
        let Some(col) = span.column(t, cols) else {
            continue;
        };
        let mut run = Run {
            first: col,
            last: col,
            changes: 1,
            verdict,
            alert: verdict != Verdict::Balanced,
            fault: verdict == Verdict::Stalled,
        };
        while let Some(prev) = runs.last() {
            if run.extent(cols, names).0 > prev.extent(cols, names).1 {
                break;
            }
            run = prev.then(run);
            runs.pop();
        }
        runs.push(run);
    }
    let marks: Vec<Label> = runs.iter().map(|r| r.label(cols, names)).collect();
    let room = marks.first().map(|m| m.start).unwrap_or(cols);
    VerdictRow {
        at_left: at_left.filter(|v| v.chars().count() < room),
        marks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// 10 s ending at 100 s, in 100 columns of 100 ms.
    const SPAN: TimeSpan = TimeSpan {
        right_ns: 100_000 * MS,
        width_ns: 10_000 * MS,
    };

    fn at(ms_before_right: u64, v: Verdict) -> (u64, Verdict) {
        (SPAN.right_ns - ms_before_right * MS, v)
    }

    /// The row as the terminal would show it.
    fn drawn(row: &VerdictRow, cols: usize) -> String {
        let mut line = vec![' '; cols];
        let mut put = |start: usize, text: &str| {
            for (i, ch) in text.chars().enumerate() {
                if let Some(c) = line.get_mut(start + i) {
                    *c = ch;
                }
            }
        };
        if let Some(v) = row.at_left {
            put(0, v);
        }
        for m in &row.marks {
            put(m.start, &m.text);
        }
        line.into_iter().collect::<String>().trim_end().to_string()
    }

    fn no_overlap(row: &VerdictRow) {
        for w in row.marks.windows(2) {
            assert!(w[0].end() < w[1].start, "{:?} touches {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn marks_far_apart_each_name_their_verdict() {
        let changes = [at(8_000, Verdict::Balanced), at(3_000, Verdict::Stalled)];
        let names = Names::builtin();
        let row = verdict_row(&changes, SPAN, 100, &names);
        assert_eq!(row.marks.len(), 2);
        assert_eq!(row.marks[0].text, "▼balanced");
        assert_eq!(row.marks[0].start, 20);
        assert!(!row.marks[0].alert);
        assert_eq!(row.marks[1].text, "▼stalled");
        assert!(row.marks[1].alert);
    }

    #[test]
    fn close_marks_merge_into_one_that_counts_them_and_ends_in_force() {
        // Balanced, target-bound and stalled within 200 ms (adjacent columns), then balanced
        // again 5 s later: three readable words, not three labels written over each other.
        let changes = [
            at(8_000, Verdict::Balanced),
            at(7_900, Verdict::TargetBound),
            at(7_800, Verdict::Stalled),
            at(3_000, Verdict::Balanced),
        ];
        let names = Names::builtin();
        let row = verdict_row(&changes, SPAN, 100, &names);
        no_overlap(&row);
        assert_eq!(
            drawn(&row, 100).trim_start(),
            "▼×3 stalled".to_string() + &" ".repeat(39) + "▼balanced"
        );
        // The merged mark starts where the first change was, and is an alert though the
        // first change was to balanced.
        assert_eq!(row.marks[0].start, 20);
        assert!(row.marks[0].alert);
        // Changes in one and the same column merge too.
        let same = [at(5_000, Verdict::Paused), at(4_999, Verdict::Balanced)];
        let names = Names::builtin();
        let row = verdict_row(&same, SPAN, 100, &names);
        assert_eq!(row.marks.len(), 1);
        assert_eq!(row.marks[0].text, "▼×2 balanced");
    }

    #[test]
    fn near_the_right_edge_the_text_goes_before_the_mark_and_still_merges() {
        // Alone at the right edge: the text before the mark.
        let names = Names::builtin();
        let row = verdict_row(&[at(0, Verdict::Stalled)], SPAN, 100, &names);
        assert_eq!(row.marks.len(), 1);
        assert_eq!(row.marks[0].text, "stalled▼");
        assert_eq!(row.marks[0].end(), 100);
        // Two changes in the last columns: one mark, its text ending at the last of them.
        let changes = [at(400, Verdict::Balanced), at(0, Verdict::TargetBound)];
        let names = Names::builtin();
        let row = verdict_row(&changes, SPAN, 100, &names);
        assert_eq!(row.marks.len(), 1, "{row:?}");
        assert_eq!(row.marks[0].text, "×2 target-bound▼");
        assert_eq!(row.marks[0].end(), 100);
        // One that would run into the mark before it merges with it, from the earlier column.
        let changes = [at(1_500, Verdict::DrafterBound), at(0, Verdict::Stalled)];
        let names = Names::builtin();
        let row = verdict_row(&changes, SPAN, 100, &names);
        assert_eq!(row.marks.len(), 1, "{row:?}");
        assert_eq!(
            (row.marks[0].start, row.marks[0].text.as_str()),
            (85, "▼×2 stalled")
        );
    }

    #[test]
    fn the_verdict_at_the_left_edge_gives_way_to_a_mark_next_to_it() {
        let changes = [
            at(12_000, Verdict::TargetBound),
            at(5_000, Verdict::Balanced),
        ];
        let names = Names::builtin();
        let row = verdict_row(&changes, SPAN, 100, &names);
        assert_eq!(row.at_left, Some("target-bound"));
        let changes = [
            at(12_000, Verdict::TargetBound),
            at(9_500, Verdict::Balanced),
        ];
        let names = Names::builtin();
        let row = verdict_row(&changes, SPAN, 100, &names);
        assert_eq!(row.at_left, None, "{}", drawn(&row, 100));
        assert_eq!(drawn(&row, 100).trim_start(), "▼balanced");
    }
}
