//! What a report run leaves besides its printed text, shared by both adapters.

/// What a report leaves besides its printed text: warnings for stderr, and the `gmon.sum` bytes when `-s`
/// is given.
pub struct Outcome {
    pub warnings: Vec<String>,
    pub summary: Option<Vec<u8>>,
}
