//! Where reports go: a buffer that is flushed to a writer (normally stdout) in 64 KiB pieces, so a large
//! report never sits in memory whole. The first write error (for example a closed pipe) is kept and
//! later output is dropped.

use std::io;

/// The report being printed.
pub struct Out {
    buf: String,
    sink: Option<Box<dyn io::Write>>,
    error: Option<io::Error>,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Out")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

const CHUNK: usize = 1 << 16;

impl Out {
    /// Collect everything in memory (see [`Out::into_string`]).
    pub fn memory() -> Out {
        Out {
            buf: String::new(),
            sink: None,
            error: None,
        }
    }

    /// Stream to `sink`.
    pub fn to(sink: Box<dyn io::Write>) -> Out {
        Out {
            buf: String::with_capacity(CHUNK * 2),
            sink: Some(sink),
            error: None,
        }
    }

    pub fn push_str(&mut self, s: &str) {
        self.buf.push_str(s);
        if self.buf.len() >= CHUNK {
            self.drain();
        }
    }

    pub fn push(&mut self, c: char) {
        self.buf.push(c);
    }

    fn drain(&mut self) {
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        if self.error.is_none()
            && let Err(e) = sink.write_all(self.buf.as_bytes())
        {
            self.error = Some(e);
        }
        self.buf.clear();
    }

    /// Write out what is buffered and report the first error, if any.
    pub fn finish(mut self) -> io::Result<()> {
        self.drain();
        if let (None, Some(sink)) = (&self.error, self.sink.as_mut())
            && let Err(e) = sink.flush()
        {
            self.error = Some(e);
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The collected text of an in-memory `Out`.
    pub fn into_string(self) -> String {
        self.buf
    }
}

impl std::fmt::Write for Out {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push_str(s);
        Ok(())
    }
}
