//! The `remote` tier: pages on memory servers (`attune memserver`) on other hosts, over
//! libfabric (docs/design/remote.md).
//!
//! The fault path is signal-safe and the fabric library is not (it allocates and locks),
//! so one I/O thread owns the endpoint and every fabric call: a store or load posts a job
//! in a fixed table and sleeps on a futex until the thread answers. A job's range is cut
//! into 64 KiB units; each unit has one owner server (a hash of the unit), consecutive
//! units of one owner go as one request, and all the requests of a job are in flight at
//! once (each reply tagged with its request's number lands in the buffer posted for it).
//!
//! Failures are loud: a server that does not answer within `timeout_ms` fails the job
//! (ETIMEDOUT; a load then makes its region fail with SIGBUS) and the log names it; a
//! full server answers ENOSPC and the pages go to the next tier.

mod ahead;
mod client;
mod jobs;

use crate::config::TierConfig;
use attune_proto::remote::{self as proto, Op};
use attune_sys::uffd::Uffd;
use attune_sys::SysResult;
use client::Client;
use jobs::Shared;
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Arc;

pub use client::UNIT;

pub struct RemoteTier {
    shared: Arc<Shared>,
    /// What a forked child connects with.
    cfg: TierConfig,
    secret: Vec<u8>,
    /// The parent held pages here at the fork (the child's own I/O thread must start).
    had_data: AtomicBool,
}

/// How long a forked child waits for its I/O thread to begin.
const CHILD_START_NS: u64 = 5_000_000_000;

/// Reads the job's secret: a file only its owner may read (a secret others can read is
/// no secret, so it is refused, as ssh refuses such a key).
pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| format!("secret file {}: {e}", path.display()))?;
    if m.mode() & 0o077 != 0 {
        return Err(format!(
            "secret file {} can be read by others (mode {:o}): chmod 600 it",
            path.display(),
            m.mode() & 0o777
        ));
    }
    let s = std::fs::read(path).map_err(|e| format!("secret file {}: {e}", path.display()))?;
    let s = s.trim_ascii().to_vec();
    if s.len() < 16 || s.len() > proto::SECRET_MAX {
        return Err(format!(
            "secret file {}: a secret has 16 to {} bytes",
            path.display(),
            proto::SECRET_MAX
        ));
    }
    Ok(s)
}

impl RemoteTier {
    pub fn new(cfg: &TierConfig, space: u64) -> Result<RemoteTier, String> {
        let path = cfg
            .secret_file
            .as_deref()
            .ok_or_else(|| format!("tier '{}' has no secret_file", cfg.name))?;
        let secret = read_secret(path).map_err(|e| format!("tier '{}': {e}", cfg.name))?;
        let c = Client::connect(cfg, secret.clone())?;
        let shared = Arc::new(
            Shared::new(
                space.div_ceil(proto::PAGE) as usize,
                cfg.concurrency,
                cfg.ahead,
                crate::tier::COPIED_RUN,
            )
            .map_err(|e| format!("tier '{}': {e}", cfg.name))?,
        );
        let s2 = shared.clone();
        attune_sys::os::spawn_runtime_thread("attune-remote", move || c.run(s2))
            .map_err(|e| format!("tier '{}': cannot start its I/O thread: {e}", cfg.name))?;
        Ok(RemoteTier {
            shared,
            cfg: cfg.clone(),
            secret,
            had_data: AtomicBool::new(false),
        })
    }
}

impl RemoteTier {
    /// Posts the windows `attune_policy::ahead` asks for after a load of `[off,
    /// off+len)` (`served`: placed from a window that ends there), of pages the servers
    /// hold.
    fn fetch_ahead(&self, off: u64, len: usize, served: Option<u64>) {
        let sh = &*self.shared;
        sh.ahead.after_load(
            off,
            len,
            served,
            |s, l| sh.held(s, l),
            |addr, s, l, w| sh.post_window(w, addr, s, l),
        );
    }
}

impl super::Medium for RemoteTier {
    fn store(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        dirty: &mut dyn FnMut(usize, bool) -> super::Staged,
    ) -> SysResult<()> {
        // The provider's send reads the staged pages in the kernel, where a page the
        // program had discarded would fail the whole connection (EFAULT inside the
        // provider): `store_staged` maps such holes as zeros before this is called
        // (before 2026-12-06 this filled them again, an ioctl per page of every store).
        super::store_staged(io, region_uffd, src, len, &mut |st| {
            // Clean content the servers hold already is not sent again, unless the
            // copies were on servers since lost: then all of it goes.
            let all = !self.shared.held(off, len);
            let super::Staged::Write(pieces) = dirty(st, all) else {
                // A fill: nothing goes to the servers (what they held stays, unread).
                return Ok(());
            };
            if all {
                return self.shared.post(Op::Store, st, off, len, false);
            }
            let mut parts = [(0usize, 0u64, 0usize); attune_policy::writeback::MAX_PIECES];
            for (part, &(p, n)) in parts.iter_mut().zip(pieces.as_slice()) {
                let at = p * super::HASH_PAGE;
                *part = (st + at, off + at as u64, n * super::HASH_PAGE);
            }
            self.shared
                .post_each(Op::Store, &parts[..pieces.as_slice().len()])
        })
    }

