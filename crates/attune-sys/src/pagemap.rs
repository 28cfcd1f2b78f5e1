//! Which pages were written: asynchronous userfaultfd write-protection read back with
//! `PAGEMAP_SCAN` (Linux 6.7+), or, on older kernels, the soft-dirty bits.
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
//! Soft-dirty (the fallback, any kernel built with `CONFIG_MEM_SOFT_DIRTY`, as Debian's
//! and RHEL's are): writing "4" to `/proc/self/clear_refs` write-protects every page of
//! the process and clears its soft-dirty bit; the next write to a page sets it again
//! (bit 55 of its `/proc/self/pagemap` entry). Nothing is per range: one clear re-arms the
//! whole process, so after each round every first write to any page of the process costs
//! an in-kernel fault, not only writes to armed cells (not measured: this machine's kernel
//! keeps no soft-dirty bits; `write_heat_cost` times the asynchronous kind only).
//! A new mapping reads as written until the next clear (its VMA is marked soft-dirty).
//!
//! Contract: the tracker's registrations do not survive `fork` in the child (no
//! `UFFD_FEATURE_EVENT_FORK`); a scan there fails with `EPERM` (`PM_SCAN_CHECK_WPASYNC`)
//! instead of reporting wrongly. The child's copy of the descriptor still names the
//! parent's address space (a userfaultfd acts on the memory of the process that opened
//! it), so in any process but the one that opened it every call fails with `EPERM`
//! before reaching the kernel: a child never registers or protects its parent's pages.

use crate::uffd::{feature, mode, Uffd};
use crate::{Errno, SysResult};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

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

/// How a tracker learns of writes.
enum Backend {
    /// A userfaultfd in asynchronous write-protect mode, read with `PAGEMAP_SCAN`.
    Async(Uffd),
    /// Soft-dirty bits; `cleared`: the process was re-armed this round.
    SoftDirty { cleared: AtomicBool },
}

/// Written-page tracking for the NUMA heat scanner, by the best means the kernel has.
pub struct WriteTracker {
    backend: Backend,
    /// The process that opened it (whose address space the descriptor acts on).
    owner: u32,
}

/// Soft-dirty bit of a pagemap entry; present and swapped bits.
const PM_SOFT_DIRTY: u64 = 1 << 55;
const PM_PRESENT_OR_SWAPPED: u64 = (1 << 63) | (1 << 62);

impl WriteTracker {
    /// Asynchronous write-protection where the kernel has it (6.7+) and the mask leaves
    /// it, soft-dirty bits otherwise; `Err` when neither (the caller goes on without
    /// write heat).
    pub fn open() -> Result<WriteTracker, Errno> {
        Self::open_async().or_else(|e| Self::open_soft_dirty().map_err(|_| e))
    }

    /// Asynchronous write-protection only.
    pub fn open_async() -> Result<WriteTracker, Errno> {
        // Masked (`crate::kernel`): as on a kernel without it.
        if crate::kernel::masked(crate::kernel::PAGEMAP_SCAN)
            || crate::kernel::masked(crate::kernel::WP_ASYNC)
        {
            return Err(Errno(libc::ENOTSUP));
        }
        let uffd =
            Uffd::open_exact(feature::WP_ASYNC | feature::WP_UNPOPULATED).map_err(|e| e.errno)?;
        if uffd.features() & feature::WP_ASYNC == 0 {
            return Err(Errno(libc::ENOTSUP));
        }
        Ok(WriteTracker {
            backend: Backend::Async(uffd),
            owner: std::process::id(),
        })
    }

    /// Soft-dirty bits only: `Err(ENOTSUP)` where the kernel keeps none ([`soft_dirty`];
    /// without `CONFIG_MEM_SOFT_DIRTY`, this machine's kernel, `clear_refs` takes "4" and
    /// does nothing). Opening clears the process's bits once.
    pub fn open_soft_dirty() -> Result<WriteTracker, Errno> {
        if crate::kernel::masked(crate::kernel::SOFT_DIRTY) || !soft_dirty() {
            return Err(Errno(libc::ENOTSUP));
        }
        clear_soft_dirty()?;
        Ok(WriteTracker {
            backend: Backend::SoftDirty {
                cleared: AtomicBool::new(true),
            },
            owner: std::process::id(),
        })
    }

    /// "asynchronous write-protection" or "soft-dirty bits", for messages.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Async(_) => "asynchronous write-protection",
            Backend::SoftDirty { .. } => "soft-dirty bits",
        }
    }

    /// Makes `[start, start+len)` trackable (page-aligned, anonymous or shmem, not
    /// registered with another userfaultfd). Nothing is armed yet.
    pub fn track(&self, start: usize, len: usize) -> SysResult<()> {
        self.in_owner()?;
        match &self.backend {
            Backend::Async(uffd) => uffd.register(start, len, mode::WP),
            Backend::SoftDirty { .. } => Ok(()),
        }
    }

    /// Starts a round of scans then arms: with soft-dirty bits, the first [`Self::arm`]
    /// after this re-arms the whole process, once.
    pub fn begin_round(&self) {
        if let Backend::SoftDirty { cleared } = &self.backend {
            cleared.store(false, Relaxed);
        }
    }

    /// Arms `[start, start+len)` (inside a tracked range): its next writes are seen. With
    /// soft-dirty bits every page of the process is armed, once per round.
    pub fn arm(&self, start: usize, len: usize) -> SysResult<()> {
        self.in_owner()?;
        match &self.backend {
            Backend::Async(uffd) => uffd.writeprotect(start, len, true),
            Backend::SoftDirty { cleared } => {
                if cleared.swap(true, Relaxed) {
                    Ok(())
                } else {
                    clear_soft_dirty()
                }
            }
        }
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
        if let Backend::SoftDirty { .. } = self.backend {
            return soft_dirty_pages(fd, start, len, out);
        }
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

/// Whether the kernel keeps soft-dirty bits (`CONFIG_MEM_SOFT_DIRTY`). Tried once per
/// process ([`soft_dirty_works`]: one page mapped, written, read back in
/// the pagemap), then remembered.
pub fn soft_dirty() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(soft_dirty_works)
}

