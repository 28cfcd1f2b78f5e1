//! What this kernel offers of the features in [`crate::kernel`], asked of the kernel
//! itself (a userfaultfd's feature bits, `/sys`). Apart from `kernel` so that the mask,
//! which `uffd` reads, does not depend on `uffd`.

/// The features this kernel offers, mask or not (0 for the userfaultfd ones when
/// userfaultfd cannot be opened). Asks the kernel: not for the fault path.
pub fn offered() -> u64 {
    use crate::kernel::*;
    use crate::uffd::{feature, Uffd};
    let uffd = Uffd::probe_features_unmasked().unwrap_or(0);
    let mut bits = 0;
    if uffd & feature::MOVE != 0 {
        bits |= MOVE;
    }
    if uffd & feature::POISON != 0 {
        bits |= POISON;
    }
    if uffd & feature::WP_ASYNC != 0 {
        // PAGEMAP_SCAN came with asynchronous write-protect (6.7), for it.
        bits |= WP_ASYNC | PAGEMAP_SCAN;
    }
    if std::path::Path::new("/sys/kernel/mm/mempolicy/weighted_interleave").is_dir() {
        bits |= WEIGHTED_INTERLEAVE;
    }
    bits
}

/// The features in use: offered by the kernel and not masked.
pub fn in_use() -> u64 {
    offered() & !crate::kernel::mask()
}
