//! What is left on the nodes during a layout search, down to single accelerator devices.
//!
//! Accelerators are per device: a node has `floor(total)` devices of capacity 1 for each
//! accelerator resource ([`ACCELERATOR_RESOURCES`](crate::ACCELERATOR_RESOURCES)). An amount
//! below 1 must fit in what one device has left; an amount of 1 or more must be a whole
//! number and takes that many wholly free devices (Ray's rules, and those of
//! [`AcceleratorPool`](super::AcceleratorPool)).

use trainyard_resources::STEPS_PER_UNIT;

/// One whole device, in steps.
pub(super) const DEVICE: u128 = STEPS_PER_UNIT;

/// The devices one bundle takes on its node: per accelerator slot (see `Problem`), the
/// indices of its devices, in the order of the bundle's accelerator entries.
pub(super) type Picks = Vec<(usize, Vec<usize>)>;

/// What is left during a search: a capacity row per node (every resource some bundle asks
/// for) and, per node and accelerator slot, what each device has left, in device order.
#[derive(Debug, Clone)]
pub(super) struct Room {
    pub(super) cap: Vec<u128>,
    /// `dev[node * slots + slot]`.
    pub(super) dev: Vec<Vec<u128>>,
}

/// What a holder of `amount` takes from each of its devices.
pub(super) fn share(amount: u128) -> u128 {
    amount.min(DEVICE)
}

/// How many whole devices `amount` takes, when it is a whole number of at least one.
fn whole(amount: u128) -> Option<usize> {
    if amount < DEVICE || amount % DEVICE != 0 {
        return None;
    }
    usize::try_from(amount / DEVICE).ok()
}

/// Whether an amount can ever be served by devices: below 1, or a whole number.
pub(super) fn servable(amount: u128) -> bool {
    amount < DEVICE || whole(amount).is_some()
}

/// How many devices of `list` are wholly free.
pub(super) fn free(list: &[u128]) -> usize {
    list.iter().filter(|&&left| left >= DEVICE).count()
}

/// The most any device of `list` has left.
pub(super) fn most_left(list: &[u128]) -> u128 {
    list.iter().copied().max().unwrap_or(0)
}

/// Whether the devices `list` can serve a nonzero `amount`.
pub(super) fn device_fit(list: &[u128], amount: u128) -> bool {
    if amount < DEVICE {
        list.iter().any(|&left| left >= amount)
    } else {
        whole(amount).is_some_and(|k| free(list) >= k)
    }
}

/// The devices of `list` that serve `amount` best: the device with the least left that is
/// enough for a fraction (lowest index on ties), the first wholly free ones otherwise.
pub(super) fn pick(list: &[u128], amount: u128) -> Option<Vec<usize>> {
    if amount < DEVICE {
        return list
            .iter()
            .enumerate()
            .filter(|&(_, &left)| left >= amount)
            .min_by_key(|&(i, &left)| (left, i))
            .map(|(i, _)| vec![i]);
    }
    let k = whole(amount)?;
    let chosen: Vec<usize> = (0..list.len())
        .filter(|&i| list[i] >= DEVICE)
        .take(k)
        .collect();
    (chosen.len() == k).then_some(chosen)
}

/// Every way `list` can serve `amount` that leaves a different set of devices: one device
/// per distinct amount left for a fraction, the first free ones for a whole amount.
pub(super) fn choices(list: &[u128], amount: u128) -> Vec<Vec<usize>> {
    if amount >= DEVICE {
        return pick(list, amount).into_iter().collect();
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (i, &left) in list.iter().enumerate() {
        if left >= amount && !seen.contains(&left) {
            seen.push(left);
            out.push(vec![i]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_takes_the_tightest_device_and_a_whole_amount_free_ones() {
        let list = [DEVICE, 4_000, 6_000];
        assert_eq!(pick(&list, 4_000), Some(vec![1]));
        assert_eq!(pick(&list, 5_000), Some(vec![2]));
        assert_eq!(pick(&list, DEVICE), Some(vec![0]));
        assert_eq!(pick(&list, 2 * DEVICE), None);
        assert_eq!(pick(&list, 15_000), None);
        assert_eq!(choices(&[DEVICE, DEVICE, 6_000], 5_000), [vec![0], vec![2]]);
    }
}
