//! Software perf counters (`perf_event_open`): page faults of this process and of the
//! children it starts afterwards. Software events work where hardware counters do not
//! (virtual machines, this machine kind); a failure (perf_event_paranoid, seccomp) is an
//! `Err` the caller reports, never a panic.

use crate::{Errno, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `PERF_TYPE_SOFTWARE` events (`linux/perf_event.h`).
pub mod sw {
    pub const PAGE_FAULTS_MIN: u64 = 5;
    pub const PAGE_FAULTS_MAJ: u64 = 6;
}

/// The first 64 bytes of `struct perf_event_attr` (PERF_ATTR_SIZE_VER0).
#[repr(C)]
#[derive(Default)]
struct AttrV0 {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
/// attr.flags bit: children created after the counter is opened count into it (their
/// counts are added when they exit).
const INHERIT: u64 = 1 << 1;

/// A counting software event on this process and its future children.
pub struct SwCounter(OwnedFd);

impl SwCounter {
    pub fn open(config: u64) -> SysResult<SwCounter> {
        let attr = AttrV0 {
            type_: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<AttrV0>() as u32,
            config,
            flags: INHERIT,
            ..Default::default()
        };
        // SAFETY: the kernel reads `size` bytes of attr; pid 0 = this process, any CPU,
        // no group; PERF_FLAG_FD_CLOEXEC (8) keeps the fd out of exec'd programs.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const AttrV0,
                0,
                -1,
                -1,
                8u64,
            )
        };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: a fresh fd owned by nobody else.
        Ok(SwCounter(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// The count so far (children's counts once they have exited).
    pub fn read(&self) -> SysResult<u64> {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into v.
        let n = unsafe {
            crate::raw::read(
                self.0.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
        if n == 8 {
            Ok(v)
        } else {
            Err(Errno::last())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_faults_of_fresh_pages() {
        let Ok(c) = SwCounter::open(sw::PAGE_FAULTS_MIN) else {
            eprintln!("perf_event_open not permitted here: skipped");
            return;
        };
        let before = c.read().unwrap();
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        let after = c.read().unwrap();
        // 16384 pages touched (fewer faults with transparent huge pages).
        assert!(after - before >= 32, "{before} -> {after}");
    }
}
