//! `UFFD_FEATURE_EVENT_REMOVE`: what the runtime's handling of a program's own discards
//! (`attune::paging::removes`) relies on, checked against the real kernel.
//!
//! * A `madvise(MADV_DONTNEED)` of a registered range is reported with its start and end,
//!   the caller waits until the report is read, and the pages are dropped after it: a
//!   handler that reads the report still finds them mapped, and finds them gone once the
//!   caller returned.
//! * While a report waits to be read, the kernel refuses to place pages in that
//!   descriptor's ranges (EAGAIN): the one reader must read reports even while it places.
//!
//! Real userfaultfd, real page tables; nothing touches a registered page that is missing.

use attune_sys::mem;
use attune_sys::uffd::{feature, mode, Delivery, Msg, Uffd, EVENT_REMOVE};
use attune_sys::Errno;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const PAGES: usize = 8;

/// A registered range with every page placed (word `page + 1` in each), and its uffd.
fn placed() -> Option<(Uffd, usize)> {
    let uffd = match Uffd::open(Delivery::Thread, feature::EVENT_REMOVE) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("skip: userfaultfd with EVENT_REMOVE: {}", e.errno);
            return None;
        }
    };
    let ps = attune_sys::page_size();
    let base = mem::map_anon(PAGES * ps, false).unwrap();
    uffd.register(base, PAGES * ps, mode::MISSING).unwrap();
    let buf = mem::map_anon(ps, false).unwrap();
    for p in 0..PAGES {
        mem::with_words_mut(buf, 8, |w| w[0] = p as u64 + 1);
        uffd.copy(base + p * ps, buf, ps, true).unwrap();
    }
    let _ = mem::unmap(buf, ps);
    Some((uffd, base))
}

/// Waits up to 5 s for one message.
fn read_one(uffd: &Uffd) -> Msg {
    let mut msgs = [Msg::default(); 4];
    for _ in 0..5000 {
        if let Ok(n) = uffd.read_msgs(&mut msgs) {
            if n > 0 {
                assert_eq!(n, 1, "one report for one call");
                return msgs[0];
            }
        }
        attune_sys::os::sleep_us(1000);
    }
    panic!("no report within 5 s");
}

#[test]
fn a_discard_is_reported_before_the_kernel_drops_the_pages() {
    let Some((uffd, base)) = placed() else { return };
    let ps = attune_sys::page_size();
    let (lo, hi) = (base + 2 * ps, base + 5 * ps);
    let returned = Arc::new(AtomicBool::new(false));
    let r = returned.clone();
    let caller = std::thread::spawn(move || {
        // The system call itself, as Go's runtime makes it (libc's wrapper is the same).
        let rc = unsafe { libc::syscall(libc::SYS_madvise, lo, hi - lo, libc::MADV_DONTNEED) };
        r.store(true, Ordering::SeqCst);
        rc
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !returned.load(Ordering::SeqCst),
        "the caller waits for the report's read"
    );
    let m = read_one(&uffd);
    assert_eq!(m.event, EVENT_REMOVE);
    assert_eq!((m.arg[0] as usize, m.arg[1] as usize), (lo, hi));
    // Read, not yet dropped: the kernel drops them when the caller runs again.
    assert_eq!(caller.join().unwrap(), 0);
    for p in 0..PAGES {
        let gone = (2..5).contains(&p);
        assert_eq!(mem::page_present(base + p * ps), !gone, "page {p}");
        if !gone {
            assert_eq!(mem::with_words(base + p * ps, 8, |w| w[0]), p as u64 + 1);
        }
    }
    let _ = mem::unmap(base, PAGES * ps);
}

#[test]
fn a_report_waiting_to_be_read_holds_every_placement_back() {
    let Some((uffd, base)) = placed() else { return };
    let ps = attune_sys::page_size();
    let uffd = Arc::new(uffd);
    // Page 0 dropped first (its report read at once), to have a missing page to place.
    let u = uffd.clone();
    let first = std::thread::spawn(move || unsafe {
        libc::syscall(libc::SYS_madvise, base, ps, libc::MADV_DONTNEED)
    });
    assert_eq!(read_one(&u).event, EVENT_REMOVE);
    assert_eq!(first.join().unwrap(), 0);
    // A second report, not read: placing page 0 is refused meanwhile.
    let second = std::thread::spawn(move || unsafe {
        libc::syscall(libc::SYS_madvise, base + 4 * ps, ps, libc::MADV_DONTNEED)
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    let zero = mem::map_anon(ps, false).unwrap();
    assert_eq!(uffd.copy(base, zero, ps, true), Err(Errno(libc::EAGAIN)));
    // Read: placement works again.
    assert_eq!(read_one(&uffd).event, EVENT_REMOVE);
    assert_eq!(second.join().unwrap(), 0);
    assert_eq!(uffd.copy(base, zero, ps, true), Ok(ps));
    assert_eq!(mem::with_words(base, 8, |w| w[0]), 0);
    let _ = mem::unmap(zero, ps);
    let _ = mem::unmap(base, PAGES * ps);
}
