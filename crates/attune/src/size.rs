//! Sizes as users write them: "64K", "2M", "1.5G", "4096", "50%".

/// Parses a byte size with an optional K/M/G/T suffix (powers of 1024, optional "iB"/"B").
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    let upper = t.to_ascii_uppercase();
    let stripped = upper.trim_end_matches("IB").trim_end_matches('B');
    let (num, mult) = match stripped.chars().last() {
        Some('K') => (&stripped[..stripped.len() - 1], 1u64 << 10),
        Some('M') => (&stripped[..stripped.len() - 1], 1 << 20),
        Some('G') => (&stripped[..stripped.len() - 1], 1 << 30),
        Some('T') => (&stripped[..stripped.len() - 1], 1 << 40),
        _ => (stripped, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 4096, 64K, 2M, 1.5G)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "'{s}' is not a size: it must be a non-negative number"
        ));
    }
    let bytes = v * mult as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("'{s}' is too large"));
    }
    Ok(bytes as u64)
}

/// Parses a size or a percentage of `total` ("50%").
pub fn parse_size_or_percent(s: &str, total: u64) -> Result<u64, String> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not a percentage"))?;
        if !(0.0..=100.0).contains(&v) {
            return Err(format!("'{s}': a percentage must be between 0% and 100%"));
        }
        return Ok((total as f64 * v / 100.0) as u64);
    }
    parse_size(t)
}

/// Formats bytes for people: "1.5 GiB".
pub fn human(bytes: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let ok = [
            ("4096", 4096),
            ("4K", 4096),
            ("4k", 4096),
            ("2M", 2 << 20),
            ("1.5G", 3 << 29),
            ("1GiB", 1 << 30),
            ("8KB", 8192),
        ];
        for (s, v) in ok {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        for s in ["", "abc", "-1K", "12Q", "K"] {
            assert!(parse_size(s).is_err(), "{s}");
        }
    }

    #[test]
    fn percent() {
        assert_eq!(parse_size_or_percent("50%", 1000), Ok(500));
        assert!(parse_size_or_percent("150%", 1000).is_err());
        assert_eq!(parse_size_or_percent("1K", 1000), Ok(1024));
    }
}
