//! The execution history (`~/.local/state/attune/history.json`), which `attune run` reads
//! before every run of a program without flags. A user's own file, but one that another
//! version, a crash or a hand edit may have left in any state.
//!
//! Input: the file's text. Checked: no panic; a run it yields passes to the program's
//! processes intact: its regions, encoded for `ATTUNE_PREDICT`, decode in the interposer.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<String> = vec!["-n".into(), "1000".into(), "x".into()];
    for (key, n) in [
        ("/bin/prog", 0),
        ("/bin/prog", 1),
        ("/bin/prog", 2),
        ("/usr/bin/python3", 3),
    ] {
        if let Ok(Some((run, _))) = attune_cli::history::lookup_text(text, key, &args[..n]) {
            let env = attune_policy::predict::encode(&run.regions);
            let back = attune_policy::predict::decode(&env);
            assert!(
                back.is_ok(),
                "history run {env:?} refused by the interposer: {back:?}"
            );
        }
    }
});
