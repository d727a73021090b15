//! [`Resources`]: the resource dictionary, the one interface from a scaling config down to a
//! worker (`{"CPU": 1, "GPU": 1, "memory": "10GB", "custom": 2}`).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{AmountError, ByteSize, ByteSizeError, ResourceAmount};

/// Name of the CPU resource.
pub const CPU: &str = "CPU";
/// Name of the GPU resource.
pub const GPU: &str = "GPU";
/// Name of the memory resource, in bytes.
pub const MEMORY: &str = "memory";
/// Name of the object store memory resource, in bytes.
pub const OBJECT_STORE_MEMORY: &str = "object_store_memory";
/// The names that become dedicated actor options; every other name is a custom resource.
pub const RESERVED: [&str; 4] = [CPU, GPU, MEMORY, OBJECT_STORE_MEMORY];
/// Accelerators whose quantities above 1 must be whole (one device cannot be split across
/// several of a worker's units), as Ray's accelerator managers require.
pub const WHOLE_ABOVE_ONE: [&str; 5] = [GPU, "neuron_cores", "TPU", "NPU", "HPU"];

/// Whether `name` is one of the [`RESERVED`] resource names.
#[must_use]
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name)
}

/// Whether `name` is measured in bytes (`memory`, `object_store_memory`).
#[must_use]
pub fn is_byte_resource(name: &str) -> bool {
    name == MEMORY || name == OBJECT_STORE_MEMORY
}

/// The well-known resource names a user may mistype by case: the [`RESERVED`] names and
/// the accelerators of [`WHOLE_ABOVE_ONE`].
const WELL_KNOWN: [&str; 8] = [
    CPU,
    GPU,
    MEMORY,
    OBJECT_STORE_MEMORY,
    "neuron_cores",
    "TPU",
    "NPU",
    "HPU",
];

/// The well-known resource name that `name` differs from only by case (`cpu` → `CPU`,
/// `Memory` → `memory`), or `None` when `name` is well-known itself or like none of them.
///
/// Names are case-sensitive, so `cpu` is a custom resource that no node offers; a caller
/// can warn with the name that was most likely meant.
///
/// ```
/// use trainyard_resources::near_reserved_name;
///
/// assert_eq!(near_reserved_name("cpu"), Some("CPU"));
/// assert_eq!(near_reserved_name("CPU"), None);
/// assert_eq!(near_reserved_name("ssd"), None);
/// ```
#[must_use]
pub fn near_reserved_name(name: &str) -> Option<&'static str> {
    WELL_KNOWN
        .into_iter()
        .find(|known| *known != name && known.eq_ignore_ascii_case(name))
}

/// A resource dictionary: resource name → exact amount, ordered by name.
///
/// Names are case-sensitive as in Ray. `CPU`, `GPU`, `memory` and `object_store_memory`
/// are reserved; everything else (including `accelerator_type:A100`) is a custom resource.
/// `memory` and `object_store_memory` are whole numbers of bytes and accept units.
///
/// ```
/// use trainyard_resources::{Resources, ResourceAmount};
///
/// let from_json: Resources = r#"{"CPU": 1, "memory": "10GB"}"#.parse()?;
/// let from_text: Resources = "CPU=1,memory=10GB".parse()?;
/// assert_eq!(from_json, from_text);
/// assert_eq!(from_json.amount("memory"), ResourceAmount::from_units(10_000_000_000));
/// assert_eq!(from_text.to_string(), "CPU=1,memory=10000000000");
/// # Ok::<(), trainyard_resources::ResourceError>(())
/// ```
///
/// Cloning is cheap: clones share one map until one of them is changed (copy on write), so
/// a placement group of 100 000 identical bundles holds one map.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Resources(Arc<BTreeMap<String, ResourceAmount>>);

