//! Device pools: [`AcceleratorPool`] keeps the accelerator device ids (GPU, neuron cores,
//! ...) of a node, bundle or actor and how much of each is handed out. Whole free devices
//! serve amounts of 1 and more; the lowest-numbered device with room serves a fraction, so
//! two 0.5-GPU bundles share device `"0"` as in Ray.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trainyard_resources::{ResourceAmount, Resources};

/// One device of an [`AcceleratorPool`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Device {
    /// The device id (`"0"`, `"1"`, ...).
    id: String,
    /// How much of the device this pool may hand out (1 for a whole device).
    capacity: ResourceAmount,
    /// How much of it is not handed out.
    left: ResourceAmount,
}

impl Device {
    /// Whether the device is whole and nothing of it is handed out.
    fn is_free(&self) -> bool {
        self.left == self.capacity && self.capacity >= ResourceAmount::ONE
    }
}

/// How much of each of its devices a holder of `amount` takes (or gives back): the whole
/// device for amounts of 1 and more, the fraction of its one device otherwise.
fn share(amount: ResourceAmount) -> ResourceAmount {
    amount.min(ResourceAmount::ONE)
}

/// Indices of the devices in `list` that serve a nonzero `amount`: that many wholly free
/// devices for 1 and more, the first device with at least that much left for a fraction.
/// `None` when the devices cannot serve it (including a fractional amount above 1, which no
/// device layout can serve).
fn pick(list: &[Device], amount: ResourceAmount) -> Option<Vec<usize>> {
    if amount < ResourceAmount::ONE {
        return list.iter().position(|d| d.left >= amount).map(|i| vec![i]);
    }
    let wanted = usize::try_from(amount.as_whole_u64()?).ok()?;
    let free: Vec<usize> = (0..list.len())
        .filter(|&i| list[i].is_free())
        .take(wanted)
        .collect();
    (free.len() == wanted).then_some(free)
}

/// The accelerator devices of a node (or of a bundle), per resource, and how much of each
/// is handed out. Plain data: taking and giving back only change the pool itself.
///
/// ```
/// use std::collections::BTreeMap;
/// use trainyard_resources::Resources;
/// use trainyard_runtime::placement::AcceleratorPool;
///
/// let ids = BTreeMap::from([("GPU".to_owned(), vec!["0".to_owned(), "1".to_owned()])]);
/// let mut node = AcceleratorPool::new(&ids);
/// let half: Resources = "CPU=1,GPU=0.5".parse()?;
/// let a = node.take(&half).unwrap_or_default();
/// let b = node.take(&half).unwrap_or_default();
/// assert_eq!(a["GPU"], ["0"]);
/// assert_eq!(b["GPU"], ["0"]);
/// let whole = node.take(&"GPU=1".parse()?).unwrap_or_default();
/// assert_eq!(whole["GPU"], ["1"]);
/// # Ok::<(), trainyard_resources::ResourceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceleratorPool {
    devices: BTreeMap<String, Vec<Device>>,
}

impl AcceleratorPool {
    /// A pool of whole, unused devices: resource name → device ids, lowest-numbered first.
    #[must_use]
    pub fn new(ids: &BTreeMap<String, Vec<String>>) -> Self {
        Self::with_capacity(ids, |_| ResourceAmount::ONE)
    }

    /// The pool of a bundle (or actor) that holds `demand` on the devices `ids` it was given:
    /// whole devices for amounts of 1 and more, the fraction of its one device otherwise.
    #[must_use]
    pub fn for_holder(demand: &Resources, ids: &BTreeMap<String, Vec<String>>) -> Self {
        Self::with_capacity(ids, |name| share(demand.amount(name)))
    }

    /// Unused devices `ids`, each with the capacity that `capacity` gives its resource.
    fn with_capacity(
        ids: &BTreeMap<String, Vec<String>>,
        capacity: impl Fn(&str) -> ResourceAmount,
    ) -> Self {
        let devices = ids
            .iter()
            .map(|(name, ids)| {
                let capacity = capacity(name);
                let list = ids
                    .iter()
                    .map(|id| Device {
                        id: id.clone(),
                        capacity,
                        left: capacity,
                    })
                    .collect();
                (name.clone(), list)
            })
            .collect();
        Self { devices }
    }

    /// Hands out devices for every resource of `demand` that the pool knows (others are
    /// ignored), all or nothing. Returns the ids per resource (resources with a zero amount
    /// are left out), or `None` when some resource cannot be served.
    pub fn take(&mut self, demand: &Resources) -> Option<BTreeMap<String, Vec<String>>> {
        let mut chosen = Vec::new();
        for (name, amount) in demand.iter().filter(|(_, a)| !a.is_zero()) {
            let Some(list) = self.devices.get(name) else {
                continue;
            };
            chosen.push((name, amount, pick(list, amount)?));
        }
        let mut out = BTreeMap::new();
        for (name, amount, indices) in chosen {
            let list = self.devices.get_mut(name)?;
            let ids = indices
                .into_iter()
                .map(|i| {
                    list[i].left = list[i].left.saturating_sub(share(amount));
                    list[i].id.clone()
                })
                .collect();
            out.insert(name.to_owned(), ids);
        }
        Some(out)
    }

