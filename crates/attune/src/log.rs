//! Messages on stderr, written with one write(2) so they are safe from any thread.

use std::sync::atomic::{AtomicU8, Ordering};

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" => Ok(Level::Error),
            "warn" | "warning" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" => Ok(Level::Debug),
            o => Err(format!(
                "'{o}' is not a log level (error, warn, info, debug)"
            )),
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Ordering::Relaxed)
}

pub fn emit(l: Level, msg: &str) {
    if enabled(l) {
        let line = format!(
            "attune: {}: {msg}\n",
            match l {
                Level::Error => "error",
                Level::Warn => "warning",
                Level::Info => "info",
                Level::Debug => "debug",
            }
        );
        attune_sys::os::write_stderr(line.as_bytes());
    }
}

/// Signal-safe: writes a fixed message without formatting or allocation.
pub fn emit_static(msg: &'static str) {
    attune_sys::os::write_stderr(msg.as_bytes());
}

/// The message is formatted only when its level is shown: formatting an `io::Error`
/// calls strerror, which takes the C library's locale lock to translate it, and the
/// runtime may be running inside a C library call that holds that lock (its start from a
/// malloc in setlocale: a silent info message there hung bash).
#[macro_export]
macro_rules! warn {
    ($($a:tt)*) => {
        if $crate::log::enabled($crate::log::Level::Warn) {
            $crate::log::emit($crate::log::Level::Warn, &format!($($a)*))
        }
    };
}
#[macro_export]
macro_rules! info {
    ($($a:tt)*) => {
        if $crate::log::enabled($crate::log::Level::Info) {
            $crate::log::emit($crate::log::Level::Info, &format!($($a)*))
        }
    };
}
