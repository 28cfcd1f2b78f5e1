//! Placement flags (IMME Table I) and their validation.

/// A set of placement flags. Values match `ATTUNE_LAT`… in `include/attune.h`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u32);

impl Flags {
    /// Latency-sensitive: fastest tier, part pinned and pre-faulted.
    pub const LAT: Flags = Flags(1);
    /// Bandwidth-intensive: spread over tiers in proportion to their bandwidth.
    pub const BW: Flags = Flags(2);
    /// Capacity: straight to the big tier.
    pub const CAP: Flags = Flags(4);
    /// Short-lived: fast tier, protected while it lives (see docs/design.md on "SHL").
    pub const SHL: Flags = Flags(8);
    pub const NONE: Flags = Flags(0);
    pub const ALL: u32 = 0xF;

    /// Parses raw bits; unknown bits are an error (the caller reports EINVAL).
    pub fn from_bits(bits: u32) -> Option<Flags> {
        if bits & !Self::ALL != 0 {
            None
        } else {
            Some(Flags(bits))
        }
    }
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// LAT and SHL pages are protected from eviction while pinned and moved last.
    pub fn is_protected(self) -> bool {
        self.0 & (Self::LAT.0 | Self::SHL.0) != 0
    }
    /// Atomic flags contained, in the order Algorithm 1 serves them.
    pub fn atoms(self) -> impl Iterator<Item = Flags> {
        [Self::LAT, Self::SHL, Self::BW, Self::CAP]
            .into_iter()
            .filter(move |f| self.contains(*f))
    }
    /// Parses "LAT,BW" (case-insensitive; "auto" or "" is empty).
    pub fn parse(s: &str) -> Result<Flags, String> {
        let mut f = 0;
        for part in s
            .split([',', '|', '+'])
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            f |= match part.to_ascii_uppercase().as_str() {
                "LAT" => 1,
                "BW" => 2,
                "CAP" => 4,
                "SHL" => 8,
                "AUTO" | "NONE" => 0,
                other => {
                    return Err(format!(
                        "unknown flag '{other}' (expected LAT, BW, CAP, SHL or auto)"
                    ))
                }
            };
        }
        Ok(Flags(f))
    }
}

impl std::fmt::Display for Flags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return write!(f, "auto");
        }
        let names: Vec<&str> = [
            (Self::LAT, "LAT"),
            (Self::BW, "BW"),
            (Self::CAP, "CAP"),
            (Self::SHL, "SHL"),
        ]
        .iter()
        .filter(|(fl, _)| self.contains(*fl))
        .map(|(_, n)| *n)
        .collect();
        write!(f, "{}", names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_bits_rejected() {
        assert_eq!(Flags::from_bits(0x10), None);
        assert_eq!(Flags::from_bits(0x5), Some(Flags(5)));
    }

    #[test]
    fn parse_and_display_round_trip() {
        for s in ["LAT", "BW,CAP", "LAT,BW,CAP,SHL", "auto"] {
            assert_eq!(Flags::parse(s).unwrap().to_string(), s);
        }
        assert!(Flags::parse("FAST").unwrap_err().contains("FAST"));
    }

    #[test]
    fn atoms_in_algorithm_order() {
        let f = Flags(Flags::CAP.0 | Flags::LAT.0);
        assert_eq!(f.atoms().collect::<Vec<_>>(), vec![Flags::LAT, Flags::CAP]);
    }
}
