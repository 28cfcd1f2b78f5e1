//! What this kernel offers of the features in [`crate::kernel`], asked of the kernel
//! itself (a userfaultfd's feature bits, `/sys`). Apart from `kernel` so that the mask,
//! which `uffd` reads, does not depend on `uffd`.

/// The features this kernel offers, mask or not (0 for the userfaultfd ones when
/// userfaultfd cannot be opened). Opens a userfaultfd to ask: not for the fault path.
pub fn offered() -> u64 {
    offered_from(crate::uffd::Uffd::probe_features_unmasked().unwrap_or(0))
}

/// [`offered`] from feature bits already read from a userfaultfd (`Uffd::features`, which
/// leaves the masked ones out), without opening another one.
pub fn offered_from(uffd_features: u64) -> u64 {
    use crate::kernel::*;
    use crate::uffd::feature;
    let mut bits = 0;
    if uffd_features & feature::MOVE != 0 {
        bits |= MOVE;
    }
    if uffd_features & feature::POISON != 0 {
        bits |= POISON;
    }
    if uffd_features & feature::WP_ASYNC != 0 {
        // PAGEMAP_SCAN came with asynchronous write-protect (6.7), for it.
        bits |= WP_ASYNC | PAGEMAP_SCAN;
    }
    if std::path::Path::new("/sys/kernel/mm/mempolicy/weighted_interleave").is_dir() {
        bits |= WEIGHTED_INTERLEAVE;
    }
    if crate::pagemap::soft_dirty() {
        bits |= SOFT_DIRTY;
    }
    bits
}

/// The features the kernel offers that fail when used (a seccomp profile that refuses
/// their ioctl, a kernel whose feature bit promises more than it does), as
/// `(bit, errno)`: the engine masks them once at start and says so, rather than failing
/// every eviction. Tries `UFFDIO_MOVE` of one page into a registered scratch range and
/// `UFFDIO_POISON` of another; nothing when userfaultfd cannot be opened.
pub fn broken() -> Vec<(u64, crate::Errno)> {
    use crate::kernel::{masked, MOVE, POISON};
    use crate::uffd::{feature, mode, Uffd};
    let mut out = Vec::new();
    let Ok(u) = Uffd::open_exact(0) else {
        return out;
    };
    let want_move = u.has(feature::MOVE) && !masked(MOVE);
    let want_poison = u.has(feature::POISON) && !masked(POISON);
    if !want_move && !want_poison {
        return out;
    }
    let ps = crate::page_size();
    let Ok(src) = crate::mem::map_anon(ps, false) else {
        return out;
    };
    let Ok(dst) = crate::mem::map_anon(2 * ps, false) else {
        let _ = crate::mem::unmap(src, ps);
        return out;
    };
    // SAFETY: src is our own fresh private page, not managed memory.
    unsafe { crate::mem::zero_raw(src, ps) };
    if u.register(dst, 2 * ps, mode::MISSING).is_ok() {
        if want_move {
            if let Err(e) = u.move_pages(dst, src, ps, false, false) {
                out.push((MOVE, e));
            }
        }
        if want_poison {
            if let Err(e) = u.poison(dst + ps, ps) {
                out.push((POISON, e));
            }
        }
    }
    let _ = crate::mem::unmap(src, ps);
    let _ = crate::mem::unmap(dst, 2 * ps);
    out
}

/// Whether `uffd` can write-protect anonymous memory when asked (the fallback for a
/// missing `UFFDIO_MOVE` depends on it): a scratch page registered for write-protect
/// faults, placed, protected and released. The feature bit says the kernel has it; a
/// seccomp profile can still refuse the ioctl. Not for the fault path.
pub fn write_protect_works(uffd: &crate::uffd::Uffd) -> crate::SysResult<()> {
    use crate::uffd::mode;
    if !uffd.has_write_protect() {
        return Err(crate::Errno(libc::ENOTSUP));
    }
    let ps = crate::page_size();
    let page = crate::mem::map_anon(ps, false)?;
    let r = (|| {
        uffd.register(page, ps, mode::MISSING | mode::WP)?;
        uffd.zeropage(page, ps)?;
        uffd.writeprotect(page, ps, true)?;
        uffd.writeprotect(page, ps, false)
    })();
    let _ = crate::mem::unmap(page, ps);
    r
}
