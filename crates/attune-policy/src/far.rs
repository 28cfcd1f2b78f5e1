//! Which far tiers a process gets when nobody named them (`far = "auto"`, the default).
//!
//! The rule: far memory is somewhere other than the job's own RAM (issue 25). A CPU-less
//! NUMA node (CXL or pooled memory) is the fastest such place, then the node's far pool in
//! `attuned` (outside every job's cgroup), then a file on local scratch. The in-process
//! `memory` tier is never chosen here: it keeps far pages in the process's own anonymous
//! memory, charged to its cgroup, and exists for experiments that name it.
//! docs/design/paging.md, "The default far tier", says why each step is where it is.

/// A directory a file tier could use, as the machine reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scratch {
    pub path: String,
    pub fs: FsClass,
}

/// What backs a directory's file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FsClass {
    /// A local block device (ext4, xfs, btrfs on NVMe or disk).
    Local,
    /// A network or parallel file system (NFS, Lustre, GPFS, BeeGFS): shared, slower.
    Network,
    /// RAM (tmpfs, ramfs): a file there is memory again.
    Memory,
}

/// What the machine offers, found when the process starts.
#[derive(Clone, Debug, Default)]
pub struct Offer {
    /// NUMA nodes with memory and no CPUs, lowest first.
    pub cpuless_nodes: Vec<u32>,
    /// The node daemon's socket exists and the daemon is not switched off.
    pub daemon: bool,
    /// Candidate scratch directories in the order the user's environment ranks them
    /// ($TMPDIR first), each an existing directory.
    pub scratch: Vec<Scratch>,
    /// The process runs under a memory cgroup limit (page cache is charged to it).
    pub memory_limit: bool,
}

/// The far tiers chosen, fastest first, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub tiers: Vec<FarTier>,
    /// One line for the log, `attune topology` and the run report.
    pub reason: String,
    /// Set when the choice keeps far pages in RAM after all (scratch only on tmpfs).
    pub warning: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FarTier {
    Numa { node: u32 },
    Pool,
    File { path: String, direct: bool },
}

impl FarTier {
    /// The tier kind's name, as in `[[tier]]` tables.
    pub fn kind(&self) -> &'static str {
        match self {
            FarTier::Numa { .. } => "numa",
            FarTier::Pool => "pool",
            FarTier::File { .. } => "file",
        }
    }
}

/// The scratch directory for a file tier: the first local one, else the first on a
/// network file system, else the first in RAM (with a warning), else `/tmp`.
fn scratch(offer: &Offer) -> (Scratch, bool) {
    for class in [FsClass::Local, FsClass::Network, FsClass::Memory] {
        if let Some(s) = offer.scratch.iter().find(|s| s.fs == class) {
            return (s.clone(), class == FsClass::Memory);
        }
    }
    (
        Scratch {
            path: "/tmp".into(),
            fs: FsClass::Local,
        },
        false,
    )
}

fn class(fs: FsClass) -> &'static str {
    match fs {
        FsClass::Local => "local",
        FsClass::Network => "network",
        FsClass::Memory => "in-memory",
    }
}

