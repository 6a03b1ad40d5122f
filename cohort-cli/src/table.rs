//! Aligned text tables, for listings a person reads: a header row, then one line per row, each
//! column as wide as its widest cell, columns two spaces apart, no blanks at the end of a line.
//!
//! A table is a list of [`Column`] definitions (a header, an alignment, a function that gives a
//! row's cell), so adding a column is adding one entry. `cohort-status`'s run listing and
//! `cohort-spawn --list-agents` / `--list-chains` print through [`Table::render`]. Widths count
//! characters (`chars()`), not terminal cells.

use std::borrow::Cow;

/// Where a cell sits in its column when it is narrower than the column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text first, blanks after (the last column gets no blanks after it).
    Left,
    /// Blanks first, text after: for numbers that should line up.
    Right,
}

/// One column of a [`Table`] over rows of type `R`.
pub struct Column<R> {
    /// The header, printed as given.
    pub header: &'static str,
    /// Where narrower cells sit.
    pub align: Align,
    /// The cell of a row, as text.
    pub cell: fn(&R) -> String,
    /// With colour on ([`Table::render`]), the SGR parameters a body cell is painted with,
    /// chosen by its text (`"31"` red, `"2"` dim, …); the column's width ignores them.
    pub colour: Option<fn(&str) -> &'static str>,
}

impl<R> Column<R> {
    /// A left-aligned, uncoloured column.
    pub const fn new(header: &'static str, cell: fn(&R) -> String) -> Column<R> {
        Column {
            header,
            align: Align::Left,
            cell,
            colour: None,
        }
    }

    /// The same column, right-aligned.
    pub const fn right(self) -> Column<R> {
        Column {
            align: Align::Right,
            ..self
        }
    }

    /// The same column, its body cells painted with the SGR parameters `sgr` gives for their
    /// text when the table is rendered with colour.
    pub const fn coloured(self, sgr: fn(&str) -> &'static str) -> Column<R> {
        Column {
            colour: Some(sgr),
            ..self
        }
    }
}

/// What the body of a table holds, which decides whether it is escaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellText {
    /// Text shown as given.
    AsGiven,
    /// Text that came from a run (a directory name, a label, a task, an error): every cell and
    /// note is shown through [`crate::text::untrusted`], so it can neither drive the terminal
    /// nor split a row. Headers are the program's own and are not escaped.
    Untrusted,
}

impl CellText {
    fn shown(self, s: String) -> String {
        match self {
            CellText::AsGiven => s,
            CellText::Untrusted => match crate::text::untrusted(&s) {
                Cow::Owned(e) => e,
                Cow::Borrowed(_) => s,
            },
        }
    }
}

/// A table: its columns, what its cells hold, and optionally the notes a row has printed on
/// indented lines below it.
pub struct Table<'c, R> {
    columns: &'c [Column<R>],
    text: CellText,
    notes: Option<fn(&R) -> Vec<String>>,
}

impl<'c, R> Table<'c, R> {
    /// A table of `columns` whose cells hold `text`, without notes.
    pub fn new(columns: &'c [Column<R>], text: CellText) -> Table<'c, R> {
        Table {
            columns,
            text,
            notes: None,
        }
    }

    /// The same table, each row followed by the lines `notes` gives for it, indented by four
    /// blanks (a problem, ignored keys, …).
    pub fn with_notes(self, notes: fn(&R) -> Vec<String>) -> Table<'c, R> {
        Table {
            notes: Some(notes),
            ..self
        }
    }

