//! A scripted medium for the unit tests of [`FarTier`](super::FarTier): it moves no page;
//! each store and load returns the next scripted result (Ok when the script is empty) and
//! is counted, so the accounting above the medium (capacity, grant, counters, the back-off
//! after ENOSPC) is tested without a device that fills up or fails on demand.

use super::{IoContext, Medium};
use crate::config::TierConfig;
use attune_sys::uffd::Uffd;
use attune_sys::SysResult;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Fake {
    pub stores: AtomicU64,
    pub loads: AtomicU64,
    pub discarded: AtomicU64,
    script: Mutex<VecDeque<SysResult<()>>>,
}

impl Fake {
    /// The results of the next calls, in order.
    pub fn then(&self, results: &[SysResult<()>]) {
        self.script.lock().unwrap().extend(results.iter().copied());
    }
    fn next(&self) -> SysResult<()> {
        self.script.lock().unwrap().pop_front().unwrap_or(Ok(()))
    }
}

impl Medium for Arc<Fake> {
    fn store(
        &self,
        _: &IoContext,
        _: &Uffd,
        _: usize,
        _: u64,
        _: usize,
        _: &mut dyn FnMut(usize, bool) -> super::Staged,
    ) -> SysResult<()> {
        self.stores.fetch_add(1, Relaxed);
        self.next()
    }
    fn load(
        &self,
        _: &IoContext,
        _: &Uffd,
        _: usize,
        _: u64,
        _: usize,
        _: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        self.loads.fetch_add(1, Relaxed);
        self.next()
    }
    fn discard(&self, _: u64, len: usize) {
        self.discarded.fetch_add(len as u64, Relaxed);
    }
    fn keeps_copy(&self) -> bool {
        false
    }
    fn is_node_memory(&self) -> bool {
        true
    }
    fn prepare_fork(
        &self,
        _: &TierConfig,
        has_data: bool,
        _: usize,
        _: usize,
    ) -> Result<bool, String> {
        Ok(has_data)
    }
    fn reopen_in_child(&self, _: &Uffd) -> Result<(), String> {
        Ok(())
    }
}