/// Chooses the far tiers of a process whose configuration names none.
///
/// - A CPU-less NUMA node: a `numa` tier on the lowest one, alone (the NUMA placer moves
///   pages by `move_pages`; a file tier behind it would take nothing the node can hold).
/// - Else `attuned`'s socket: `pool` then `file` (the pool outside the job, the file for
///   what the daemon does not grant).
/// - Else `file` on scratch.
///
/// The file tier uses O_DIRECT under a memory cgroup limit: buffered, its pages come back
/// as page cache charged to the job and compete with the budget. Without a limit the
/// page cache is the kernel's to reclaim and serves recent far pages for free. On
/// tmpfs O_DIRECT is not offered and would gain nothing: buffered.
pub fn choose(offer: &Offer) -> Choice {
    if let Some(&node) = offer.cpuless_nodes.first() {
        return Choice {
            tiers: vec![FarTier::Numa { node }],
            reason: format!("NUMA node {node} has memory and no CPUs (CXL or pooled memory)"),
            warning: None,
        };
    }
    let (dir, in_ram) = scratch(offer);
    let direct = offer.memory_limit && !in_ram;
    let file = FarTier::File {
        path: dir.path.clone(),
        direct,
    };
    let how = if direct {
        "O_DIRECT, since a memory cgroup limit would be charged its page cache"
    } else if in_ram {
        "buffered, on tmpfs"
    } else {
        "buffered, since without a memory cgroup limit the page cache is the kernel's to reclaim"
    };
    let warning = in_ram.then(|| {
        format!(
            "the far tier's file is in {}, which is RAM (tmpfs): far pages do not leave memory; \
             set ATTUNE_TIER_FILE_PATH to a directory on a disk",
            dir.path
        )
    });
    if offer.daemon {
        return Choice {
            tiers: vec![FarTier::Pool, file],
            reason: format!(
                "no CPU-less NUMA node; attuned's socket: the node's far pool, then a file on {} scratch, {how}",
                class(dir.fs)
            ),
            warning,
        };
    }
    Choice {
        tiers: vec![file],
        reason: format!(
            "no CPU-less NUMA node, no attuned socket: a file on {} scratch, {how}",
            class(dir.fs)
        ),
        warning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(p: &str, fs: FsClass) -> Scratch {
        Scratch { path: p.into(), fs }
    }

    fn kinds(c: &Choice) -> Vec<&'static str> {
        c.tiers.iter().map(FarTier::kind).collect()
    }

    #[test]
    fn table() {
        let local = vec![dir("/tmp", FsClass::Local)];
        // (offer, tier kinds, file path and direct, warned)
        let rows: Vec<(Offer, Vec<&str>, Option<(&str, bool)>, bool)> = vec![
            (
                Offer {
                    scratch: local.clone(),
                    ..Offer::default()
                },
                vec!["file"],
                Some(("/tmp", false)),
                false,
            ),
            (
                Offer {
                    scratch: local.clone(),
                    memory_limit: true,
                    ..Offer::default()
                },
                vec!["file"],
                Some(("/tmp", true)),
                false,
            ),
            (
                Offer {
                    scratch: local.clone(),
                    daemon: true,
                    ..Offer::default()
                },
                vec!["pool", "file"],
                Some(("/tmp", false)),
                false,
            ),
            (
                Offer {
                    cpuless_nodes: vec![2, 3],
                    daemon: true,
                    scratch: local.clone(),
                    memory_limit: true,
                },
                vec!["numa"],
                None,
                false,
            ),
            // $TMPDIR on tmpfs is passed over for a local disk, then a network one.
            (
                Offer {
                    scratch: vec![
                        dir("/run/user/1000", FsClass::Memory),
                        dir("/lustre/scratch", FsClass::Network),
                        dir("/var/tmp", FsClass::Local),
                    ],
                    memory_limit: true,
                    ..Offer::default()
                },
                vec!["file"],
                Some(("/var/tmp", true)),
                false,
            ),
            (
                Offer {
                    scratch: vec![
                        dir("/dev/shm/x", FsClass::Memory),
                        dir("/lustre/scratch", FsClass::Network),
                    ],
                    ..Offer::default()
                },
                vec!["file"],
                Some(("/lustre/scratch", false)),
                false,
            ),
            // Only RAM: buffered (no O_DIRECT on tmpfs), and the user is told.
            (
                Offer {
                    scratch: vec![dir("/tmp", FsClass::Memory)],
                    memory_limit: true,
                    ..Offer::default()
                },
                vec!["file"],
                Some(("/tmp", false)),
                true,
            ),
            // No candidate found: /tmp.
            (Offer::default(), vec!["file"], Some(("/tmp", false)), false),
        ];
        for (i, (offer, want, file, warned)) in rows.iter().enumerate() {
            let c = choose(offer);
            assert_eq!(&kinds(&c), want, "row {i}: {c:?}");
            let got = c.tiers.iter().find_map(|t| match t {
                FarTier::File { path, direct } => Some((path.as_str(), *direct)),
                _ => None,
            });
            assert_eq!(got, *file, "row {i}: {c:?}");
            assert_eq!(c.warning.is_some(), *warned, "row {i}: {c:?}");
            assert!(!c.reason.is_empty());
        }
    }

    #[test]
    fn the_memory_tier_is_never_chosen() {
        for daemon in [false, true] {
            for memory_limit in [false, true] {
                for fs in [FsClass::Local, FsClass::Network, FsClass::Memory] {
                    let c = choose(&Offer {
                        daemon,
                        memory_limit,
                        scratch: vec![dir("/x", fs)],
                        cpuless_nodes: vec![],
                    });
                    assert!(!kinds(&c).contains(&"memory"));
                }
            }
        }
    }

    #[test]
    fn the_reason_names_the_node_and_the_scratch() {
        let c = choose(&Offer {
            cpuless_nodes: vec![1],
            ..Offer::default()
        });
        assert!(c.reason.contains("node 1"), "{}", c.reason);
        let c = choose(&Offer {
            scratch: vec![dir("/scratch/job", FsClass::Local)],
            memory_limit: true,
            ..Offer::default()
        });
        assert!(c.reason.contains("local scratch") && c.reason.contains("O_DIRECT"));
    }
}
