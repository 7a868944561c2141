//! The project's address vocabulary: a runtime address (what the running process sees), a link-time address
//! (what the module's ELF file states, and what every profile file records) and the load bias between them.
//!
//! Files never hold runtime addresses (SPEC.md §2: ASLR must not matter), so the one step that turns a
//! runtime address into a link-time one is [`LoadBias::link_address`], and the way back is
//! [`LoadBias::runtime_address`]. Arithmetic wraps: a bias can be "negative" (a prelinked module loaded below
//! its link address).

use core::fmt;

/// An address in the running process, not yet relative to any module (a PC, a segment start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuntimeAddress(pub u64);

/// An address of a module as its ELF file states it: runtime address − load bias. The addresses in profile
/// files, symbol tables and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkAddress(pub u64);

/// How far one load instance of a module sits from its link-time addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LoadBias(pub u64);

impl LoadBias {
    /// The module-relative (link-time) address of `address`, a runtime address inside this load instance.
    #[inline]
    pub const fn link_address(self, address: RuntimeAddress) -> LinkAddress {
        LinkAddress(address.0.wrapping_sub(self.0))
    }

    /// Where the link-time `address` of this load instance is in the running process.
    #[inline]
    pub const fn runtime_address(self, address: LinkAddress) -> RuntimeAddress {
        RuntimeAddress(address.0.wrapping_add(self.0))
    }
}

impl RuntimeAddress {
    /// The address of a pointer-sized value in this process (a PC, a segment start).
    #[inline]
    pub const fn from_usize(address: usize) -> RuntimeAddress {
        RuntimeAddress(address as u64)
    }

    /// As a pointer-sized value (exact: runtime addresses come from this process).
    #[inline]
    pub const fn as_usize(self) -> usize {
        self.0 as usize
    }
}

impl LinkAddress {
    /// `self + bytes`, wrapping (a table's last symbol may reach the top of the address space).
    #[inline]
    pub const fn wrapping_add(self, bytes: u64) -> LinkAddress {
        LinkAddress(self.0.wrapping_add(bytes))
    }

    /// `self - bytes`, wrapping.
    #[inline]
    pub const fn wrapping_sub(self, bytes: u64) -> LinkAddress {
        LinkAddress(self.0.wrapping_sub(bytes))
    }

    /// Bytes from `base` up to `self`, wrapping.
    #[inline]
    pub const fn offset_from(self, base: LinkAddress) -> u64 {
        self.0.wrapping_sub(base.0)
    }
}

/// A link-time address plus a byte offset is a link-time address of the same module.
impl core::ops::Add<u64> for LinkAddress {
    type Output = LinkAddress;
    #[inline]
    fn add(self, bytes: u64) -> LinkAddress {
        LinkAddress(self.0 + bytes)
    }
}

/// A link-time address minus a byte offset is a link-time address of the same module.
impl core::ops::Sub<u64> for LinkAddress {
    type Output = LinkAddress;
    #[inline]
    fn sub(self, bytes: u64) -> LinkAddress {
        LinkAddress(self.0 - bytes)
    }
}

/// The distance in bytes between two link-time addresses of one module.
impl core::ops::Sub<LinkAddress> for LinkAddress {
    type Output = u64;
    #[inline]
    fn sub(self, base: LinkAddress) -> u64 {
        self.0 - base.0
    }
}

impl fmt::LowerHex for LinkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl fmt::LowerHex for RuntimeAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_and_runtime_addresses_convert_both_ways_and_wrap() {
        let bias = LoadBias(0x5555_0000_0000);
        let link = LinkAddress(0x1234);
        let runtime = bias.runtime_address(link);
        assert_eq!(runtime, RuntimeAddress(0x5555_0000_1234));
        assert_eq!(bias.link_address(runtime), link);
        // A module loaded below its link address.
        let below = LoadBias(0u64.wrapping_sub(0x1000));
        assert_eq!(
            below.runtime_address(LinkAddress(0x40_1000)),
            RuntimeAddress(0x40_0000)
        );
        assert_eq!(
            below.link_address(RuntimeAddress(0x40_0000)),
            LinkAddress(0x40_1000)
        );
    }

    #[test]
    fn link_addresses_take_byte_offsets_and_give_distances() {
        let a = LinkAddress(0x1000);
        assert_eq!(a + 0x10, LinkAddress(0x1010));
        assert_eq!(a - 0x10, LinkAddress(0xff0));
        assert_eq!(LinkAddress(0x1010) - a, 0x10);
        assert_eq!(a.offset_from(LinkAddress(0x1010)), 0u64.wrapping_sub(0x10));
        assert_eq!(LinkAddress(u64::MAX).wrapping_add(1), LinkAddress(0));
        assert_eq!(LinkAddress(0).wrapping_sub(1), LinkAddress(u64::MAX));
    }
}