    /// The table as text (pure): the header line, then each row's line and its notes, every
    /// line ending in `\n`. `colour` paints the cells of the columns that have a
    /// [`Column::colour`] (the caller decides: a terminal, `NO_COLOR` unset).
    pub fn render(&self, rows: &[R], colour: bool) -> String {
        let body: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                self.columns
                    .iter()
                    .map(|c| self.text.shown((c.cell)(r)))
                    .collect()
            })
            .collect();
        let mut widths: Vec<usize> = self
            .columns
            .iter()
            .map(|c| c.header.chars().count())
            .collect();
        for cells in &body {
            for (w, c) in widths.iter_mut().zip(cells) {
                *w = (*w).max(c.chars().count());
            }
        }
        let headers: Vec<&str> = self.columns.iter().map(|c| c.header).collect();
        let mut out = self.line(&headers, &widths, false);
        for (row, cells) in rows.iter().zip(&body) {
            out.push_str(&self.line(cells, &widths, colour));
            for note in self.notes.map(|n| n(row)).unwrap_or_default() {
                out.push_str(&format!("    {}\n", self.text.shown(note)));
            }
        }
        out
    }

    /// One line of cells padded to `widths`, trailing blanks dropped.
    fn line(&self, cells: &[impl AsRef<str>], widths: &[usize], colour: bool) -> String {
        let mut line = String::new();
        let last = self.columns.len().saturating_sub(1);
        for (i, ((cell, col), width)) in cells.iter().zip(self.columns).zip(widths).enumerate() {
            let cell = cell.as_ref();
            let pad = " ".repeat(width - cell.chars().count());
            if col.align == Align::Right {
                line.push_str(&pad);
            }
            match col.colour.filter(|_| colour) {
                Some(sgr) => line.push_str(&format!("\x1b[{}m{cell}\x1b[0m", sgr(cell))),
                None => line.push_str(cell),
            }
            if i < last {
                if col.align == Align::Left {
                    line.push_str(&pad);
                }
                line.push_str("  ");
            }
        }
        line.truncate(line.trim_end().len());
        line.push('\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Item {
        name: &'static str,
        count: usize,
        notes: Vec<String>,
    }

    const COLUMNS: [Column<Item>; 3] = [
        Column::new("NAME", |i| i.name.to_string()),
        Column::new("N", |i: &Item| i.count.to_string()).right(),
        Column::new("STATE", |i: &Item| {
            if i.count > 1 {
                "many".into()
            } else {
                "".into()
            }
        })
        .coloured(|s| if s == "many" { "31" } else { "2" }),
    ];

    fn item(name: &'static str, count: usize, notes: &[&str]) -> Item {
        Item {
            name,
            count,
            notes: notes.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn listings_render_notes_under_their_row() {
        const FIVE: [Column<[&str; 5]>; 5] = [
            Column::new("A", |r| r[0].into()),
            Column::new("B", |r| r[1].into()),
            Column::new("C", |r| r[2].into()),
            Column::new("D", |r| r[3].into()),
            Column::new("E", |r| r[4].into()),
        ];
        let t = Table::new(&FIVE, CellText::AsGiven)
            .with_notes(|_| vec!["problem: bad".into()])
            .render(&[["x", "yy", "-", "p", "d"]], false);
        assert_eq!(t, "A  B   C  D  E\nx  yy  -  p  d\n    problem: bad\n");
    }

    #[test]
    fn columns_align_and_lines_end_without_blanks() {
        let rows = [item("a", 12, &[]), item("long-name", 1, &[])];
        let t = Table::new(&COLUMNS, CellText::AsGiven).render(&rows, false);
        assert_eq!(
            t,
            "NAME        N  STATE\na          12  many\nlong-name   1\n"
        );
    }

    #[test]
    fn colour_paints_body_cells_only_and_keeps_widths() {
        let rows = [item("a", 2, &[])];
        let t = Table::new(&COLUMNS, CellText::AsGiven).render(&rows, true);
        assert_eq!(t, "NAME  N  STATE\na     2  \x1b[31mmany\x1b[0m\n");
    }

    #[test]
    fn untrusted_cells_and_notes_are_escaped_before_they_are_measured() {
        let rows = [item("a\x1b[2J", 1, &["bad\nnote"])];
        let t = Table::new(&COLUMNS, CellText::Untrusted)
            .with_notes(|i| i.notes.clone())
            .render(&rows, false);
        assert_eq!(t, "NAME      N  STATE\na\\x1b[2J  1\n    bad\\nnote\n");
    }
}
