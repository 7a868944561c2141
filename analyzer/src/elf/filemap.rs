//! `-R map_file`: the nm-style map from functions to object files (`file.o:address T name` lines, as
//! `nm -A` prints them) and the suggested link order of those files (gprof's `read_function_mappings`
//! and `cg_print_file_ordering`).

use std::path::Path;

use crate::elf::symtab::FunctionSymbol;

/// One map line: an object file and a function defined in it.
#[derive(Clone, Debug)]
struct Entry {
    file: String,
    function: String,
    /// The first line of its file in the map.
    is_first: bool,
}

/// Why a map file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    #[error("could not open: {0}")]
    Open(std::io::Error),
    #[error("unable to parse mapping file")]
    Syntax,
}

/// The map, sorted by function name as gprof sorts it.
#[derive(Clone, Debug, Default)]
pub struct FileMap {
    entries: Vec<Entry>,
}

impl FileMap {
    /// Read a map file; errors name no file (the caller does).
    pub fn read(path: &Path) -> Result<FileMap, MapError> {
        let bytes = std::fs::read(path).map_err(MapError::Open)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut entries: Vec<Entry> = Vec::new();
        for line in text.split('\n').filter(|l| !l.trim().is_empty()) {
            let line = line.trim_start();
            let (file, rest) = match line.find(':') {
                Some(i) => (&line[..i], &line[i..]),
                None if line.starts_with("No symbols in ") => continue,
                None => return Err(MapError::Syntax),
            };
            if file.starts_with("No symbols in ") {
                continue;
            }
            let function = rest.rsplit(' ').next().unwrap_or(rest);
            let is_first = entries.last().is_none_or(|e| e.file != file);
            entries.push(Entry {
                file: file.to_string(),
                function: function.to_string(),
                is_first,
            });
        }
        crate::qsort::msort_by(&mut entries, &mut |l: &Entry, r: &Entry| {
            l.function.as_bytes().cmp(r.function.as_bytes())
        });
        Ok(FileMap { entries })
    }

    /// glibc's `bsearch` for `name`.
    fn find(&self, name: &str) -> Option<&Entry> {
        let (mut l, mut u) = (0usize, self.entries.len());
        while l < u {
            let i = (l + u) / 2;
            match name.as_bytes().cmp(self.entries[i].function.as_bytes()) {
                std::cmp::Ordering::Less => u = i,
                std::cmp::Ordering::Greater => l = i + 1,
                std::cmp::Ordering::Equal => return Some(&self.entries[i]),
            }
        }
        None
    }

    /// gprof's symbol creation under `-R`: a function of the map stands for its file when it is the
    /// file's first, and is left out otherwise.
    pub fn apply(&self, syms: Vec<FunctionSymbol>) -> Vec<FunctionSymbol> {
        syms.into_iter()
            .filter_map(|mut s| match self.find(&s.name) {
                Some(e) if !e.is_first => None,
                Some(e) => {
                    s.name = e.file.clone();
                    s.mapped = true;
                    Some(s)
                }
                None => Some(s),
            })
            .collect()
    }

    /// The map's files by name (gprof's second sort), each once.
    pub fn files(&self) -> Vec<&str> {
        let mut by_file: Vec<&Entry> = self.entries.iter().collect();
        crate::qsort::msort(&mut by_file, &mut |l: &&Entry, r: &&Entry| {
            l.file.as_bytes().cmp(r.file.as_bytes())
        });
        let mut out: Vec<&str> = Vec::new();
        for e in by_file {
            if out.last() != Some(&e.file.as_str()) {
                out.push(&e.file);
            }
        }
        out
    }
}