/// Why a resource dictionary, or one of its entries, is not acceptable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// The amount of `name` is not a valid quantity.
    #[error("invalid amount for resource `{name}`")]
    InvalidAmount {
        /// The resource.
        name: String,
        /// What is wrong with the amount.
        #[source]
        source: AmountError,
    },
    /// `memory` or `object_store_memory` is not a byte size.
    #[error("resource `{name}` must be a non-negative byte size such as 10000, 10GB or 1.5GiB")]
    InvalidByteSize {
        /// The resource.
        name: String,
        /// What is wrong with the size.
        #[source]
        source: ByteSizeError,
    },
    /// A byte resource was given a fractional amount programmatically.
    #[error("resource `{name}` must be a whole number of bytes, got {value}")]
    FractionalBytes {
        /// The resource.
        name: String,
        /// The amount given.
        value: ResourceAmount,
    },
    /// A GPU-like accelerator above 1 that is not whole.
    #[error("{name} quantities above 1 must be whole numbers, got {value}")]
    FractionalAccelerator {
        /// The accelerator resource.
        name: String,
        /// The amount given.
        value: ResourceAmount,
    },
    /// An entry with an empty name.
    #[error("resource names must not be empty")]
    EmptyName,
    /// A name that could not be written back as `NAME=AMOUNT` text.
    #[error(
        "resource name `{name}` must not contain `,` or `=`, begin with `{{`, nor begin or end with whitespace"
    )]
    InvalidName {
        /// The name.
        name: String,
    },
    /// A value that is neither a number nor a string.
    #[error("resource `{name}` must be a number or a string, got {found}")]
    WrongType {
        /// The resource.
        name: String,
        /// What was found instead (a JSON type name).
        found: String,
    },
    /// `K=V` text that is not a list of pairs.
    #[error(
        "invalid resources `{input}`: expected NAME=AMOUNT pairs separated by commas, such as CPU=1,memory=10GB"
    )]
    Syntax {
        /// The text given.
        input: String,
    },
    /// JSON text that is not an object of resources.
    #[error("invalid resources JSON: {reason}")]
    Json {
        /// The text given.
        input: String,
        /// What the JSON parser reported.
        reason: String,
    },
    /// A sum or product of amounts is too large.
    #[error("resource `{name}` overflows when added up")]
    Overflow {
        /// The resource.
        name: String,
    },
}

