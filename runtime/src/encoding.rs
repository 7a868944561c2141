//! Encoding of the profile file: delegates to the format-spec crate's writer.

use mslprof_format::model::Profile;

/// Writes `profile` in the mslprof format (SPEC.md).
pub fn write_profile(profile: &Profile, w: &mut dyn std::io::Write) -> std::io::Result<()> {
    mslprof_format::write(profile, w)
}