    fn load(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        dst: usize,
        off: u64,
        len: usize,
        seen: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        let sh = &*self.shared;
        let taken = sh.ahead.take(off, len);
        // The next windows go out before this run is placed: the link moves them while
        // the program places and reads this one.
        self.fetch_ahead(off, len, taken.as_ref().map(|t| t.end));
        if let Some(t) = taken {
            if seen(t.addr) {
                let placed = region_uffd.place_copy(dst, t.addr, len, false);
                sh.ahead.give_back(t, true, len);
                return placed;
            }
            // What the window held is not what was stored last: loaded again below.
            sh.ahead.give_back(t, false, len);
        }
        super::load_bounced(
            io,
            region_uffd,
            dst,
            len,
            &mut |b| sh.post(Op::Load, b, off, len, false),
            seen,
        )
    }

    fn discard(&self, off: u64, len: usize) {
        let _ = self.shared.post(Op::Discard, 0, off, len, true);
    }

    fn keeps_copy(&self) -> bool {
        true
    }

    /// The servers free this process's pages a grace after its last request
    /// (`Client::leave`); the exit waits for that at most a second.
    fn leave(&self) {
        self.shared.leave(1_000_000_000);
    }

    fn is_node_memory(&self) -> bool {
        false
    }
    fn run_max(&self) -> Option<usize> {
        Some(crate::tier::COPIED_RUN)
    }
    fn run_grid(&self) -> Option<usize> {
        self.shared.ahead.on().then_some(crate::tier::COPIED_RUN)
    }

    /// A child cannot share the parent's sessions (both would write the same pages), and
    /// the parent's endpoint is its I/O thread's, which the child does not have. So,
    /// with the runtime quiesced, the I/O thread asks each server for a copy of the
    /// session (shared pages on the server: nothing is sent) and then parks outside the
    /// fabric library; the child opens an endpoint of its own and takes the copies over
    /// (`start_in_child`). The pages' copies and their content hashes hold in the child.
    fn prepare_fork(
        &self,
        _cfg: &TierConfig,
        _has_data: bool,
        _buf: usize,
        _buf_len: usize,
    ) -> Result<bool, String> {
        let has_data = self.shared.ever_stored.load(Relaxed);
        self.had_data.store(has_data, Relaxed);
        // No window is on its way at the fork: the child's I/O thread would answer none.
        self.shared.ahead.drain();
        self.shared
            .post(Op::Clone, has_data as usize, 0, 0, false)
            .map_err(|e| format!("the I/O thread did not prepare the fork: {e}"))?;
        Ok(true)
    }

    fn after_fork_in_parent(&self) {
        self.shared.unpark();
    }

    fn reopen_in_child(&self, _internal: &Uffd) -> Result<(), String> {
        Ok(())
    }

    /// The child's I/O thread: its own endpoint, the sessions cloned for it. Only its
    /// start is waited for (it must begin while the fork path holds the locale data in
    /// DRAM, as the runtime's other threads do); it connects on its own, because the
    /// fabric library allocates, and under `attune run` the interposer's table stays
    /// locked until the fork handlers are over (waiting for the connection here hung every
    /// forked Python worker). Jobs posted meanwhile wait for it. If it cannot connect,
    /// every job fails: stores go to the next tier, and a load of a page the child
    /// inherited here fails its region loudly (SIGBUS), never zeros.
    fn start_in_child(&self) -> Result<(), String> {
        let sh = self.shared.clone();
        sh.unpark();
        sh.started.store(0, Release);
        let clones = std::mem::take(&mut *sh.clones.lock().unwrap_or_else(|p| p.into_inner()));
        let (cfg, secret) = (self.cfg.clone(), self.secret.clone());
        let had_data = self.had_data.load(Relaxed);
        attune_sys::os::spawn_runtime_thread("attune-remote", move || {
            sh.started.store(1, Release);
            attune_sys::os::futex_wake(&sh.started, i32::MAX);
            match Client::resume(&cfg, secret, &clones, &sh) {
                Ok(c) => c.run(sh),
                Err(m) => {
                    let lost = if had_data {
                        "the pages it inherited there cannot be read (a load fails its region)"
                    } else {
                        "its pages go to the next tier"
                    };
                    crate::warn!("tier '{}' in a forked child: {m}; {lost}", cfg.name);
                    Client::refuse_all(&sh)
                }
            }
        })
        .map_err(|e| format!("cannot start its I/O thread: {e}"))?;
        let deadline = attune_sys::os::now_ns() + CHILD_START_NS;
        while self.shared.started.load(Acquire) == 0 {
            if attune_sys::os::now_ns() >= deadline {
                return Err("its I/O thread did not start within 5 s".into());
            }
            attune_sys::os::futex_wait(&self.shared.started, 0, 100_000_000);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_secret(&p).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&p).unwrap(), b"0123456789abcdef0123");
        std::fs::write(&p, "short").unwrap();
        assert!(read_secret(&p).unwrap_err().contains("16 to"));
    }
}