impl Resources {
    /// An empty dictionary.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces `name` (builder style).
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, amount: impl Into<ResourceAmount>) -> Self {
        Arc::make_mut(&mut self.0).insert(name.into(), amount.into());
        self
    }

    /// Adds or replaces `name`, returning the previous amount.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        amount: ResourceAmount,
    ) -> Option<ResourceAmount> {
        Arc::make_mut(&mut self.0).insert(name.into(), amount)
    }

    /// Removes `name`, returning its amount.
    pub fn remove(&mut self, name: &str) -> Option<ResourceAmount> {
        if self.0.contains_key(name) {
            Arc::make_mut(&mut self.0).remove(name)
        } else {
            None
        }
    }

    /// The amount of `name`, if present (it may be zero).
    #[must_use]
    pub fn get(&self, name: &str) -> Option<ResourceAmount> {
        self.0.get(name).copied()
    }

    /// The amount of `name`, zero when absent.
    #[must_use]
    pub fn amount(&self, name: &str) -> ResourceAmount {
        self.get(name).unwrap_or_default()
    }

    /// Whether `name` is present (even with a zero amount).
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every amount is zero (true for an empty dictionary).
    #[must_use]
    pub fn is_all_zero(&self) -> bool {
        self.0.values().all(|a| a.is_zero())
    }

    /// The entries, ordered by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, ResourceAmount)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The resource names, ordered.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The same dictionary without zero entries.
    #[must_use]
    pub fn without_zeros(mut self) -> Self {
        if !self.0.values().all(|a| !a.is_zero()) {
            Arc::make_mut(&mut self.0).retain(|_, a| !a.is_zero());
        }
        self
    }

    /// Keeps the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, ResourceAmount) -> bool) {
        if !self.0.iter().all(|(k, v)| keep(k, *v)) {
            Arc::make_mut(&mut self.0).retain(|k, v| keep(k, *v));
        }
    }

    /// Adds every amount of `other` to this dictionary.
    ///
    /// # Errors
    /// [`ResourceError::Overflow`] when a sum does not fit.
    pub fn checked_add_assign(&mut self, other: &Self) -> Result<(), ResourceError> {
        for (name, amount) in other.iter() {
            let map = Arc::make_mut(&mut self.0);
            // The name is copied only when it is new here.
            let slot = match map.get_mut(name) {
                Some(slot) => slot,
                None => map.entry(name.to_owned()).or_default(),
            };
            *slot = slot
                .checked_add(amount)
                .ok_or_else(|| ResourceError::Overflow {
                    name: name.to_owned(),
                })?;
        }
        Ok(())
    }

    /// Every amount multiplied by `times`.
    ///
    /// # Errors
    /// [`ResourceError::Overflow`] when a product does not fit.
    pub fn checked_mul(&self, times: u64) -> Result<Self, ResourceError> {
        self.iter()
            .map(|(name, amount)| {
                amount
                    .checked_mul(times)
                    .map(|a| (name.to_owned(), a))
                    .ok_or_else(|| ResourceError::Overflow {
                        name: name.to_owned(),
                    })
            })
            .collect()
    }

    /// Subtracts `other` from this dictionary when every amount is available; otherwise
    /// leaves it unchanged and returns the first resource that is short.
    pub fn try_take(&mut self, other: &Self) -> Result<(), String> {
        if let Some(short) = self.first_shortfall(other) {
            return Err(short.to_owned());
        }
        for (name, amount) in other.iter() {
            if let Some(slot) = Arc::make_mut(&mut self.0).get_mut(name) {
                *slot = slot.saturating_sub(amount);
            }
        }
        Ok(())
    }

    /// Whether `demand` fits into this dictionary, resource by resource.
    #[must_use]
    pub fn covers(&self, demand: &Self) -> bool {
        self.first_shortfall(demand).is_none()
    }

    /// The first resource of `demand` (by name) that this dictionary cannot cover.
    #[must_use]
    pub fn first_shortfall<'a>(&self, demand: &'a Self) -> Option<&'a str> {
        demand
            .iter()
            .find(|&(name, amount)| !amount.is_zero() && self.amount(name) < amount)
            .map(|(name, _)| name)
    }

    /// Checks the rules that apply per resource: no amount is above [`ResourceAmount::MAX`],
    /// byte resources are whole numbers, and GPU-like accelerators above 1 are whole.
    ///
    /// # Errors
    /// The first entry (by name) that breaks a rule.
    pub fn validate(&self) -> Result<(), ResourceError> {
        self.iter()
            .try_for_each(|(name, amount)| validate_entry(name, amount))
    }

    /// Parses one entry from user text: a byte size for byte resources, an amount otherwise.
    ///
    /// # Errors
    /// A [`ResourceError`] naming the resource and the value.
    pub fn parse_entry(name: &str, value: &str) -> Result<ResourceAmount, ResourceError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(ResourceError::EmptyName);
        }
        let amount = if is_byte_resource(name) {
            let size: ByteSize =
                value
                    .parse()
                    .map_err(|source| ResourceError::InvalidByteSize {
                        name: name.to_owned(),
                        source,
                    })?;
            let amount = ResourceAmount::from_units(size.bytes());
            if amount > ResourceAmount::MAX {
                return Err(ResourceError::InvalidAmount {
                    name: name.to_owned(),
                    source: AmountError::TooLarge(value.trim().to_owned()),
                });
            }
            amount
        } else {
            value
                .parse()
                .map_err(|source| ResourceError::InvalidAmount {
                    name: name.to_owned(),
                    source,
                })?
        };
        validate_entry(name, amount)?;
        Ok(amount)
    }

    /// Parses `NAME=AMOUNT,NAME=AMOUNT` text (whitespace around items is ignored; an empty
    /// text is an empty dictionary).
    ///
    /// # Errors
    /// [`ResourceError::Syntax`] for text that is not pairs, or the entry's own error.
    pub fn parse_pairs(text: &str) -> Result<Self, ResourceError> {
        let mut out = Self::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = item.split_once('=').ok_or_else(|| ResourceError::Syntax {
                input: text.to_owned(),
            })?;
            let amount = Self::parse_entry(name, value)?;
            out.insert(name.trim(), amount);
        }
        Ok(out)
    }

    /// Parses a JSON object such as `{"CPU": 1, "memory": "10GB"}`.
    ///
    /// # Errors
    /// [`ResourceError::Json`] with the parser's explanation, which names the entry at fault.
    pub fn parse_json(text: &str) -> Result<Self, ResourceError> {
        serde_json::from_str(text).map_err(|e| ResourceError::Json {
            input: text.to_owned(),
            reason: e.to_string(),
        })
    }
}

