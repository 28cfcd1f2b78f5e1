//! The daemon protocol's framing and messages, as the daemon and the runtimes read them.
//!
//! Input: bytes as they arrive on a socket, cut into reads at the positions the first
//! byte picks. Checked: no panic; a frame is taken only whole; every message that decodes
//! encodes to a frame of at most `MAX_FRAME` that decodes to the same message.
#![no_main]

use attune_proto::{FrameReader, Reply, Request};
use libfuzzer_sys::fuzz_target;

fn round_trip<T>(msg: &T)
where
    T: serde::Serialize + for<'de> serde::Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let frame = attune_proto::encode(msg).expect("a decoded message encodes");
    let mut r = FrameReader::default();
    r.feed(&frame);
    let (again, fds) = r
        .next::<T>(|_| 0)
        .expect("a whole frame is taken")
        .expect("an encoded message decodes");
    assert!(fds.is_empty());
    assert_eq!(&again, msg);
}

fn drain<T>(data: &[u8], step: usize, fds_of: impl Fn(&T) -> usize)
where
    T: serde::Serialize + for<'de> serde::Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let mut r = FrameReader::default();
    for piece in data.chunks(step.max(1)) {
        r.feed(piece);
        loop {
            match r.next::<T>(&fds_of) {
                None => break,
                // No descriptors were received, so a message that announces some is refused.
                Some(Ok((msg, _))) => round_trip(&msg),
                Some(Err(_)) => return,
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    drain::<Request>(rest, cut as usize + 1, Request::fds);
    drain::<Reply>(rest, cut as usize + 1, Reply::fds);
});
