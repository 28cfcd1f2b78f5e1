//! The kernel's own path as a baseline: a swap device and a cgroup v1 memory limit
//! (IMME's CBE environment, and the kernel-swap rows of `attune bench`).
//!
//! Everything here is ours and goes away with its value (Drop): a swap file on disk, a
//! zram device of our own (added with zram-control's `hot_add`, never the host's zram0) or
//! a loop device over a file in /dev/shm, switched on with `swapon` and off again, and a
//! memory cgroup named `attune-<pid>-<n>`. Host-wide settings are never touched. A run
//! that was killed before its cleanup leaves a swap file named `attune-swap-<pid>-<n>` or a
//! marker `/dev/shm/attune-zram-<pid>-<n>` naming its zram device; [`clean_stale`] removes
//! those whose process is gone. Needs root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

const CGROUP_ROOT: &str = "/sys/fs/cgroup/memory";
static SEQ: AtomicU32 = AtomicU32::new(0);

fn sh(prog: &str, args: &[&str]) -> Result<String, String> {
    let o = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| format!("{prog}: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err(format!(
            "{prog} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Why the kernel baselines cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    if !attune_sys::os::is_root() {
        return Some("needs root (swapon and a memory cgroup)".into());
    }
    if !Path::new(CGROUP_ROOT)
        .join("memory.limit_in_bytes")
        .exists()
    {
        return Some(format!("no cgroup v1 memory controller at {CGROUP_ROOT}"));
    }
    for p in ["mkswap", "swapon", "swapoff", "losetup"] {
        if sh("sh", &["-c", &format!("command -v {p}")]).is_err() {
            return Some(format!("{p} not found (util-linux)"));
        }
    }
    stuck_swap()
}

/// A memory-backed swap device of ours that is still on although its clean-up ran (its
/// backing file is deleted: `swapoff` failed). Seen twice on this machine kind (Linux
/// 6.18): the loop worker of such a device waits forever on a page lock, and every process
/// that swaps, a `swapoff` or `swapon --show`, and the host's own DAMON worker then hang in
/// D state until a reboot. The kernel baselines are not run then (they would hang); only
/// /proc/swaps and sysfs are read here, which never block on the device.
pub fn stuck_swap() -> Option<String> {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    for line in swaps.lines().skip(1) {
        let mut f = line.split_whitespace();
        let (Some(dev), Some(_), Some(_), Some(used)) = (f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Some(name) = dev.strip_prefix("/dev/") else {
            continue;
        };
        let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            .unwrap_or_default();
        let backing = backing.trim();
        if backing.contains("attune-swap-") && backing.ends_with("(deleted)") {
            return Some(format!(
                "a swap device of an earlier run is stuck ({dev} over {backing}, {used} KiB in use: \
                 its swapoff failed); the kernel's swap path is unreliable on this host until a reboot"
            ));
        }
    }
    None
}

/// Where the swap lives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Medium {
    /// A swap file on the local disk (`dir`).
    Disk,
    /// A zram device of our own: the kernel's swap path on a memory medium, with no file
    /// system or page cache under it (pages are compressed with lz4 when they compress,
    /// stored as they are when they do not).
    Zram,
    /// A loop device over a locked file in /dev/shm: the same medium through the page cache
    /// of tmpfs. It deadlocked twice on this machine kind (docs/design.md), which is why
    /// `memory` means zram where the kernel has it.
    Loop,
}

const ZRAM_CONTROL: &str = "/sys/class/zram-control";

