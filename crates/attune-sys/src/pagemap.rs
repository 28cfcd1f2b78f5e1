//! Which pages were written: asynchronous userfaultfd write-protection read back with
//! `PAGEMAP_SCAN` (Linux 6.7+).
//!
//! A range registered in write-protect mode on a userfaultfd opened with
//! `UFFD_FEATURE_WP_ASYNC` can be write-protected ("armed") without anyone waiting on the
//! descriptor: the first write to an armed page is resolved by the kernel itself (the
//! page's protection is dropped, no message, the writer goes on). `PAGEMAP_SCAN` on
//! `/proc/self/pagemap` then lists the pages whose protection is gone. A present page that
//! was never armed is listed too (it was never protected), so only armed pages tell
//! anything. This is the dirty-bit tracking CRIU and Windows' GetWriteWatch emulation use.
//!
//! Cost: the first write to an armed page is an in-kernel fault (about 0.9 µs on this
//! machine, `cargo run --release -p attune-sys --example write_heat_cost`); arming and
//! scanning are page-table walks. Reads are not seen. System calls that write into a
//! tracked range work (the kernel resolves the protection for them too).
//!
//! Contract: the tracker's registrations do not survive `fork` in the child (no
//! `UFFD_FEATURE_EVENT_FORK`); a scan there fails with `EPERM` (`PM_SCAN_CHECK_WPASYNC`)
//! instead of reporting wrongly. The child's copy of the descriptor still names the
//! parent's address space (a userfaultfd acts on the memory of the process that opened
//! it), so in any process but the one that opened it every call fails with `EPERM`
//! before reaching the kernel: a child never registers or protects its parent's pages.

use crate::uffd::{feature, mode, Uffd};
use crate::{Errno, SysResult};

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | (0x66 << 8) | 16;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// Regions returned per ioctl (a scan loops while the walk stops early).
const VEC: usize = 256;

/// A userfaultfd in asynchronous write-protect mode and the scans that read it.
pub struct WriteTracker {
    uffd: Uffd,
    /// The process that opened it (whose address space the descriptor acts on).
    owner: u32,
}

impl WriteTracker {
    /// None when the kernel has no asynchronous write-protection (before 6.7) or
    /// userfaultfd cannot be opened; the caller goes on without write heat.
    pub fn open() -> Result<WriteTracker, Errno> {
        // Masked (`crate::kernel`): as on a kernel without it.
        if crate::kernel::masked(crate::kernel::PAGEMAP_SCAN) {
            return Err(Errno(libc::ENOTSUP));
        }
        let uffd =
            Uffd::open_exact(feature::WP_ASYNC | feature::WP_UNPOPULATED).map_err(|e| e.errno)?;
        if uffd.features() & feature::WP_ASYNC == 0 {
            return Err(Errno(libc::ENOTSUP));
        }
        Ok(WriteTracker {
            uffd,
            owner: std::process::id(),
        })
    }

    /// Makes `[start, start+len)` trackable (page-aligned, anonymous or shmem, not
    /// registered with another userfaultfd). Nothing is armed yet.
    pub fn track(&self, start: usize, len: usize) -> SysResult<()> {
        self.in_owner()?;
        self.uffd.register(start, len, mode::WP)
    }

    /// Arms `[start, start+len)` (inside a tracked range): its next writes are seen.
    pub fn arm(&self, start: usize, len: usize) -> SysResult<()> {
        self.in_owner()?;
        self.uffd.writeprotect(start, len, true)
    }

    /// `EPERM` in a forked child: the descriptor acts on the parent's address space.
    fn in_owner(&self) -> SysResult<()> {
        if std::process::id() == self.owner {
            Ok(())
        } else {
            Err(Errno(libc::EPERM))
        }
    }

    /// Appends to `out` the page ranges of `[start, start+len)` that are present and not
    /// protected: for armed pages, written since they were armed. Protects nothing.
    /// `EPERM`: the range is not (or no longer) tracked.
    pub fn written(
        &self,
        start: usize,
        len: usize,
        out: &mut Vec<(usize, usize)>,
    ) -> SysResult<()> {
        self.in_owner()?;
        // A pagemap descriptor is bound to the address space of the process that opened
        // it, which a forked child is not: `pagemap_fd` opens one per process.
        let fd = crate::mem::pagemap_fd()?;
        let mut vec = [PageRegion::default(); VEC];
        let end = (start + len) as u64;
        let mut at = start as u64;
        while at < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: PM_SCAN_CHECK_WPASYNC,
                start: at,
                end,
                vec: vec.as_mut_ptr() as u64,
                vec_len: VEC as u64,
                category_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
                ..Default::default()
            };
            // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most vec_len regions to vec
            // and walk_end to arg; both live for the call.
            let n = unsafe { libc::ioctl(fd, PAGEMAP_SCAN as _, &mut arg) };
            if n < 0 {
                return Err(Errno::last());
            }
            out.extend(
                vec[..n as usize]
                    .iter()
                    .map(|r| (r.start as usize, (r.end - r.start) as usize)),
            );
            if arg.walk_end <= at {
                break;
            }
            at = arg.walk_end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `[base, base+len)` listed as written, as page indices.
    fn written(t: &WriteTracker, base: usize, len: usize) -> Vec<usize> {
        let mut out = Vec::new();
        t.written(base, len, &mut out).unwrap();
        out.iter()
            .flat_map(|&(a, l)| (a..a + l).step_by(4096).map(move |p| (p - base) / 4096))
            .collect()
    }

