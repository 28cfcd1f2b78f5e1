//! NUMA memory policy and page migration: `mbind`, `move_pages`, `mlock`,
//! `MADV_POPULATE_WRITE`.
//!
//! Raw system calls (no libnuma dependency: it is not on every node, and its error
//! handling prints instead of returning). Node sets are `u64` bit masks: node ids up to
//! 63, which covers every machine we know of; callers refuse larger ids. None of these
//! functions is signal-safe.

use crate::{Errno, SysResult};

/// Memory policy modes that take a node set (`linux/mempolicy.h`).
pub mod mpol {
    pub const PREFERRED: i32 = 1;
    /// Strict: allocation fails rather than leave the nodes (lbench's arrays on one tier).
    pub const BIND: i32 = 2;
    pub const PREFERRED_MANY: i32 = 5;
    /// Linux 6.9 and later; EINVAL before, and on machines with one memory tier.
    pub const WEIGHTED_INTERLEAVE: i32 = 6;
}

const MADV_POPULATE_WRITE: i32 = 23;
/// `mbind` and `move_pages` flag: move pages of this process that are already placed.
const MPOL_MF_MOVE: u32 = 2;

/// Sets the policy of `[addr, addr+len)` (page aligned) to `mode` over `nodes`.
/// With `move_existing`, pages already placed elsewhere are migrated (MPOL_MF_MOVE).
pub fn mbind(addr: usize, len: usize, mode: i32, nodes: u64, move_existing: bool) -> SysResult<()> {
    let mask = nodes;
    // The kernel reads maxnode - 1 bits: 65 covers nodes 0-63, one word.
    let maxnode: u64 = 65;
    let flags = if move_existing { MPOL_MF_MOVE } else { 0 };
    // SAFETY: the kernel reads one u64 of mask; the range is the caller's own mapping.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            mode,
            &mask as *const u64,
            maxnode,
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Where each page of `pages` is (node id, or a negative errno such as -ENOENT for a page
/// not present), written into `status`. Queries only: nothing moves.
pub fn query_pages(pages: &[usize], status: &mut [i32]) -> SysResult<()> {
    move_pages_raw(pages, None, status)
}

/// Moves `pages` to `nodes[i]` each; `status[i]` gets the node reached or a negative errno.
pub fn move_pages(pages: &[usize], nodes: &[i32], status: &mut [i32]) -> SysResult<()> {
    if nodes.len() != pages.len() {
        return Err(Errno(libc::EINVAL));
    }
    move_pages_raw(pages, Some(nodes), status)
}

fn move_pages_raw(pages: &[usize], nodes: Option<&[i32]>, status: &mut [i32]) -> SysResult<()> {
    if status.len() < pages.len() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: three arrays of `pages.len()` elements that we own; pid 0 is this process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            pages.len() as u64,
            pages.as_ptr(),
            nodes.map_or(std::ptr::null(), |n| n.as_ptr()),
            status.as_mut_ptr(),
            if nodes.is_some() {
                MPOL_MF_MOVE as i32
            } else {
                0
            },
        )
    };
    // A positive return is the number of pages that could not be moved (their status
    // says why); the caller verifies with a query.
    if r >= 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Faults in `[addr, addr+len)` for writing without touching it from user space, so the
/// pages are allocated under the range's memory policy now.
pub fn populate_write(addr: usize, len: usize) -> SysResult<()> {
    // SAFETY: advice on the caller's own mapping; no memory is read or written by us.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, MADV_POPULATE_WRITE) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Locks `[addr, addr+len)` in memory: locked pages are not reclaimed, so the kernel's
/// demotion (which works through reclaim) never moves them to a slower node.
pub fn mlock(addr: usize, len: usize) -> SysResult<()> {
    // SAFETY: the range is the caller's mapping; mlock does not access it from Rust.
    if unsafe { libc::mlock(addr as *const libc::c_void, len) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

pub fn munlock(addr: usize, len: usize) -> SysResult<()> {
    // SAFETY: as for mlock.
    if unsafe { libc::munlock(addr as *const libc::c_void, len) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}