fn validate_entry(name: &str, amount: ResourceAmount) -> Result<(), ResourceError> {
    if name.trim().is_empty() {
        return Err(ResourceError::EmptyName);
    }
    // A first name that began with `{` would make the text look like JSON.
    if name.trim() != name || name.contains([',', '=']) || name.starts_with('{') {
        return Err(ResourceError::InvalidName {
            name: name.to_owned(),
        });
    }
    if amount > ResourceAmount::MAX {
        return Err(ResourceError::InvalidAmount {
            name: name.to_owned(),
            source: AmountError::TooLarge(amount.to_string()),
        });
    }
    if is_byte_resource(name) && !amount.is_whole() {
        return Err(ResourceError::FractionalBytes {
            name: name.to_owned(),
            value: amount,
        });
    }
    if WHOLE_ABOVE_ONE.contains(&name) && amount > ResourceAmount::ONE && !amount.is_whole() {
        return Err(ResourceError::FractionalAccelerator {
            name: name.to_owned(),
            value: amount,
        });
    }
    Ok(())
}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.iter()).finish()
    }
}

impl fmt::Display for Resources {
    /// `NAME=AMOUNT` pairs joined by commas, which [`FromStr`] parses back. With `{:#}`,
    /// byte resources carry units (`memory=10GB`), which parse back as well.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, amount)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match amount.as_whole_u64() {
                Some(bytes) if f.alternate() && is_byte_resource(name) => {
                    write!(f, "{name}={:#}", ByteSize::new(bytes))?;
                }
                _ => write!(f, "{name}={amount}")?,
            }
        }
        Ok(())
    }
}

impl Resources {
    /// The dictionary as a person reads it: `NAME=AMOUNT` pairs joined by commas, byte
    /// resources in [`ByteSize::human`]'s rendering (`memory=23.5GiB`), which may be rounded.
    /// The exact forms are `{}` and `{:#}`, and JSON.
    ///
    /// ```
    /// use trainyard_resources::Resources;
    ///
    /// let node: Resources = "CPU=0,memory=25276063744".parse()?;
    /// assert_eq!(node.human().to_string(), "CPU=0,memory=23.5GiB");
    /// assert_eq!(format!("{node:#}"), "CPU=0,memory=24683656KiB");
    /// # Ok::<(), trainyard_resources::ResourceError>(())
    /// ```
    #[must_use]
    pub fn human(&self) -> HumanResources<'_> {
        HumanResources(self)
    }
}

/// A [`Resources`] dictionary shown as a person reads it; see [`Resources::human`].
#[derive(Debug, Clone, Copy)]
pub struct HumanResources<'a>(&'a Resources);

impl fmt::Display for HumanResources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, amount)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match amount.as_whole_u64() {
                Some(bytes) if is_byte_resource(name) => {
                    write!(f, "{name}={}", ByteSize::new(bytes).human())?;
                }
                _ => write!(f, "{name}={amount}")?,
            }
        }
        Ok(())
    }
}

impl FromStr for Resources {
    type Err = ResourceError;

    /// A JSON object (text starting with `{`) or `NAME=AMOUNT` pairs.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim_start().starts_with('{') {
            Self::parse_json(text)
        } else {
            Self::parse_pairs(text)
        }
    }
}

impl<K: Into<String>> FromIterator<(K, ResourceAmount)> for Resources {
    fn from_iter<I: IntoIterator<Item = (K, ResourceAmount)>>(iter: I) -> Self {
        Self(Arc::new(
            iter.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        ))
    }
}

impl<'a> IntoIterator for &'a Resources {
    type Item = (&'a String, &'a ResourceAmount);
    type IntoIter = std::collections::btree_map::Iter<'a, String, ResourceAmount>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Serialize for Resources {
    /// A map of names to amounts (JSON numbers).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, amount) in self.0.iter() {
            map.serialize_entry(name, amount)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Resources {
    /// A map whose values are numbers or strings; byte resources accept units. Each entry is
    /// validated as it is read, and errors name the entry.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ResourcesVisitor)
    }
}