    #[test]
    fn armed_pages_report_writes() {
        let Ok(t) = WriteTracker::open() else {
            eprintln!("no asynchronous write-protection here; skipped");
            return;
        };
        let len = 64 * 4096;
        let base = crate::mem::map_anon(len, false).unwrap();
        let _ = crate::mem::advise(base, len, crate::mem::MADV_NOHUGEPAGE);
        let poke = |page: usize, v: u8| {
            // SAFETY: inside the mapping above.
            unsafe { ((base + page * 4096) as *mut u8).write_volatile(v) }
        };
        poke(0, 1);
        poke(1, 1);
        t.track(base, len).unwrap();
        // Never armed: listed (nothing is known of them).
        let w = written(&t, base, len);
        assert!(w.contains(&0) && w.contains(&1), "{w:?}");
        t.arm(base, len).unwrap();
        assert_eq!(written(&t, base, len), Vec::<usize>::new());
        for p in [3, 4, 40] {
            poke(p, 2);
        }
        // A read is not a write.
        // SAFETY: inside the mapping.
        let _ = unsafe { ((base + 10 * 4096) as *const u8).read_volatile() };
        assert_eq!(written(&t, base, len), vec![3, 4, 40]);
        // Scanning protects nothing: the same answer until the pages are armed again.
        assert_eq!(written(&t, base, len), vec![3, 4, 40]);
        t.arm(base, 8 * 4096).unwrap();
        assert_eq!(written(&t, base, len), vec![40]);
        poke(4, 3);
        assert_eq!(written(&t, base, len), vec![4, 40]);
        // The data is the application's, untouched by the tracking.
        let v: Vec<u8> = [0, 3, 4, 40]
            .iter()
            // SAFETY: inside the mapping.
            .map(|p| unsafe { ((base + p * 4096) as *const u8).read_volatile() })
            .collect();
        assert_eq!(v, vec![1, 2, 3, 2]);
        // An untracked range is refused, not misreported.
        let other = crate::mem::map_anon(4096, false).unwrap();
        let mut out = Vec::new();
        assert_eq!(t.written(other, 4096, &mut out), Err(Errno(libc::EPERM)));
        crate::mem::unmap(base, len).unwrap();
        crate::mem::unmap(other, 4096).unwrap();
    }

    #[test]
    fn a_forked_child_cannot_touch_its_parents_tracking() {
        let Ok(t) = WriteTracker::open() else {
            eprintln!("no asynchronous write-protection here; skipped");
            return;
        };
        let len = 16 * 4096;
        let base = crate::mem::map_anon(len, false).unwrap();
        let other = crate::mem::map_anon(len, false).unwrap();
        // SAFETY: inside the mapping.
        unsafe { (base as *mut u8).write_volatile(1) };
        t.track(base, len).unwrap();
        t.arm(base, len).unwrap();
        let mut out = Vec::with_capacity(16);
        // SAFETY: the child calls only what allocates nothing and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // The inherited descriptor acts on the parent's address space: registering,
            // protecting or scanning from here would reach the parent's pages.
            let eperm = Err(Errno(libc::EPERM));
            let ok = t.track(other, len) == eperm
                && t.arm(base, len) == eperm
                && t.written(base, len, &mut out) == eperm;
            // The child's own copy is writable as usual.
            // SAFETY: inside the mapping (the child's copy).
            unsafe { (base as *mut u8).write_volatile(2) };
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        // The parent's tracking saw none of it, and still works.
        assert_eq!(written(&t, base, len), Vec::<usize>::new());
        // SAFETY: inside the mapping.
        unsafe { ((base + 4096) as *mut u8).write_volatile(3) };
        assert_eq!(written(&t, base, len), vec![1]);
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { (base as *const u8).read_volatile() }, 1);
        crate::mem::unmap(base, len).unwrap();
        crate::mem::unmap(other, len).unwrap();
    }
}