    /// Returns what [`AcceleratorPool::take`] handed out for `demand` as `ids`, all or
    /// nothing.
    ///
    /// # Errors
    /// When some device is not in the pool, or would get back more than was handed out of
    /// it (a double return); the pool is left unchanged then.
    pub fn give_back(
        &mut self,
        demand: &Resources,
        ids: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), GiveBackError> {
        let mut devices = self.devices.clone();
        for (name, taken) in ids {
            let share = share(demand.amount(name));
            for id in taken {
                let device = devices
                    .get_mut(name)
                    .and_then(|list| list.iter_mut().find(|d| &d.id == id))
                    .ok_or_else(|| GiveBackError::UnknownDevice {
                        resource: name.clone(),
                        id: id.clone(),
                    })?;
                device.left = device
                    .left
                    .checked_add(share)
                    .filter(|&left| left <= device.capacity)
                    .ok_or_else(|| GiveBackError::MoreThanHandedOut {
                        resource: name.clone(),
                        id: id.clone(),
                        returned: share,
                        handed_out: device.capacity.saturating_sub(device.left),
                    })?;
            }
        }
        self.devices = devices;
        Ok(())
    }
}

impl AcceleratorPool {
    /// Hands out exactly the devices `ids` for `demand`, all or nothing, by the same rules as
    /// [`AcceleratorPool::take`]: a fraction on one device with that much left, an amount of 1
    /// or more on that many wholly free devices. Resources the pool does not know are
    /// ignored. Returns whether it did.
    pub fn take_ids(&mut self, demand: &Resources, ids: &BTreeMap<String, Vec<String>>) -> bool {
        let mut chosen = Vec::new();
        for (name, amount) in demand.iter().filter(|(_, a)| !a.is_zero()) {
            let Some(list) = self.devices.get(name) else {
                continue;
            };
            let wanted = ids.get(name).map_or(&[][..], Vec::as_slice);
            let mut indices = Vec::with_capacity(wanted.len());
            for id in wanted {
                match list.iter().position(|d| &d.id == id) {
                    Some(i) if !indices.contains(&i) => indices.push(i),
                    _ => return false,
                }
            }
            let serves = if amount < ResourceAmount::ONE {
                indices.len() == 1 && list[indices[0]].left >= amount
            } else {
                amount.as_whole_u64().and_then(|n| usize::try_from(n).ok()) == Some(indices.len())
                    && indices.iter().all(|&i| list[i].is_free())
            };
            if !serves {
                return false;
            }
            chosen.push((name, amount, indices));
        }
        for (name, amount, indices) in chosen {
            if let Some(list) = self.devices.get_mut(name) {
                for i in indices {
                    list[i].left = list[i].left.saturating_sub(share(amount));
                }
            }
        }
        true
    }

    /// What each device of resource `name` has left, in steps, in device order; `None` for a
    /// resource the pool has no devices for.
    pub(super) fn lefts(&self, name: &str) -> Option<Vec<u128>> {
        self.devices
            .get(name)
            .map(|list| list.iter().map(|d| d.left.steps()).collect())
    }

    /// The ids of the devices of resource `name`, in device order.
    pub(super) fn ids(&self, name: &str) -> Option<Vec<&str>> {
        self.devices
            .get(name)
            .map(|list| list.iter().map(|d| d.id.as_str()).collect())
    }

    /// Marks up to `amount` of device `id` of resource `name` as handed out to a holder the
    /// pool does not track (another process, say); returns how much was taken: less than
    /// `amount` when the device has less left, zero for a device the pool lacks.
    pub fn take_device(&mut self, name: &str, id: &str, amount: ResourceAmount) -> ResourceAmount {
        let Some(device) = self
            .devices
            .get_mut(name)
            .and_then(|list| list.iter_mut().find(|d| d.id == id))
        else {
            return ResourceAmount::ZERO;
        };
        let taken = share(amount).min(device.left);
        device.left = device.left.saturating_sub(taken);
        taken
    }

    /// Gives back what [`AcceleratorPool::take_device`] took, up to the device's capacity.
    pub fn give_device(&mut self, name: &str, id: &str, amount: ResourceAmount) {
        if let Some(device) = self
            .devices
            .get_mut(name)
            .and_then(|list| list.iter_mut().find(|d| d.id == id))
        {
            device.left = device
                .left
                .checked_add(amount)
                .map_or(device.capacity, |left| left.min(device.capacity));
        }
    }