struct ResourcesVisitor;

impl<'de> Visitor<'de> for ResourcesVisitor {
    type Value = Resources;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a map of resource names to amounts, such as {\"CPU\": 1, \"memory\": \"10GB\"}",
        )
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Resources::new();
        while let Some(name) = map.next_key::<String>()? {
            let value: EntryValue = map.next_value()?;
            let amount = value
                .into_amount(&name)
                .map_err(|e| de::Error::custom(crate::ErrorChain(&e)))?;
            out.insert(name, amount);
        }
        Ok(out)
    }
}

/// A dictionary value before it is known which resource it belongs to.
enum EntryValue {
    Text(String),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Other(&'static str),
}

impl EntryValue {
    fn into_amount(self, name: &str) -> Result<ResourceAmount, ResourceError> {
        let text = match self {
            Self::Text(text) => text,
            Self::Unsigned(v) => v.to_string(),
            Self::Signed(v) => v.to_string(),
            Self::Float(v) if !v.is_finite() => {
                return Err(ResourceError::InvalidAmount {
                    name: name.to_owned(),
                    source: AmountError::NotFinite(v),
                });
            }
            Self::Float(v) => v.to_string(),
            Self::Other(found) => {
                return Err(ResourceError::WrongType {
                    name: name.to_owned(),
                    found: found.to_owned(),
                });
            }
        };
        let amount = Resources::parse_entry(name, &text)?;
        // `parse_entry` trims the name of a `NAME=AMOUNT` pair; a map's key is used as it is.
        validate_entry(name, amount)?;
        Ok(amount)
    }
}

impl<'de> Deserialize<'de> for EntryValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = EntryValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<EntryValue, E> {
                Ok(EntryValue::Unsigned(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<EntryValue, E> {
                Ok(EntryValue::Signed(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<EntryValue, E> {
                Ok(EntryValue::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<EntryValue, E> {
                Ok(EntryValue::Text(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<EntryValue, E> {
                Ok(EntryValue::Other("a boolean"))
            }
            fn visit_unit<E: de::Error>(self) -> Result<EntryValue, E> {
                Ok(EntryValue::Other("null"))
            }
            fn visit_none<E: de::Error>(self) -> Result<EntryValue, E> {
                Ok(EntryValue::Other("null"))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<EntryValue, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(EntryValue::Other("a list"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EntryValue, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(EntryValue::Other("a map"))
            }
        }
        deserializer.deserialize_any(EntryVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_differ_from_a_well_known_one_only_by_case_are_recognised() {
        for (name, meant) in [
            ("cpu", "CPU"),
            ("Cpu", "CPU"),
            ("gpu", "GPU"),
            ("Memory", "memory"),
            ("MEMORY", "memory"),
            ("object_store_MEMORY", "object_store_memory"),
            ("Neuron_Cores", "neuron_cores"),
            ("tpu", "TPU"),
            ("npu", "NPU"),
            ("hpu", "HPU"),
        ] {
            assert_eq!(near_reserved_name(name), Some(meant), "{name}");
        }
    }

    #[test]
    fn well_known_and_unrelated_names_are_not_near_misses() {
        for name in [
            "CPU",
            "GPU",
            "memory",
            "object_store_memory",
            "neuron_cores",
            "TPU",
            "NPU",
            "HPU",
            "ssd",
            "cpus",
            "accelerator_type:A100",
            "",
        ] {
            assert_eq!(near_reserved_name(name), None, "{name}");
        }
    }

    fn res(text: &str) -> Resources {
        text.parse().unwrap()
    }

    #[test]
    fn json_and_pairs_agree_and_display_round_trips() {
        let json =
            res(r#"{"CPU": 1, "GPU": 0.5, "memory": "1.5 GiB", "accelerator_type:A100": 0.001}"#);
        let pairs = res("CPU=1, GPU=0.5, memory=1.5GiB, accelerator_type:A100=0.001");
        assert_eq!(json, pairs);
        assert_eq!(json.to_string().parse::<Resources>().unwrap(), json);
        assert_eq!(
            json.amount(MEMORY),
            ResourceAmount::from_units(1_610_612_736)
        );
    }

    #[test]
    fn names_are_case_sensitive() {
        let r = res("cpu=1,CPU=2");
        assert_eq!(r.len(), 2);
        assert_eq!(r.amount("cpu"), ResourceAmount::ONE);
    }

    #[test]
    fn memory_is_bytes_with_units() {
        assert_eq!(
            res(r#"{"memory": 10000}"#).amount(MEMORY),
            ResourceAmount::from_units(10_000)
        );
        assert_eq!(
            res(r#"{"memory": 1e9}"#).amount(MEMORY),
            ResourceAmount::from_units(1_000_000_000)
        );
        assert_eq!(
            res("object_store_memory=2KB").amount(OBJECT_STORE_MEMORY),
            ResourceAmount::from_units(2000)
        );
    }

    #[test]
    fn errors_name_the_key_and_the_value() {
        let err = "CPU=-1".parse::<Resources>().unwrap_err();
        assert_eq!(
            err,
            ResourceError::InvalidAmount {
                name: "CPU".into(),
                source: AmountError::Negative("-1".into())
            }
        );
        let err = "GPU=1.5".parse::<Resources>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "GPU quantities above 1 must be whole numbers, got 1.5"
        );
        let err = "custom=0.00001".parse::<Resources>().unwrap_err();
        assert!(matches!(
            err,
            ResourceError::InvalidAmount {
                source: AmountError::TooPrecise(_),
                ..
            }
        ));
        let err = "memory=ten GB".parse::<Resources>().unwrap_err();
        assert!(matches!(&err, ResourceError::InvalidByteSize { name, .. } if name == "memory"));
        let err = r#"{"memory": "ten GB"}"#.parse::<Resources>().unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("`memory`") && text.contains("ten GB"),
            "{text}"
        );
        let err = r#"{"CPU": true}"#.parse::<Resources>().unwrap_err();
        assert!(
            err.to_string()
                .contains("resource `CPU` must be a number or a string, got a boolean")
        );
        assert!(matches!(
            "CPU".parse::<Resources>(),
            Err(ResourceError::Syntax { .. })
        ));
        assert!(matches!(
            "=1".parse::<Resources>(),
            Err(ResourceError::EmptyName)
        ));
    }

    #[test]
    fn whole_gpus_at_or_below_one_may_be_fractional() {
        assert!("GPU=0.5".parse::<Resources>().is_ok());
        assert!("GPU=2".parse::<Resources>().is_ok());
        assert!("neuron_cores=2.5".parse::<Resources>().is_err());
        assert!("custom=2.5".parse::<Resources>().is_ok());
        let built = Resources::new().with(GPU, "1.5".parse::<ResourceAmount>().unwrap());
        assert!(built.validate().is_err());
    }

    #[test]
    fn names_that_could_not_be_written_back_as_pairs_are_refused() {
        for json in [
            r#"{"C,U": 1}"#,
            r#"{"a=b": 1}"#,
            r#"{" CPU": 1}"#,
            r#"{"GPU ": 1}"#,
            r#"{"{x": 1}"#,
        ] {
            assert!(
                matches!(Resources::parse_json(json), Err(ResourceError::Json { .. })),
                "{json}"
            );
        }
        for name in ["a,b", "{\"CPE\":CPU"] {
            assert!(
                matches!(
                    Resources::parse_entry(name, "1"),
                    Err(ResourceError::InvalidName { .. })
                ),
                "{name}"
            );
        }
        let fine = Resources::parse_json(r#"{"accelerator_type:A100": 0.001}"#).expect("valid");
        assert_eq!(
            fine.to_string().parse::<Resources>().expect("parses back"),
            fine
        );
    }

    #[test]
    fn take_is_all_or_nothing() {
        let mut free = res("CPU=4,memory=1000");
        assert_eq!(
            free.try_take(&res("CPU=2,memory=2000")),
            Err("memory".to_owned())
        );
        assert_eq!(free, res("CPU=4,memory=1000"));
        free.try_take(&res("CPU=2,memory=1000")).unwrap();
        assert_eq!(free, res("CPU=2,memory=0"));
        assert!(free.covers(&res("CPU=2,custom=0")));
        assert!(!free.covers(&res("custom=1")));
    }
}