impl Medium {
    /// Parses `--swap`: `disk`, `zram`, `loop`, or `memory` (zram where the kernel has it,
    /// the loop device otherwise).
    pub fn parse(s: &str) -> Result<Medium, String> {
        match s {
            "disk" => Ok(Medium::Disk),
            "zram" => Ok(Medium::Zram),
            "loop" => Ok(Medium::Loop),
            "memory" if Path::new(ZRAM_CONTROL).join("hot_add").exists() => Ok(Medium::Zram),
            "memory" => Ok(Medium::Loop),
            _ => Err(format!(
                "unknown swap medium '{s}' (memory, zram, loop or disk)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Medium::Disk => "disk",
            Medium::Zram => "memory (zram)",
            Medium::Loop => "memory (loop device over /dev/shm)",
        }
    }
}

/// An active swap device of ours.
pub struct Swap {
    /// The swap file (disk, loop) or the zram marker in /dev/shm.
    file: PathBuf,
    device: String,
    loop_dev: bool,
    /// Switched on (`swapon` succeeded): only then is it switched off again.
    on: bool,
    /// The zram device's number, for `hot_remove`.
    zram: Option<u32>,
    /// The memory-backed file's pages, mapped and locked (address, length).
    locked: Option<(usize, usize)>,
}

/// Swap priority of our devices: above any the host has, so the baseline's pages go to the
/// medium under test and never to another swap device (a stale or foreign one).
const PRIORITY: &str = "32767";

impl Swap {
    pub fn new(medium: Medium, disk_dir: &Path, size: u64) -> Result<Swap, String> {
        if medium == Medium::Zram {
            return Swap::zram(size);
        }
        let dir = match medium {
            Medium::Disk => disk_dir.to_path_buf(),
            _ => PathBuf::from("/dev/shm"),
        };
        // Say so before writing gigabytes that cannot fit (and leave 256 MiB to others).
        if let Ok(free) = attune_sys::os::fs_available(&dir) {
            if free < size.saturating_add(256 << 20) {
                return Err(format!(
                    "not enough free space in {} for a {} swap file ({} free; --swap-size or --swap-dir)",
                    dir.display(),
                    attune::size::human(size),
                    attune::size::human(free)
                ));
            }
        }
        let file = dir.join(format!(
            "attune-swap-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Relaxed)
        ));
        let fs = file.display().to_string();
        let mut s = Swap {
            file: file.clone(),
            device: fs.clone(),
            loop_dev: false,
            on: false,
            zram: None,
            locked: None,
        };
        // A swap file must have no holes: allocate it for real.
        std::fs::File::create(&file).map_err(|e| format!("{fs}: {e}"))?;
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("{fs}: {e}"))?;
        sh("fallocate", &["-l", &size.to_string(), &fs]).or_else(|_| {
            sh(
                "dd",
                &[
                    "if=/dev/zero",
                    &format!("of={fs}"),
                    "bs=1M",
                    &format!("count={}", size >> 20),
                    "status=none",
                ],
            )
        })?;
        if medium == Medium::Loop {
            // Lock the file's pages in memory first. Unlocked, memory pressure can swap the
            // swap device's own tmpfs pages out to that same device; the loop worker then
            // waits for a page only it could read back: a deadlock that hung every process
            // swapping to it (seen here once, under a cgroup limit; see docs/design.md).
            let f = std::fs::File::open(&file).map_err(|e| format!("{fs}: {e}"))?;
            let fd: std::os::fd::OwnedFd = f.into();
            let len = size as usize;
            let addr = attune_sys::mem::map_file_shared_ro(&fd, len)
                .map_err(|e| format!("{fs}: cannot map the swap file: {e:?}"))?;
            if let Err(e) = attune_sys::numa::mlock(addr, len) {
                let _ = attune_sys::mem::unmap(addr, len);
                let _ = std::fs::remove_file(&file);
                return Err(format!(
                    "cannot lock the memory-backed swap file in memory ({e:?}): without it the kernel \
                     may swap the device's own pages to itself and deadlock"
                ));
            }
            s.locked = Some((addr, len));
            s.device = sh("losetup", &["--find", "--show", &fs])?;
            s.loop_dev = true;
        }
        sh("mkswap", &[&s.device])?;
        sh("swapon", &["-p", PRIORITY, &s.device])?;
        s.on = true;
        Ok(s)
    }

    /// A zram device of our own. Its number is written to a marker in /dev/shm before
    /// anything else can fail, so that a run killed half-way is cleaned up by the next.
    fn zram(size: u64) -> Result<Swap, String> {
        let control = Path::new(ZRAM_CONTROL);
        let id: u32 = std::fs::read_to_string(control.join("hot_add"))
            .map_err(|e| format!("{ZRAM_CONTROL}/hot_add: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("{ZRAM_CONTROL}/hot_add: {e}"))?;
        let marker = PathBuf::from("/dev/shm").join(format!(
            "attune-zram-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Relaxed)
        ));
        let mut s = Swap {
            file: marker.clone(),
            device: format!("/dev/zram{id}"),
            loop_dev: false,
            on: false,
            zram: Some(id),
            locked: None,
        };
        std::fs::write(&marker, id.to_string())
            .map_err(|e| format!("{}: {e}", marker.display()))?;
        let sys = PathBuf::from(format!("/sys/block/zram{id}"));
        // lz4: the cheapest compressor the kernel offers; the algorithm is set before the
        // size (the kernel refuses it after). Where lz4 is missing the default stays.
        let _ = std::fs::write(sys.join("comp_algorithm"), "lz4");
        std::fs::write(sys.join("disksize"), size.to_string())
            .map_err(|e| format!("{}/disksize: {e}", sys.display()))?;
        sh("mkswap", &[&s.device])?;
        sh("swapon", &["-p", PRIORITY, &s.device])?;
        s.on = true;
        Ok(s)
    }
}

/// Switches a swap device or file off. A swapoff can fail for a moment (pages of a process
/// still exiting), so it is tried 5 times, 200 ms apart. The path where it still fails (a
/// zram device keeps its marker for the next run) has no test: a swapoff failure cannot be
/// forced here without host-wide memory pressure.
fn swapoff(dev: &str) -> Result<(), String> {
    let mut last = Ok(String::new());
    for attempt in 0..5 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        last = sh("swapoff", &[dev]);
        if last.is_ok() {
            break;
        }
    }
    last.map(|_| ())
}

/// Removes zram device `id` (it must be off as swap).
fn zram_remove(id: u32) {
    let _ = std::fs::write(Path::new(ZRAM_CONTROL).join("hot_remove"), id.to_string());
}

impl Drop for Swap {
    fn drop(&mut self) {
        if self.on {
            if let Err(e) = swapoff(&self.device) {
                eprintln!("attune: warning: {e}");
                // A zram device keeps its marker (self.file), so the next run switches it
                // off (a device of ours left on without one was seen on 2026-11-24).
                if self.zram.is_some() {
                    return;
                }
            }
        }
        if self.loop_dev {
            let _ = sh("losetup", &["-d", &self.device]);
        }
        if let Some(id) = self.zram {
            zram_remove(id);
        }
        if let Some((addr, len)) = self.locked.take() {
            let _ = attune_sys::mem::unmap(addr, len);
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// A memory cgroup of ours with a limit; processes join it by writing their pid.
pub struct MemCgroup {
    path: PathBuf,
}

impl MemCgroup {
    pub fn new(limit: u64) -> Result<MemCgroup, String> {
        let path = Path::new(CGROUP_ROOT).join(format!(
            "attune-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Relaxed)
        ));
        std::fs::create_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let g = MemCgroup { path };
        g.write("memory.limit_in_bytes", &limit.to_string())?;
        Ok(g)
    }

    fn write(&self, file: &str, v: &str) -> Result<(), String> {
        std::fs::write(self.path.join(file), v)
            .map_err(|e| format!("{}/{file}: {e}", self.path.display()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// No kernel swap for the cgroup's pages (cgroup v1: `memory.swappiness` 0 leaves
    /// anonymous memory out of the cgroup's reclaim; file pages are still dropped).
    pub fn no_swap(&self) -> Result<(), String> {
        self.write("memory.swappiness", "0")
    }

    /// Starts a new peak measurement.
    pub fn reset_peak(&self) {
        let _ = self.write("memory.max_usage_in_bytes", "0");
    }

    /// The cgroup's peak memory use (memory.max_usage_in_bytes).
    pub fn max_usage(&self) -> u64 {
        std::fs::read_to_string(self.path.join("memory.max_usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Empty once its processes have exited; retry briefly while the kernel settles.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("attune: warning: could not remove {}", self.path.display());
    }
}

/// Moves this process into the cgroup named by `var` (set by the parent for a worker).
pub fn join_cgroup_from_env(var: &str) -> Result<(), String> {
    if let Ok(p) = std::env::var(var) {
        std::fs::write(
            Path::new(&p).join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| format!("cannot join {p}: {e}"))?;
    }
    Ok(())
}

/// Removes swap files (and their loop devices) and cgroups left by attune processes that
/// no longer exist.
pub fn clean_stale(disk_dir: &Path) {
    let alive = |pid: &str| Path::new("/proc").join(pid).exists();
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let loops = sh("losetup", &["-a"]).unwrap_or_default();
    for e in std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("attune-zram-") else {
            continue;
        };
        if alive(rest.split('-').next().unwrap_or("")) {
            continue;
        }
        if let Some(id) = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            let dev = format!("/dev/zram{id}");
            let on = swaps
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&dev));
            if on && swapoff(&dev).is_err() {
                // Still in use: the marker stays for a later run (removing it would leave
                // a device of ours on that nothing names any more).
                continue;
            }
            zram_remove(id);
        }
        let _ = std::fs::remove_file(e.path());
    }
    for dir in [disk_dir, Path::new("/dev/shm")] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(rest) = name.strip_prefix("attune-swap-") else {
                continue;
            };
            if alive(rest.split('-').next().unwrap_or("")) {
                continue;
            }
            let f = e.path().display().to_string();
            for l in loops.lines().filter(|l| l.contains(&f)) {
                if let Some(dev) = l.split(':').next() {
                    if swaps.contains(dev) {
                        let _ = swapoff(dev);
                    }
                    let _ = sh("losetup", &["-d", dev]);
                }
            }
            if swaps.contains(&f) {
                let _ = swapoff(&f);
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    for e in std::fs::read_dir(CGROUP_ROOT)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(rest) = name.strip_prefix("attune-") {
            if !alive(rest.split('-').next().unwrap_or("")) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}
