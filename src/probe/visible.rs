//! Which NVML device is this process's `cuda:N`. NVML numbers every GPU of the host in PCI
//! bus-id order; CUDA numbers only the devices `CUDA_VISIBLE_DEVICES` lists, in the order it
//! lists them. An entry is an index (into the host's devices in PCI bus-id order, which is CUDA's
//! order under `CUDA_DEVICE_ORDER=PCI_BUS_ID` and on hosts whose GPUs are all one model) or a
//! `GPU-…` UUID (or a unique prefix of one). As in CUDA, the list ends at the first entry that
//! names no device (a `MIG-…` instance is not mapped to its parent here), and an empty value
//! hides every device.

/// What NVML says about one device, as far as matching needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceId {
    pub nvml_index: u32,
    /// `GPU-8932f937-d72c-4106-c12f-20bd9faed9f6`
    pub uuid: String,
    /// `00000000:65:00.0` (NVML) or `0000:65:00.0` (CUDA runtime): both parse the same.
    pub pci_bus_id: String,
}

/// (domain, bus, device, function) of a PCI bus id, or None when it is not one.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let s = s.trim();
    let (domain, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |x: &str| u32::from_str_radix(x, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

/// The NVML index of `cuda:0`, `cuda:1`, … given the value of `CUDA_VISIBLE_DEVICES` (None when
/// it is unset) and the host's devices.
pub fn cuda_to_nvml(visible: Option<&str>, devices: &[DeviceId]) -> Vec<u32> {
    let mut by_bus: Vec<&DeviceId> = devices.iter().collect();
    // Unparsable bus ids keep NVML's own order, after the others.
    by_bus.sort_by_key(|d| {
        (
            parse_bus_id(&d.pci_bus_id).is_none(),
            parse_bus_id(&d.pci_bus_id),
            d.nvml_index,
        )
    });
    let Some(visible) = visible else {
        return by_bus.iter().map(|d| d.nvml_index).collect();
    };
    let mut out: Vec<u32> = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        let found = if entry.bytes().all(|b| b.is_ascii_digit()) && !entry.is_empty() {
            entry
                .parse::<usize>()
                .ok()
                .and_then(|i| by_bus.get(i))
                .map(|d| d.nvml_index)
        } else {
            by_uuid(entry, devices)
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// The one device whose UUID starts with `entry` (`GPU-…`; case does not matter).
fn by_uuid(entry: &str, devices: &[DeviceId]) -> Option<u32> {
    let entry = entry.to_ascii_lowercase();
    let want = entry.strip_prefix("gpu-").filter(|w| !w.is_empty())?;
    let mut hits = devices.iter().filter(|d| {
        let uuid = d.uuid.to_ascii_lowercase();
        uuid.strip_prefix("gpu-").unwrap_or(&uuid).starts_with(want)
    });
    match (hits.next(), hits.next()) {
        (Some(d), None) => Some(d.nvml_index),
        _ => None,
    }
}

/// The inverse: for each NVML index, the `cuda:N` it is in this process, if it is visible.
pub fn nvml_to_cuda(cuda_to_nvml: &[u32], nvml_count: usize) -> Vec<Option<u32>> {
    let mut out = vec![None; nvml_count];
    for (cuda, &nvml) in cuda_to_nvml.iter().enumerate() {
        if let Some(slot) = out.get_mut(nvml as usize) {
            *slot = Some(cuda as u32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four GPUs whose NVML order is not their bus order (as a broken driver could report).
    fn host() -> Vec<DeviceId> {
        let d = |i: u32, uuid: &str, bus: &str| DeviceId {
            nvml_index: i,
            uuid: uuid.into(),
            pci_bus_id: bus.into(),
        };
        vec![
            d(0, "GPU-aaaa1111-0000", "00000000:18:00.0"),
            d(1, "GPU-bbbb2222-0000", "00000000:2A:00.0"),
            d(2, "GPU-cccc3333-0000", "00000000:9A:00.0"),
            d(3, "GPU-cccc4444-0000", "00000000:3A:00.0"),
        ]
    }

    #[test]
    fn unset_means_every_device_in_bus_order() {
        assert_eq!(cuda_to_nvml(None, &host()), vec![0, 1, 3, 2]);
    }

    #[test]
    fn indices_count_in_bus_order() {
        assert_eq!(cuda_to_nvml(Some("2,0"), &host()), vec![3, 0]);
        assert_eq!(cuda_to_nvml(Some(" 3 , 1 "), &host()), vec![2, 1]);
    }

    #[test]
    fn uuids_and_unique_prefixes_match() {
        assert_eq!(cuda_to_nvml(Some("GPU-cccc4444-0000"), &host()), vec![3]);
        assert_eq!(
            cuda_to_nvml(Some("GPU-bbbb,gpu-AAAA1111"), &host()),
            vec![1, 0]
        );
        // "GPU-cccc" is the prefix of two UUIDs: CUDA stops there.
        assert_eq!(cuda_to_nvml(Some("1,GPU-cccc,0"), &host()), vec![1]);
    }

    #[test]
    fn the_list_ends_at_the_first_entry_that_names_no_device() {
        assert_eq!(cuda_to_nvml(Some(""), &host()), Vec::<u32>::new());
        assert_eq!(cuda_to_nvml(Some("0,7,1"), &host()), vec![0]);
        assert_eq!(cuda_to_nvml(Some("1,-1,2"), &host()), vec![1]);
        assert_eq!(cuda_to_nvml(Some("1,1"), &host()), vec![1]);
        assert_eq!(
            cuda_to_nvml(Some("MIG-0a1b2c3d,0"), &host()),
            Vec::<u32>::new()
        );
        assert_eq!(cuda_to_nvml(Some("aaaa1111"), &host()), Vec::<u32>::new());
        assert_eq!(cuda_to_nvml(Some("GPU-"), &host()), Vec::<u32>::new());
    }

    #[test]
    fn bus_ids_from_nvml_and_cuda_parse_alike() {
        assert_eq!(parse_bus_id("00000000:9A:00.0"), Some((0, 0x9a, 0, 0)));
        assert_eq!(
            parse_bus_id("0000:9a:00.0"),
            parse_bus_id("00000000:9A:00.0")
        );
        assert_eq!(parse_bus_id("garbage"), None);
    }

    #[test]
    fn the_inverse_marks_hidden_devices() {
        let c = cuda_to_nvml(Some("2,0"), &host());
        assert_eq!(nvml_to_cuda(&c, 4), vec![Some(1), None, None, Some(0)]);
    }
}
