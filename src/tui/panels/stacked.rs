//! A stacked history: one column per slice of time, its height split among the phases by their
//! share of that slice (the role's first phase at the bottom). Empty slices stay blank.

use super::super::theme::Theme;
use crate::telemetry::{Phase, N_PHASES};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

/// Splits `n` cells among `values` by share (largest remainder); all zero gives none.
pub fn split(values: &[u64], n: usize) -> Vec<usize> {
    let total: u64 = values.iter().sum();
    if total == 0 {
        return vec![0; values.len()];
    }
    let exact: Vec<f64> = values
        .iter()
        .map(|v| *v as f64 / total as f64 * n as f64)
        .collect();
    let mut cells: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut left = n.saturating_sub(cells.iter().sum());
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for i in order {
        if left == 0 {
            break;
        }
        if exact[i] > 0.0 {
            cells[i] += 1;
            left -= 1;
        }
    }
    cells
}

/// Cells a slice is wide: slices of a few steps each show shares, not single phases.
pub const SLICE_W: u16 = 4;

/// How many slices fit `width`.
pub fn slices(width: u16) -> usize {
    (width / SLICE_W).max(1) as usize
}

/// Draws `columns` (phase ns per slice, `SLICE_W` cells each) into `area`.
pub fn draw(
    buf: &mut Buffer,
    area: Rect,
    columns: &[[u64; N_PHASES]],
    phases: &[Phase],
    theme: Theme,
) {
    let h = area.height as usize;
    for (i, col) in columns.iter().enumerate() {
        let values: Vec<u64> = phases.iter().map(|p| col[p.index()]).collect();
        let mut y = area.y + area.height;
        for (p, n) in phases.iter().zip(split(&values, h)) {
            let (ch, style) = theme.phase_cell(*p);
            for _ in 0..n {
                y -= 1;
                for dx in 0..SLICE_W {
                    let x = i as u16 * SLICE_W + dx;
                    if x < area.width {
                        buf[(area.x + x, y)].set_char(ch).set_style(style);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_fills_exactly() {
        assert_eq!(split(&[50, 25, 25], 4), vec![2, 1, 1]);
        assert_eq!(split(&[1, 1, 1], 4).iter().sum::<usize>(), 4);
        assert_eq!(split(&[0, 0], 3), vec![0, 0]);
    }
}
