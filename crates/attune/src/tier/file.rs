//! The `file` tier: pages in a private file on a file system (NVMe, Lustre, PMem fsdax).
//!
//! The file is unnamed (`O_TMPFILE`, mode 0600), so it disappears with the process even
//! after SIGKILL; it is sparse, and `O_DIRECT` is used when configured and supported.
//! Eviction moves the pages into a staging buffer (atomic: a concurrent write either lands
//! before the move and is written out, or faults and waits) and writes them at the chunk's
//! offset, unless the file already holds identical content (a content hash recorded when
//! the chunk was last written or read, see docs/design/paging.md "Dirty pages"). A fetch reads
//! into a bounce buffer and copies into the region.

use crate::config::TierConfig;
use attune_sys::uffd::Uffd;
use attune_sys::{mem, SysResult};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, Ordering::AcqRel};

pub struct FileTier {
    fd: OwnedFd,
    /// Buffered (not `O_DIRECT`): each store's write-back is started at once (`store`).
    buffered: bool,
    /// The file prepared for a child during a fork (-1: none).
    child_file: AtomicI32,
}

impl FileTier {
    /// Before a fork (the runtime quiesced): a private file for the child with a copy of
    /// what this one holds (`copy` false: an empty one). It must be made now: after the
    /// fork the parent goes on writing its own file, and a copy made later by the child
    /// could find chunks there overwritten.
    pub fn prepare_child_file(
        &self,
        cfg: &TierConfig,
        copy: bool,
        buf: usize,
        buf_len: usize,
    ) -> Result<(), String> {
        let dir = cfg.path.as_deref().ok_or("no path")?;
        let (fresh, _, _) = mem::open_private_file(dir, cfg.direct)
            .map_err(|e| format!("cannot create a private file in {}: {e}", dir.display()))?;
        if copy {
            mem::copy_file_data(&self.fd, &fresh, buf, buf_len)
                .map_err(|e| format!("cannot copy the data for the child: {e}"))?;
        }
        let old = self
            .child_file
            .swap(std::os::fd::IntoRawFd::into_raw_fd(fresh), AcqRel);
        attune_sys::os::close_fd(old);
        Ok(())
    }

    /// After the fork, in the parent: the child's file is not ours.
    pub fn drop_child_file(&self) {
        attune_sys::os::close_fd(self.child_file.swap(-1, AcqRel));
    }

    /// In the child: the file prepared for it replaces the parent's (same number).
    pub fn take_child_file(&self) -> Result<(), String> {
        let fd = self.child_file.swap(-1, AcqRel);
        if fd < 0 {
            return Err("no file was prepared for the child".into());
        }
        attune_sys::os::replace_raw_fd(fd, std::os::fd::AsRawFd::as_raw_fd(&self.fd))
            .map_err(|e| format!("cannot replace the file: {e}"))
    }

    pub fn new(cfg: &TierConfig) -> Result<FileTier, String> {
        let dir = cfg
            .path
            .as_deref()
            .ok_or_else(|| format!("tier '{}' has no path", cfg.name))?;
        let (fd, direct, named) = mem::open_private_file(dir, cfg.direct).map_err(|e| {
            format!(
                "tier '{}': cannot create a private file in {}: {e}",
                cfg.name,
                dir.display()
            )
        })?;
        // Only a file system without O_TMPFILE can hold files a crash left behind: the
        // directory is not listed at every start otherwise.
        if named {
            let removed = mem::clean_stale_files(dir);
            if removed > 0 {
                crate::info!(
                    "tier '{}': removed {removed} stale file(s) left by dead processes in {}",
                    cfg.name,
                    dir.display()
                );
            }
        }
        if cfg.direct && !direct {
            crate::warn!(
                "tier '{}': O_DIRECT is not supported in {}; using buffered I/O",
                cfg.name,
                dir.display()
            );
        }
        Ok(FileTier {
            fd,
            buffered: !direct,
            child_file: AtomicI32::new(-1),
        })
    }
}

impl super::Medium for FileTier {
    /// Writes the pages at `src` (region memory) to `off`. `dirty(staging_addr)` is asked
    /// after the move: the pieces the file does not hold yet.
    fn store(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        dirty: &mut dyn FnMut(usize, bool) -> super::Staged,
    ) -> SysResult<()> {
        // Clean content the file holds already is not written again, nor a fill.
        super::store_staged(io, region_uffd, src, len, &mut |st| {
            let super::Staged::Write(pieces) = dirty(st, false) else {
                return Ok(());
            };
            for &(p, n) in pieces.as_slice() {
                let at = p * super::HASH_PAGE;
                mem::pwrite_raw(&self.fd, st + at, n * super::HASH_PAGE, off + at as u64)?;
            }
            // A buffered store's pages are dirty page cache charged to the job's memory
            // cgroup, which the kernel may leave unwritten for 30 s (the host's
            // dirty_expire): they cannot be reclaimed meanwhile, and `follow_limit` counts
            // them as held outside Attune and lowers the budget (docs/reliability.md,
            // "Dirty pages of a buffered file tier"). Their write-back is started now;
            // it is a hint, so its failure fails no store.
            if self.buffered && !pieces.as_slice().is_empty() {
                let _ = mem::start_writeback(&self.fd, off, len as u64);
            }
            Ok(())
        })
    }
    /// Reads `len` bytes at `off` into the missing region range `dst`. `seen(bounce)` is
    /// called with the data before it is placed (to check and record content hashes);
    /// false from it is EBADMSG, nothing placed.
    fn load(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        dst: usize,
        off: u64,
        len: usize,
        seen: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        // Every chunk loaded from here was written here: a short read means the file lost
        // it (truncated by someone else), which must fail, not read as zeros.
        super::load_bounced(
            io,
            region_uffd,
            dst,
            len,
            &mut |b| mem::pread_exact_raw(&self.fd, b, len, off),
            seen,
        )
    }
    fn discard(&self, off: u64, len: usize) {
        let _ = mem::punch_hole(&self.fd, off, len as u64);
    }
    fn keeps_copy(&self) -> bool {
        true
    }
    fn is_node_memory(&self) -> bool {
        false
    }
    fn run_max(&self) -> Option<usize> {
        Some(super::COPIED_RUN)
    }
    /// Nothing stored: no copy (fork+exec pays nothing), and the hashes are dropped.
    fn prepare_fork(
        &self,
        cfg: &TierConfig,
        has_data: bool,
        buf: usize,
        buf_len: usize,
    ) -> Result<bool, String> {
        self.prepare_child_file(cfg, has_data, buf, buf_len)?;
        Ok(has_data)
    }
    fn after_fork_in_parent(&self) {
        self.drop_child_file()
    }
    fn reopen_in_child(&self, _internal: &Uffd) -> Result<(), String> {
        self.take_child_file()
    }
}