/// Whether this kernel keeps soft-dirty bits, without clearing any (a clear would cost the
/// whole process a fault per page it writes next): a new mapping is marked soft-dirty and
/// a written page is too, so a fresh page reads back with its bit set exactly when the
/// kernel keeps them (without `CONFIG_MEM_SOFT_DIRTY` the bit is never set).
fn soft_dirty_works() -> bool {
    let ps = crate::page_size();
    let Ok(page) = crate::mem::map_anon(ps, false) else {
        return false;
    };
    // SAFETY: the page mapped above.
    unsafe { (page as *mut u8).write_volatile(1) };
    let mut seen = Vec::new();
    let ok = crate::mem::pagemap_fd()
        .and_then(|fd| soft_dirty_pages(fd, page, ps, &mut seen))
        .is_ok();
    let _ = crate::mem::unmap(page, ps);
    ok && !seen.is_empty()
}

/// Clears the soft-dirty bits of every page of this process (`clear_refs` "4").
fn clear_soft_dirty() -> SysResult<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/clear_refs")
        .and_then(|mut f| f.write_all(b"4"))
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::ENOTSUP)))
}

/// Appends the runs of pages of `[start, start+len)` whose soft-dirty bit is set (present
/// or swapped), read from the pagemap descriptor `fd`.
fn soft_dirty_pages(
    fd: i32,
    start: usize,
    len: usize,
    out: &mut Vec<(usize, usize)>,
) -> SysResult<()> {
    const BATCH: usize = 4096;
    let ps = crate::page_size();
    let mut entries = [0u64; BATCH];
    let (first, pages) = (start / ps, len.div_ceil(ps));
    let mut done = 0;
    while done < pages {
        let n = (pages - done).min(BATCH);
        // SAFETY: reads at most n entries into `entries`, which holds BATCH >= n.
        let got = unsafe {
            crate::raw::pread(
                fd,
                entries.as_mut_ptr().cast(),
                n * 8,
                ((first + done) * 8) as libc::off_t,
            )
        };
        if got < 0 {
            return Err(Errno::last());
        }
        let got = got as usize / 8;
        if got == 0 {
            return Err(Errno(libc::EIO));
        }
        for (i, &e) in entries[..got].iter().enumerate() {
            if e & PM_SOFT_DIRTY != 0 && e & PM_PRESENT_OR_SWAPPED != 0 {
                let at = (first + done + i) * ps;
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == at => last.1 += ps,
                    _ => out.push((at, ps)),
                }
            }
        }
        done += got;
    }
    Ok(())
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
        let Ok(t) = WriteTracker::open_async() else {
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
        let Ok(t) = WriteTracker::open_async() else {
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

    #[test]
    fn soft_dirty_pages_report_writes_after_a_round() {
        let Ok(t) = WriteTracker::open_soft_dirty() else {
            eprintln!("no soft-dirty bits here; skipped");
            return;
        };
        assert_eq!(t.kind(), "soft-dirty bits");
        let len = 64 * 4096;
        let base = crate::mem::map_anon(len, false).unwrap();
        let _ = crate::mem::advise(base, len, crate::mem::MADV_NOHUGEPAGE);
        let poke = |page: usize, v: u8| {
            // SAFETY: inside the mapping above.
            unsafe { ((base + page * 4096) as *mut u8).write_volatile(v) }
        };
        for p in 0..64 {
            poke(p, 1);
        }
        t.track(base, len).unwrap();
        t.begin_round();
        t.arm(base, len).unwrap();
        assert_eq!(written(&t, base, len), Vec::<usize>::new());
        for p in [3, 4, 40] {
            poke(p, 2);
        }
        // SAFETY: inside the mapping; a read is not a write.
        let _ = unsafe { ((base + 10 * 4096) as *const u8).read_volatile() };
        assert_eq!(written(&t, base, len), vec![3, 4, 40]);
        // Within a round, a second arm re-arms nothing: the writes stay seen.
        t.arm(base, 4096).unwrap();
        assert_eq!(written(&t, base, len), vec![3, 4, 40]);
        // The next round's first arm clears them.
        t.begin_round();
        t.arm(base, 4096).unwrap();
        poke(7, 3);
        assert_eq!(written(&t, base, len), vec![7]);
        // SAFETY: inside the mapping.
        assert_eq!(
            unsafe { ((base + 40 * 4096) as *const u8).read_volatile() },
            2
        );
        crate::mem::unmap(base, len).unwrap();
    }
}