    /// Whether the pool has a device `id` for resource `name`.
    #[must_use]
    pub fn has_device(&self, name: &str, id: &str) -> bool {
        self.devices
            .get(name)
            .is_some_and(|list| list.iter().any(|d| d.id == id))
    }
}

/// Why [`AcceleratorPool::give_back`] refused what it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum GiveBackError {
    /// The pool has no such device.
    #[error("the pool has no {resource} device `{id}`")]
    UnknownDevice {
        /// The accelerator resource.
        resource: String,
        /// The device id.
        id: String,
    },
    /// More of a device is given back than is handed out of it.
    #[error(
        "{resource} device `{id}` gets {returned} back but only {handed_out} of it is handed out"
    )]
    MoreThanHandedOut {
        /// The accelerator resource.
        resource: String,
        /// The device id.
        id: String,
        /// What was given back.
        returned: ResourceAmount,
        /// What was handed out of the device before.
        handed_out: ResourceAmount,
    },
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::res;
    use super::*;

    fn gpus(ids: &[&str]) -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([(
            "GPU".to_owned(),
            ids.iter().map(|&id| id.to_owned()).collect(),
        )])
    }

    #[test]
    fn a_device_given_back_twice_is_refused_and_the_pool_is_unchanged() {
        let mut pool = AcceleratorPool::new(&gpus(&["0", "1"]));
        let one = res("GPU=1");
        let taken = pool.take(&one).unwrap();
        pool.give_back(&one, &taken).unwrap();
        let before = pool.clone();
        assert_eq!(
            pool.give_back(&one, &taken),
            Err(GiveBackError::MoreThanHandedOut {
                resource: "GPU".into(),
                id: "0".into(),
                returned: ResourceAmount::ONE,
                handed_out: ResourceAmount::ZERO,
            })
        );
        assert_eq!(pool, before);
        // One device handed out, one unknown: nothing is given back.
        let held = pool.take(&one).unwrap();
        let before = pool.clone();
        let with_unknown = gpus(&[held["GPU"][0].as_str(), "7"]);
        let err = pool.give_back(&one, &with_unknown).unwrap_err();
        assert_eq!(err.to_string(), "the pool has no GPU device `7`");
        assert_eq!(pool, before);
    }

    #[test]
    fn half_gpus_share_the_lowest_device() {
        let mut pool = AcceleratorPool::new(&gpus(&["0", "1"]));
        let half = res("GPU=0.5");
        let got: Vec<_> = (0..4)
            .map(|_| pool.take(&half).unwrap()["GPU"].clone())
            .collect();
        assert_eq!(got, [["0"], ["0"], ["1"], ["1"]]);
        assert_eq!(pool.take(&half), None);
        pool.give_back(&half, &gpus(&["1"])).unwrap();
        assert_eq!(pool.take(&half).unwrap()["GPU"], ["1"]);
    }

    #[test]
    fn whole_gpus_take_free_devices_only() {
        let mut pool = AcceleratorPool::new(&gpus(&["0", "1", "2"]));
        assert_eq!(pool.take(&res("GPU=0.5")).unwrap()["GPU"], ["0"]);
        assert_eq!(pool.clone().take(&res("GPU=2")).unwrap()["GPU"], ["1", "2"]);
        assert_eq!(pool.clone().take(&res("GPU=3")), None);
        assert_eq!(pool.clone().take(&res("GPU=0.5")).unwrap()["GPU"], ["0"]);
        assert_eq!(pool.clone().take(&res("GPU=0")), Some(BTreeMap::new()));
        // No layout of whole devices serves a fraction above 1.
        let one_and_a_half = Resources::new().with("GPU", "1.5".parse::<ResourceAmount>().unwrap());
        assert_eq!(pool.take(&one_and_a_half), None);
    }

    #[test]
    fn a_refused_take_hands_out_nothing() {
        let ids = BTreeMap::from([
            ("GPU".to_owned(), vec!["0".to_owned()]),
            ("neuron_cores".to_owned(), vec!["0".to_owned()]),
        ]);
        let mut pool = AcceleratorPool::new(&ids);
        let before = pool.clone();
        assert_eq!(pool.take(&res("GPU=1,neuron_cores=2")), None);
        assert_eq!(pool, before);
    }

    #[test]
    fn a_holder_pool_serves_its_own_share() {
        let mut bundle = AcceleratorPool::for_holder(&res("GPU=0.5"), &gpus(&["3"]));
        assert_eq!(bundle.take(&res("GPU=0.5")).unwrap()["GPU"], ["3"]);
        assert_eq!(bundle.take(&res("GPU=0.5")), None);
        let mut bundle = AcceleratorPool::for_holder(&res("GPU=2"), &gpus(&["0", "1"]));
        assert_eq!(bundle.take(&res("GPU=1")).unwrap()["GPU"], ["0"]);
        assert_eq!(bundle.take(&res("GPU=1")).unwrap()["GPU"], ["1"]);
    }
}
