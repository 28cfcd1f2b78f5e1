//! `mem::clean_stale_files` removes only what a crashed process of this user left: regular
//! files named `attune-<pid>-<n>`, owned by this user, whose pid is gone. The tier
//! directory is often world-writable, so every other file there may be someone else's:
//! before, any `attune-<N>-*` of a dead pid was removed, whoever owned it.

use attune_sys::mem;
use std::os::unix::fs::{symlink, MetadataExt};

/// A pid that is not running: past the kernel's limit.
const DEAD: i32 = 4_194_304 + 7;

#[test]
fn only_this_users_files_of_dead_processes_go() {
    let dir = std::env::temp_dir().join(format!("attune-stale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = |n: &str| dir.join(n);
    let touch = |n: &str| std::fs::write(f(n), b"x").unwrap();
    touch(&format!("attune-{DEAD}-12")); // ours, dead: removed
    touch(&format!("attune-{}-12", std::process::id())); // ours, alive: kept
    touch(&format!("attune-{DEAD}-notes")); // not the fallback's name: kept
    touch(&format!("attune-{DEAD}")); // idem
    touch("unrelated");
    symlink("/etc/hostname", f(&format!("attune-{DEAD}-13"))).unwrap(); // a link: kept
    let theirs = format!("attune-{DEAD}-14");
    touch(&theirs);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        // Another user's file (root can make one): kept.
        std::os::unix::fs::chown(f(&theirs), Some(65534), Some(65534)).unwrap();
    }
    let removed = mem::clean_stale_files(&dir);
    let left: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let expect_removed = if root { 1 } else { 2 };
    assert_eq!(removed, expect_removed, "left: {left:?}");
    assert!(!left.contains(&format!("attune-{DEAD}-12")));
    for kept in [
        format!("attune-{}-12", std::process::id()),
        format!("attune-{DEAD}-notes"),
        format!("attune-{DEAD}"),
        format!("attune-{DEAD}-13"),
        "unrelated".to_string(),
    ] {
        assert!(left.contains(&kept), "{kept} was removed");
    }
    if root {
        assert!(left.contains(&theirs), "another user's file was removed");
        assert_eq!(std::fs::symlink_metadata(f(&theirs)).unwrap().uid(), 65534);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The same rule for `attune run`'s statistics directories: only directories, only ours,
/// only of launchers that are gone; what they hold goes with them.
#[test]
fn stale_run_directories_of_this_user_go_with_their_content() {
    let dir = std::env::temp_dir().join(format!("attune-stale-dirs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gone = dir.join(format!("attune-run-{DEAD}-0"));
    std::fs::create_dir(&gone).unwrap();
    std::fs::write(gone.join("proc-1-2.json"), b"{}").unwrap();
    let live = dir.join(format!("attune-run-{}-0", std::process::id()));
    std::fs::create_dir(&live).unwrap();
    let file = dir.join(format!("attune-run-{DEAD}-1"));
    std::fs::write(&file, b"x").unwrap();
    assert_eq!(mem::remove_stale(&dir, "attune-run-", true), 1);
    assert!(!gone.exists() && live.exists() && file.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
