//! `mem::dontneed_ranges` drops exactly the ranges it is given (one `process_madvise`, or
//! one `madvise` a range where the kernel refuses the batch), in this process only: a
//! forked child's call, with the pidfd it inherited, never reaches its parent's pages.
//! Real mappings; plain anonymous memory (a dropped page reads as zero).

use attune_sys::mem;

const PAGES: usize = 64;

/// The tests run one at a time: a fork while another test thread holds the release's
/// process-wide lock would leave the child waiting on it forever.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn word(page: usize) -> u64 {
    0xD0_0000_0000 | page as u64
}

fn read(a: usize) -> u64 {
    // SAFETY: `a` is inside a private anonymous mapping this test owns.
    unsafe { std::ptr::read_volatile(a as *const u64) }
}

fn filled() -> (usize, usize) {
    let ps = attune_sys::page_size();
    let base = mem::map_anon(PAGES * ps, false).expect("mmap");
    for p in 0..PAGES {
        // SAFETY: as in `read`.
        unsafe { std::ptr::write_volatile((base + p * ps) as *mut u64, word(p)) };
    }
    (base, ps)
}

/// Every third page, and one run of three pages, dropped.
fn dropped(p: usize) -> bool {
    p % 3 == 0 || (40..43).contains(&p)
}

fn ranges(base: usize, ps: usize) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = (0..PAGES)
        .filter(|p| p % 3 == 0 && !(40..43).contains(p))
        .map(|p| (base + p * ps, ps))
        .collect();
    v.push((base + 40 * ps, 3 * ps));
    v
}

fn check(base: usize, ps: usize) -> Vec<usize> {
    (0..PAGES)
        .filter(|&p| read(base + p * ps) != if dropped(p) { 0 } else { word(p) })
        .collect()
}

#[test]
fn drops_exactly_the_ranges() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (base, ps) = filled();
    mem::dontneed_ranges(&ranges(base, ps));
    assert_eq!(
        check(base, ps),
        Vec::<usize>::new(),
        "pages with the wrong content"
    );
    // Twice in a row is harmless (a range may be released again).
    mem::dontneed_ranges(&ranges(base, ps));
    assert_eq!(check(base, ps), Vec::<usize>::new());
    mem::dontneed_ranges(&[]);
    let _ = mem::unmap(base, PAGES * ps);
}

#[test]
fn a_forked_child_drops_its_own_pages_only() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // The parent opens its pidfd first, so the child inherits one naming the parent.
    let (warm, ps) = filled();
    mem::dontneed_ranges(&[(warm, ps)]);
    let (base, _) = filled();
    // SAFETY: the child only calls async-signal-safe code paths of this crate and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        mem::dontneed_ranges(&ranges(base, ps));
        let ok = check(base, ps).is_empty();
        // SAFETY: ends the child without running the test harness's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut st = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "child: status {st:#x}"
    );
    let lost: Vec<usize> = (0..PAGES)
        .filter(|&p| read(base + p * ps) != word(p))
        .collect();
    assert_eq!(
        lost,
        Vec::<usize>::new(),
        "the child's release reached the parent"
    );
    let _ = mem::unmap(base, PAGES * ps);
    let _ = mem::unmap(warm, PAGES * ps);
}
