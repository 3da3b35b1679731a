//! Kubernetes resource quantities (`128Mi`, `1G`, `1.5Gi`, `1024`, `500m`).

use serde::Deserialize;

/// A quantity kept as written and read on demand, so an error can quote what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(pub String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("unknown unit {unit:?} in quantity {text:?}")]
    UnknownUnit { unit: String, text: String },
    #[error("{text:?} is not a quantity (e.g. 128Mi, 1Gi, 2G)")]
    NotANumber { text: String },
    #[error("quantity {text:?} is out of range")]
    OutOfRange { text: String },
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        // YAML writes `cpu: 2` as a number and `memory: 1Gi` as a string: accept both.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(u64),
            Float(f64),
        }
        Ok(Quantity(match Raw::deserialize(de)? {
            Raw::Text(s) => s,
            Raw::Int(n) => n.to_string(),
            Raw::Float(f) => f.to_string(),
        }))
    }
}

impl Quantity {
    /// The quantity as a number of units (bytes for memory, cores for CPU).
    pub(crate) fn value(&self) -> Result<f64, QuantityError> {
        let text = self.0.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(split);
        let multiplier: f64 = match suffix {
            "" => 1.0,
            "m" => 1e-3,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "E" => 1e18,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024f64.powi(4),
            "Pi" => 1024f64.powi(5),
            "Ei" => 1024f64.powi(6),
            other => {
                return Err(QuantityError::UnknownUnit {
                    unit: other.into(),
                    text: text.into(),
                })
            }
        };
        let value: f64 = number
            .parse()
            .map_err(|_| QuantityError::NotANumber { text: text.into() })?;
        let total = value * multiplier;
        // u64::MAX as f64 rounds up to 2^64, which is itself out of range (16Ei).
        if !total.is_finite() || total < 0.0 || total >= u64::MAX as f64 {
            return Err(QuantityError::OutOfRange { text: text.into() });
        }
        Ok(total)
    }

    /// The quantity in bytes (or plain units), rounded up to a whole number.
    pub(crate) fn to_bytes(&self) -> Result<u64, QuantityError> {
        Ok(self.value()?.ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let q = |s: &str| Quantity(s.into()).to_bytes();
        assert_eq!(q("128Mi"), Ok(128 << 20));
        assert_eq!(q("1G"), Ok(1_000_000_000));
        assert_eq!(q("1.5Gi"), Ok(3 << 29));
        assert_eq!(q("1024"), Ok(1024));
        assert_eq!(q("2k"), Ok(2000));
        assert!(q("Gi").is_err());
        assert!(q("1.2.3Mi").is_err());
        assert!(q("-1Mi").is_err());
    }

    #[test]
    fn every_suffix_by_its_multiplier() {
        let table: [(&str, u64); 12] = [
            ("1k", 1_000),
            ("1M", 1_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1Ki", 1_024),
            ("1Mi", 1_048_576),
            ("1Gi", 1_073_741_824),
            ("1Ti", 1_099_511_627_776),
            ("1Pi", 1_125_899_906_842_624),
            ("1Ei", 1_152_921_504_606_846_976),
        ];
        for (text, bytes) in table {
            assert_eq!(Quantity(text.into()).to_bytes(), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn millis_round_up_to_whole_units() {
        assert_eq!(Quantity("500m".into()).value(), Ok(0.5));
        assert_eq!(Quantity("500m".into()).to_bytes(), Ok(1));
        assert_eq!(Quantity(" 2 ".into()).to_bytes(), Ok(2));
    }

    #[test]
    fn errors_quote_what_was_written() {
        assert_eq!(
            Quantity("12Qi".into()).value(),
            Err(QuantityError::UnknownUnit {
                unit: "Qi".into(),
                text: "12Qi".into()
            })
        );
        assert_eq!(
            Quantity("Gi".into()).value(),
            Err(QuantityError::NotANumber { text: "Gi".into() })
        );
        assert_eq!(
            Quantity("99999E".into()).value(),
            Err(QuantityError::OutOfRange {
                text: "99999E".into()
            })
        );
    }

    #[test]
    fn numbers_in_yaml_are_quantities_too() {
        let q: Quantity = serde_yaml_ng::from_str("2").unwrap();
        assert_eq!(q, Quantity("2".into()));
        let q: Quantity = serde_yaml_ng::from_str("1.5").unwrap();
        assert_eq!(q.value(), Ok(1.5));
    }
}
